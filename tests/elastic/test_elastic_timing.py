"""Scaling-time instrumentation (bench/bench_elastic.py reads it) and the role process environment."""
import time

from testkit.elastic import long_cfg

from dl2d.elastic.cluster import BLAS_THREAD_VARS, ProcessSpawner, role_env


def _wait(pred, timeout=20):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_hot_record_has_four_steps_and_step_gap(make_cluster):
    c = make_cluster(long_cfg(epochs=4), 1, 2)
    _wait(lambda: c.coord.version >= 5)
    rec = c.coord.scale(2, 2)["records"][0]
    _wait(lambda: rec.get("step_gap_s") is not None)  # filled by the first step after resume
    for k in ("t_step1_registration", "t_step2_assignment", "t_step3_migration", "t_step4_worker_update"):
        assert 0 <= rec[k] < 5, k
    # the gap between the last step before and the first step after covers the worker suspension
    assert rec["step_gap_s"] >= min(rec["suspension_s"]) > 0


def test_restart_from_checkpoint_records_gap_and_breakdown(tmp_path, make_cluster):
    cfg = long_cfg(epochs=4)
    c = make_cluster(cfg, 1, 2, checkpoint_dir=str(tmp_path))
    _wait(lambda: c.coord.version >= 5)
    c.coord.request("checkpoint", True)
    assert c.wait(10) == "checkpointed"
    c2 = make_cluster(cfg, 3, 2, checkpoint_dir=str(tmp_path))
    _wait(lambda: c2.coord.records and c2.coord.records[0].get("step_gap_s") is not None)
    rec = c2.coord.records[0]
    assert rec["kind"] == "restart" and rec["method"] == "checkpoint_restart"
    assert (rec["ps_before"], rec["ps_after"], rec["workers_after"]) == (1, 3, 2)
    ts = [rec[k] for k in ("t_last_step_before", "t_checkpoint_saved", "t_coordinator_init",
                           "t_roles_registered", "t_restored", "t_first_step_after")]
    assert ts == sorted(ts)
    assert abs(rec["step_gap_s"] - (ts[-1] - ts[0])) < 1e-6


def test_role_processes_get_one_blas_thread_unless_set():
    env = role_env(1, base={"OMP_NUM_THREADS": "4", "PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == "4"  # the user's choice wins
    assert env["OPENBLAS_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    assert all(v not in role_env(None, base={}) for v in BLAS_THREAD_VARS)
    assert ProcessSpawner(threads=2).threads == 2


def test_frozen_pull_sends_no_parameters():
    from dl2d.elastic import protocol as P
    from dl2d.elastic.model import TrainConfig
    from dl2d.elastic.ps import ParameterServer
    key = bytes(32)
    ps = ParameterServer("127.0.0.1:1", key)
    ps.server.start()
    ps.cfg = TrainConfig()
    ps.blocks = {0: (P.np.ones(4, P.np.float32), P.np.zeros(4, P.np.float32))}
    c = P.Client(ps.address, auth=P.Credentials.member(key))
    try:
        h, a = c.call("PULL")
        assert not h["frozen"] and list(a) == ["0"]
        c.call("FREEZE")
        h, a = c.call("PULL", min_version=5)  # frozen: answers at once, without data
        assert h["frozen"] and h["blocks"] == [] and a == {}
    finally:
        c.close()
        ps.stop()
