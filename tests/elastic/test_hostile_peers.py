"""Hostile and confused peers of a running elastic job: strangers (no secret, a wrong one, a
replayed handshake) are refused by the coordinator, the PSs and the workers of a job launched with dl2-run,
which trains on to the reference model; the daemon's hot-scaling path works with the job's secret and is
refused without; and what an authenticated member may not do (NaN gradients, progress that cannot be true,
resizing or stopping the job, registering an address it does not serve) is refused while the job goes on."""
from __future__ import annotations

import json
import logging
import math
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from testkit.elastic import assert_matches_reference, full_loss, long_cfg

from dl2d.elastic import control, guards
from dl2d.elastic import protocol as P
from dl2d.elastic.auth import AuthError, Credentials, answer, derive_keys, read_challenge
from dl2d.elastic.checkpoint import load_checkpoint
from dl2d.elastic.model import TrainConfig, init_params, reference_train
from dl2d.elastic.progress import ProgressReporter
from dl2d.elastic.ps import ParameterServer

ARGS = ["--local", "--quiet", "--model-size", "2k", "--samples", "2048", "--global-batch", "16",
        "--progress-interval", "0.05"]
WRONG = "w" * 64


def launch(ckdir, *extra):
    return subprocess.Popen([sys.executable, "-m", "dl2d.elastic.launcher", *ARGS, "--checkpoint-dir", str(ckdir),
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def progress(ckdir) -> dict:
    for _ in range(50):
        try:
            return json.loads((ckdir / "progress.json").read_text())
        except (OSError, ValueError):
            time.sleep(0.01)
    raise AssertionError("no progress file")


def wait_step(ckdir, step, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            p = progress(ckdir)
            if p["step"] >= step and p["state"] == "running":
                return p
        except (AssertionError, KeyError):
            pass
        time.sleep(0.02)
    raise TimeoutError


def wait(pred, timeout=20):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def stranger_calls(target: str, op: str, creds, arrays=None, **fields):
    """A stranger's request: refused at the handshake (AuthError, or the connection reset under a request it
    sent unasked), not by a closed port."""
    c = P.Client(target, timeout=10, auth=creds)
    try:
        with pytest.raises(ConnectionError) as e:
            c.call(op, arrays, **fields)
        assert not isinstance(e.value, ConnectionRefusedError), f"{target} is not listening"
    finally:
        c.close()


# -- a launched job and strangers ------------------------------------------------------------------------------
def test_strangers_cannot_touch_a_running_job_which_trains_on_and_the_daemon_still_scales_it(tmp_path):
    p = launch(tmp_path, "--workers", "2", "--ps", "2", "--epochs", "16")
    try:
        wait_step(tmp_path, 5)
        addr = control.read_coordinator_file(str(tmp_path))
        secret = control.read_job_secret(str(tmp_path))
        assert (tmp_path / "job.secret").stat().st_mode & 0o777 == 0o600
        # the daemon's path (backend._default_scaler): refused without the secret, hot with it
        with pytest.raises(AuthError):
            control.scale(addr, workers=1, ps=3, method="hot", timeout=60)
        assert not control.supports_hot_scaling(addr)
        res = control.scale(addr, workers=1, ps=3, method="hot", timeout=60, secret=secret)
        assert res["method"] == "hot" and sorted(r["kind"] for r in res["records"]) == ["add_ps", "remove_worker"]
        st = control.status(addr, secret=secret)
        ps_addrs, w_addrs = list(st["ps"].values()), list(st["workers"].values())
        total = st["total_steps"]
        nan = {"0": np.full(40, np.nan, np.float32)}
        attacks = [  # each what the issue did, to each listening role
            (ps_addrs[0], "PUSH", nan, dict(worker=0, count=16, step=st["version"], blocks=[0])),
            (ps_addrs[1], "PUT_BLOCKS", {"p0": nan["0"], "m0": nan["0"]}, dict(blocks=[0], version=10 ** 9)),
            (addr, "PROGRESS", None, dict(worker=0, version=31_250_000 * 128, samples=16, loss=0.1)),
            (addr, "INC_WORKER", None, dict(addr="127.0.0.1:1")),
            (addr, "SCALE", None, dict(workers=10 ** 6, ps=1, method="hot", timeout=1)),
            (addr, "SHUTDOWN", None, {}),
            (w_addrs[0], "EXIT", None, {}),
        ]
        wrong = Credentials.from_secret(WRONG)
        for creds in (None, wrong, wrong.as_role("member")):
            for target, op, arrays, fields in attacks:
                stranger_calls(target, op, creds, arrays, **fields)
        # a recorded handshake (the launcher's key) replayed on a new connection, then SHUTDOWN
        control_creds = Credentials.from_secret(secret)
        with socket.create_connection(P.parse_addr(addr), timeout=10) as s:
            sn = read_challenge(P.recv_handshake(s, time.monotonic() + 10))
            recorded = b"".join(bytes(b) for b in P.encode(answer(control_creds, sn, b"\7" * 32)))
            s.sendall(recorded)
            assert P.recv_handshake(s, time.monotonic() + 10)["ok"] is True
        with socket.create_connection(P.parse_addr(addr), timeout=10) as s:
            P.recv_handshake(s, time.monotonic() + 10)
            s.sendall(recorded + b"".join(bytes(b) for b in P.encode({"op": "SHUTDOWN"})))
            assert P.recv_handshake(s, time.monotonic() + 10)["ok"] is False
        assert progress(tmp_path)["step"] <= total  # never the stranger's epoch
        st = control.status(addr, secret=secret)  # the attacks hit a running job, which trains on
        assert st["state"] == "running" and st["version"] < total and not st["errors"], st
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert "refused the connection from 127.0.0.1:" in out and "Traceback" not in out, out
    meta, _, _ = load_checkpoint(str(tmp_path))
    cfg = TrainConfig.from_dict(meta["config"])
    final = np.load(tmp_path / "model.npz")["params"]
    assert np.isfinite(final).all()
    np.testing.assert_allclose(final, reference_train(cfg, 0, cfg.total_steps)[0], rtol=2e-4, atol=2e-5)
    prog = progress(tmp_path)
    assert prog["state"] == "done" and prog["step"] == cfg.total_steps == total and prog["ps"] == 3


def test_shutdown_is_the_daemons_and_stops_the_job_without_leaving_dl2_run_hanging(tmp_path):
    p = launch(tmp_path, "--workers", "1", "--ps", "1", "--epochs", "200")
    try:
        wait_step(tmp_path, 5)
        addr = control.read_coordinator_file(str(tmp_path))
        secret = control.read_job_secret(str(tmp_path))
        stranger_calls(addr, "SHUTDOWN", None)
        member = P.Client(addr, timeout=10, auth=Credentials.member(derive_keys(secret)["member"]))
        with pytest.raises(P.RemoteError, match="PermissionError: SHUTDOWN is not for a peer authenticated as member"):
            member.call("SHUTDOWN")
        member.close()
        assert p.poll() is None
        t0 = time.monotonic()
        control.shutdown(addr, secret=secret)
        out, _ = p.communicate(timeout=30)  # the old coordinator closed and left dl2-run waiting forever
        assert p.returncode == 1 and time.monotonic() - t0 < 20, out
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert "shut down by a SHUTDOWN from 127.0.0.1:" in out and "Traceback" not in out, out
    assert progress(tmp_path)["state"] == "failed"


# -- authenticated members that misbehave ----------------------------------------------------------------------
def test_a_push_of_non_finite_or_misshapen_gradients_changes_nothing():
    key = bytes(range(32))
    ps = ParameterServer("127.0.0.1:1", key)
    ps.server.start()
    ps.cfg = TrainConfig(sync=False)
    ps.blocks = {0: (np.ones(4, np.float32), np.zeros(4, np.float32)),
                 1: (np.ones(3, np.float32), np.zeros(3, np.float32))}
    c = P.Client(ps.address, auth=Credentials.member(key))
    good = {"0": np.ones(4, np.float32), "1": np.ones(3, np.float32)}
    try:
        for arrays, why in [({**good, "1": np.array([1, np.inf, 1], np.float32)}, "non-finite gradient values in block 1"),
                            ({**good, "0": np.full(4, np.nan, np.float32)}, "non-finite gradient values in block 0"),
                            ({**good, "1": np.ones(1, np.float32)}, r"gradient of block 1 has shape \(1,\)"),
                            ({"0": good["0"]}, "no gradient for block 1")]:
            with pytest.raises(P.RemoteError, match=why):
                c.call("PUSH", arrays, worker=0, count=1, step=-1, blocks=[0, 1])
            assert ps.version == 0 and all((p == 1).all() and (m == 0).all() for p, m in ps.blocks.values())
        assert c.call("PUSH", good, worker=0, count=1, step=-1, blocks=[0, 1])[0]["version"] == 1  # a good one
    finally:
        c.close()
        ps.stop()


def test_a_members_nan_push_to_a_training_job_is_refused_and_it_trains_on(make_cluster, caplog):
    """Asynchronous mode applies a push at once: the issue's one PUSH of NaN made every parameter NaN."""
    caplog.set_level(logging.WARNING, logger="dl2d.elastic.ps")
    cfg = long_cfg(sync=False, epochs=4, lr=0.02)
    c = make_cluster(cfg, 1, 1)
    wait(lambda: c.coord.version >= 5)
    m = P.Client(next(iter(c.coord.ps.values())), auth=Credentials.member(c.coord.member_key))
    h, a = m.call("PULL")
    with pytest.raises(P.RemoteError, match="non-finite gradient values"):
        m.call("PUSH", {str(b): np.full_like(a[str(b)], np.nan) for b in h["blocks"]}, worker=0, count=1,
               step=-1, blocks=h["blocks"])
    m.close()
    assert c.wait(60) == "done", c.coord.errors
    assert np.isfinite(c.coord.final_params).all()
    assert full_loss(cfg, c.coord.final_params) < 0.5 * full_loss(cfg, init_params(cfg))
    line = next(r for r in caplog.records if "refused a push" in r.getMessage())
    assert line.exc_info is None and "\n" not in line.getMessage()


def test_progress_that_cannot_be_true_is_refused_and_never_reaches_the_progress_file(make_cluster, tmp_path):
    cfg = long_cfg(epochs=4)
    path = tmp_path / "progress.json"
    c = make_cluster(cfg, 1, 1, progress=ProgressReporter(path=str(path), interval=0))
    wait(lambda: c.coord.version >= 5)
    m = P.Client(c.coord.address, auth=Credentials.member(c.coord.member_key))
    spe, total = cfg.steps_per_epoch, cfg.total_steps
    for fields, why in [
        (dict(version=31_250_000 * spe, samples=16), "beyond the job's last step"),
        (dict(version=total + 10, samples=16), "beyond the job's last step"),
        (dict(version=0, samples=16), "goes backwards"),
        (dict(version=float("nan"), samples=16), "version must be an integer"),
        (dict(version=True, samples=16), "version must be an integer"),
        (dict(version=total, samples=float("inf")), "samples must be a finite number"),
        (dict(version=total, samples=1e12), "samples must be a finite number"),
        (dict(version=total, samples=16, loss="low"), "loss must be a number"),
        (dict(version=total, samples=16, step_time=-1), "step_time must be"),
    ]:
        with pytest.raises(P.RemoteError, match=why):
            m.call("PROGRESS", worker=0, **fields)
        assert c.coord.version <= total and json.loads(path.read_text())["step"] <= total
    with pytest.raises(P.RemoteError, match="outside the job's steps"):
        m.call("DONE", worker=0, version=10 ** 9)
    m.close()
    stranger_calls(c.coord.address, "PROGRESS", None, worker=0, version=total - 1, samples=16)
    assert c.wait(60) == "done", c.coord.errors
    assert_matches_reference(cfg, c.coord.final_params)
    final = json.loads(path.read_text())
    assert final["state"] == "done" and final["step"] == total and final["epoch"] == cfg.epochs


def test_check_progress_bounds_the_jump_by_the_time_elapsed():
    kw = dict(version=100, total_steps=10_000, workers=2, max_samples=64.0)
    rate = guards.MAX_VERSIONS_PER_S_PER_WORKER * 2
    assert guards.check_progress({"version": 103, "samples": 16}, elapsed_s=0.0, **kw) == (103, 16.0, None)
    with pytest.raises(ValueError, match="version jumps by 900 in 0.010 s"):
        guards.check_progress({"version": 1000, "samples": 16}, elapsed_s=0.01, **kw)
    assert guards.check_progress({"version": 1000, "samples": 16}, elapsed_s=900 / rate, **kw)[0] == 1000
    # a diverged model's loss is no number for the report; the step still counts
    assert guards.check_progress({"version": 101, "samples": 16, "loss": math.nan}, elapsed_s=1, **kw) == \
        (101, 16.0, None)
    assert guards.check_progress({"version": 101, "samples": 16, "loss": 0.5}, elapsed_s=1, **kw)[2] == 0.5


def test_only_the_daemon_and_the_launcher_resize_checkpoint_or_stop_a_job(make_cluster):
    cfg = long_cfg(epochs=4)
    c = make_cluster(cfg, 1, 1)
    wait(lambda: c.coord.version >= 5)
    m = P.Client(c.coord.address, auth=Credentials.member(c.coord.member_key))
    for op, fields in [("SCALE", dict(workers=2, ps=1)), ("CHECKPOINT", dict(exit=True)), ("SHUTDOWN", {}),
                       ("DEC_WORKER", dict(worker=0)), ("DEC_SERVER", dict(ps=0))]:
        with pytest.raises(P.RemoteError, match=f"PermissionError: {op} is not for a peer authenticated as member"):
            m.call(op, **fields)
    assert m.call("STATUS")[0]["state"] in ("running", "scaling")
    m.close()
    daemon = P.Client(c.coord.address, auth=Credentials.from_secret(c.coord.secret))
    for op, fields in [("PROGRESS", dict(worker=0, version=6, samples=16)), ("INC_WORKER", dict(addr="a:1")),
                       ("DONE", dict(worker=0, version=1))]:
        with pytest.raises(P.RemoteError, match=f"PermissionError: {op} is not for a peer authenticated as control"):
            daemon.call(op, **fields)
    daemon.close()
    assert c.wait(60) == "done", c.coord.errors
    assert c.coord.errors == []
    assert_matches_reference(cfg, c.coord.final_params)


def test_scale_above_the_jobs_bound_is_refused_and_the_job_trains_on(make_cluster):
    cfg = long_cfg(epochs=4)
    c = make_cluster(cfg, 1, 1, max_workers=2, max_ps=2)
    wait(lambda: c.coord.version >= 5)
    daemon = P.Client(c.coord.address, auth=Credentials.from_secret(c.coord.secret))
    for fields, why in [(dict(workers=3, ps=1), r"workers must be 1..2 \(this job's bound\), got 3"),
                        (dict(workers=10 ** 6, ps=1), "workers must be 1..2"),
                        (dict(workers=1, ps=3), "ps must be 1..2"),
                        (dict(workers=0, ps=1), "workers must be 1..2"),
                        (dict(workers="2", ps=1), "workers must be an integer"),
                        (dict(workers=2, ps=2, method="rm -rf"), "method must be one of"),
                        (dict(workers=2, ps=2, timeout=float("inf")), "timeout must be a finite number")]:
        with pytest.raises(P.RemoteError, match=f"ValueError: {why}"):
            daemon.call("SCALE", **fields)
    with pytest.raises(ValueError, match="workers must be 1..2"):
        c.coord.scale(3, 1)
    assert c.coord.records == [] and c.coord.state == "running"
    h, _ = daemon.call("SCALE", workers=2, ps=2, timeout=60)  # within the bound: done, hot
    assert h["method"] == "hot" and len(c.coord.workers) == 2
    daemon.close()
    m = P.Client(c.coord.address, auth=Credentials.member(c.coord.member_key))
    with pytest.raises(P.RemoteError, match="the job has its most workers"):  # nor by registering more
        m.call("INC_WORKER", addr="127.0.0.1:1")
    m.close()
    assert c.wait(60) == "done", c.coord.errors
    assert_matches_reference(cfg, c.coord.final_params)
    assert guards.DEFAULT_MAX_ROLES == 64 and make_cluster(cfg, 1, 1).coord.max_ps == len(cfg.blocks())


def test_a_role_registering_an_address_it_does_not_serve_is_left_out_and_the_job_goes_on(make_cluster):
    cfg = long_cfg(epochs=4)
    c = make_cluster(cfg, 1, 1)
    wait(lambda: c.coord.version >= 5)
    m = P.Client(c.coord.address, auth=Credentials.member(c.coord.member_key))
    for bad in ("nonsense", "host:0", "host:99999", " :1", ["127.0.0.1", 1], None):
        with pytest.raises(P.RemoteError, match="addr must be"):
            m.call("INC_WORKER", addr=bad)
    m.call("INC_WORKER", addr="127.0.0.1:1")  # nothing listens there
    m.close()
    assert c.wait(60) == "done", c.coord.errors
    assert any("new role at 127.0.0.1:1 did not answer" in e for e in c.coord.errors), c.coord.errors
    assert len(c.coord.workers) == 1
    assert_matches_reference(cfg, c.coord.final_params)
