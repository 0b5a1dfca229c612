"""End-to-end: dl2-run --local with real role processes over loopback TCP."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from dl2d.elastic import control
from dl2d.elastic.checkpoint import load_checkpoint
from dl2d.elastic.model import TrainConfig, reference_train

ARGS = ["--local", "--quiet", "--model-size", "2k", "--samples", "2048", "--global-batch", "16",
        "--progress-interval", "0.1"]


def launch(ckdir, *extra, env=None):
    return subprocess.Popen([sys.executable, "-m", "dl2d.elastic.launcher", *ARGS, "--checkpoint-dir",
                             str(ckdir), *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def wait_step(ckdir, step, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            p = json.loads((ckdir / "progress.json").read_text())
            if p["step"] >= step and p["state"] == "running":
                return p
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise TimeoutError


def reference(ckdir):
    meta, _, _ = load_checkpoint(str(ckdir))
    cfg = TrainConfig.from_dict(meta["config"])
    return cfg, reference_train(cfg, 0, cfg.total_steps)[0]


def test_help_explains_options():
    out = subprocess.run([sys.executable, "-m", "dl2d.elastic.launcher", "--help"], capture_output=True,
                         text=True).stdout
    for word in ["--workers", "--ps", "--checkpoint-dir", "--model-size", "--local", "SIGUSR1", "srun",
                 "DL2D_PROGRESS_URL", "75"]:
        assert word in out


def test_signal_checkpoint_then_resume_with_new_size(tmp_path):
    env = dict(os.environ, DL2D_PROGRESS_URL="http://127.0.0.1:1/down")  # daemon down: must not matter
    p = launch(tmp_path, "--workers", "2", "--ps", "2", "--epochs", "4", env=env)
    prog = wait_step(tmp_path, 10)
    assert prog["workers"] == 2 and prog["ps"] == 2 and prog["job_id"] == "local"
    p.send_signal(signal.SIGUSR1)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 75, out
    meta, _, _ = load_checkpoint(str(tmp_path))
    v = meta["version"]
    assert 10 <= v < meta["config"]["epochs"] * 128
    p2 = launch(tmp_path, "--workers", "1", "--ps", "3", "--epochs", "4")
    out, _ = p2.communicate(timeout=120)
    assert p2.returncode == 0, out
    cfg, ref = reference(tmp_path)
    final = np.load(tmp_path / "model.npz")["params"]
    np.testing.assert_allclose(final, ref, rtol=2e-4, atol=2e-5)
    prog = json.loads((tmp_path / "progress.json").read_text())
    assert prog["state"] == "done" and prog["step"] == cfg.total_steps and prog["ps"] == 3


def test_hot_scaling_of_launched_job_via_control(tmp_path):
    p = launch(tmp_path, "--workers", "1", "--ps", "1", "--epochs", "6")
    try:
        wait_step(tmp_path, 5)
        addr = control.read_coordinator_file(str(tmp_path))
        secret = control.read_job_secret(str(tmp_path))
        assert control.supports_hot_scaling(addr, secret=secret)
        res = control.scale(addr, workers=2, ps=3, secret=secret)
        assert res["method"] == "hot"
        kinds = sorted(r["kind"] for r in res["records"])
        assert kinds == ["add_ps", "add_ps", "add_worker"]
        for r in res["records"]:
            assert all(s < 5 for s in r["suspension_s"])
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    finally:
        if p.poll() is None:
            p.kill()
    cfg, ref = reference(tmp_path)
    np.testing.assert_allclose(np.load(tmp_path / "model.npz")["params"], ref, rtol=2e-4, atol=2e-5)
