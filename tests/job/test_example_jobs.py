"""The example jobs of docs/jobs.md as real processes: the PyTorch DDP one over gloo (ranks given by the
contract's environment, as dl2d's srun gives them), signalled to checkpoint at 2 ranks, resumed at 3, then at
1, ends with the parameters of one uninterrupted process; the JAX one runs on the real Slurm in
tests/slurm/test_allreduce_job_real.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
TORCH_EXAMPLE = REPO / "examples" / "torch_ddp.py"
ARGS = ["--steps", "240", "--global-batch", "48", "--seed", "5", "--checkpoint-every", "100", "--step-seconds", "0.01"]


def _torch_or_skip() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("PyTorch is not installed: scripts/test.sh installs its CPU build", pytrace=False)
        pytest.skip("PyTorch is not installed (scripts/test.sh installs its CPU build)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(tmp_path: Path, rank: int, world: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DL2D_", "SLURM_"))}
    env.update(DL2D_CHECKPOINT_DIR=str(tmp_path / "ckpt"), DL2D_PROGRESS_FILE=str(tmp_path / "progress.json"),
               DL2D_COORDINATOR=f"127.0.0.1:{port}", SLURM_PROCID=str(rank), SLURM_NTASKS=str(world),
               SLURM_LOCALID=str(rank))
    return env


def launch(tmp_path: Path, world: int, *extra: str) -> list[subprocess.Popen]:
    port = free_port()
    return [subprocess.Popen([sys.executable, str(TORCH_EXAMPLE), *ARGS, *extra], cwd=REPO,
                             env=env_for(tmp_path, r, world, port), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True) for r in range(world)]


def progress(tmp_path: Path) -> dict:
    try:
        return json.loads((tmp_path / "progress.json").read_text())
    except (OSError, ValueError):
        return {}


def run_until_signalled(tmp_path: Path, world: int, past: int) -> dict:
    procs = launch(tmp_path, world)
    deadline = time.monotonic() + 120
    while not (progress(tmp_path).get("world_size") == world and progress(tmp_path).get("step", 0) > past):
        assert time.monotonic() < deadline, [p.stderr.read() for p in procs if p.poll() is not None]
        time.sleep(0.02)
    for p in procs:  # as scancel --full does: every rank, at slightly different moments
        p.send_signal(signal.SIGUSR1)
    codes = [p.wait(60) for p in procs]
    assert codes == [0] * world, [p.stderr.read()[-2000:] for p in procs]
    return progress(tmp_path)


def test_the_pytorch_ddp_example_resized_by_checkpoint_restart_equals_an_uninterrupted_run(tmp_path):
    _torch_or_skip()
    ref = subprocess.run([sys.executable, str(TORCH_EXAMPLE), *ARGS, "--checkpoint-dir", str(tmp_path / "ref"),
                          "--params-out", str(tmp_path / "ref.npz")], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})
    assert ref.returncode == 0, ref.stderr[-2000:]

    first = run_until_signalled(tmp_path, 2, 10)
    assert first["state"] == "checkpointed"
    second = run_until_signalled(tmp_path, 3, first["step"])
    assert (second["state"], second["resumed_from"], second["runs"]) == ("checkpointed", first["step"], 2)
    (last,) = launch(tmp_path, 1, "--params-out", str(tmp_path / "resized.npz"))
    assert last.wait(120) == 0, last.stderr.read()[-2000:]
    done = progress(tmp_path)
    assert (done["state"], done["step"], done["runs"], done["lost_steps"]) == ("done", 240, 3, 0)
    with np.load(tmp_path / "ref.npz") as a, np.load(tmp_path / "resized.npz") as b:
        assert a.files == b.files
        for k in a.files:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_both_examples_import_without_their_framework_and_parse_their_flags():
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import jax_allreduce
        import torch_ddp
    finally:
        sys.path.pop(0)
    assert torch_ddp.parse_args(["--steps", "7"]).steps == 7
    assert jax_allreduce.parse_args(["--global-batch", "6"]).global_batch == 6
