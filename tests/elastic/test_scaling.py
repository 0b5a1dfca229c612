"""Hot scaling on an in-process cluster over real loopback TCP."""
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from testkit.elastic import assert_matches_reference, full_loss, long_cfg

from dl2d.elastic.cluster import LocalCluster


def _wait_progress(c, steps=5):
    deadline = time.monotonic() + 20
    while c.coord.version < steps and time.monotonic() < deadline:
        time.sleep(0.01)


def test_add_remove_ps_and_workers_sync_equals_reference(make_cluster):
    cfg = long_cfg()
    c = make_cluster(cfg, 1, 2)
    _wait_progress(c)
    res = c.coord.scale(2, 3)  # add two PSs one by one
    assert res["method"] == "hot" and [r["kind"] for r in res["records"]] == ["add_ps", "add_ps"]
    for r in res["records"]:
        assert r["moved_blocks"] > 0 and r["clock"] >= r["version_at_prepare"]
        assert len(r["suspension_s"]) == 2 and all(0 <= s < 5 for s in r["suspension_s"])
    v1 = c.coord.version
    res = c.coord.scale(3, 3)
    assert [r["kind"] for r in res["records"]] == ["add_worker"]
    res = c.coord.scale(1, 1)
    kinds = [r["kind"] for r in res["records"]]
    assert kinds.count("remove_ps") == 2 and kinds.count("remove_worker") == 2
    assert c.wait(60) == "done", c.coord.errors
    assert c.coord.errors == []
    assert v1 < cfg.total_steps  # scaling really happened mid-training
    assert_matches_reference(cfg, c.coord.final_params)
    # membership at the end
    assert len(c.coord.ps) == 1 and len(c.coord.workers) == 1


def test_block_distribution_after_add_is_balanced(make_cluster):
    cfg = long_cfg()
    c = make_cluster(cfg, 1, 1)
    _wait_progress(c)
    c.coord.scale(1, 4)
    sizes = c.coord.sizes
    loads = {}
    for b, p in c.coord.assignment.items():
        loads[p] = loads.get(p, 0) + sizes[b]
    assert len(loads) == 4 and max(loads.values()) - min(loads.values()) <= 2 * max(sizes)
    assert c.wait(60) == "done"
    assert_matches_reference(cfg, c.coord.final_params)


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=3),
       st.integers(1, 2), st.integers(1, 2))
def test_random_scaling_sequences_equal_reference(seq, w0, p0):
    cfg = long_cfg(epochs=1, n_samples=1024)
    c = LocalCluster(cfg, p0, w0).start()
    try:
        _wait_progress(c, 2)
        for w, p in seq:
            if c.coord.finished.is_set():
                break
            try:
                c.coord.scale(w, p)
            except RuntimeError as e:
                # a short job may end while a request waits (e.g. for a PS to register)
                if "finished during scaling" not in str(e) or c.coord.exit_reason != "done":
                    raise
                break
        assert c.wait(60) == "done", c.coord.errors
        assert c.coord.errors == []
        assert_matches_reference(cfg, c.coord.final_params)
    finally:
        c.close()


def test_async_training_with_scaling_keeps_all_parameters(make_cluster):
    cfg = long_cfg(sync=False, epochs=2, lr=0.02)
    c = make_cluster(cfg, 2, 2)
    _wait_progress(c, 10)
    c.coord.scale(3, 3)
    c.coord.scale(1, 2)
    assert c.wait(60) == "done", c.coord.errors
    p = c.coord.final_params
    assert np.isfinite(p).all()  # _collect raises if a block was lost or duplicated
    from dl2d.elastic.model import init_params
    assert full_loss(cfg, p) < 0.5 * full_loss(cfg, init_params(cfg))
    assert all(r["method"] == "hot" for r in c.coord.records)


def test_cancelled_clock_releases_a_worker_already_suspended_at_it(make_cluster):
    """Regression: worker 0 accepts PREPARE(c) and suspends at c; worker 1 has already
    started step c and answers late.  The CANCEL must release worker 0 (it used to stay
    parked, step c never completed and the retried clock was never reached: a hang)."""
    cfg = long_cfg(epochs=4)  # long enough (512 steps) not to end before the pause
    c = make_cluster(cfg, 1, 2)
    _wait_progress(c, 2)
    coord = c.coord
    coord.pause_stall_timeout = 5.0
    w1 = next(w for w in c.spawner.workers if w.worker_id == 1)
    orig = w1.server.handler
    seen = []

    def handler(h, a):
        if h["op"] == "PREPARE" and not seen:
            clock = int(h["clock"])
            # hold worker 1's PREPARE until worker 0 suspended at the clock and worker 1
            # started computing step `clock` (so that it really is late)
            deadline = time.monotonic() + 10
            while not (0 in coord.suspended and w1.passed >= clock) and time.monotonic() < deadline:
                time.sleep(0.002)
            seen.append((clock, 0 in coord.suspended and w1.passed >= clock))
        return orig(h, a)
    w1.server.handler = handler
    rec = coord.scale(2, 2, timeout=30)["records"][0]
    assert seen and seen[0][1], "scenario not set up"
    assert rec.get("retries", 0) >= 1 and rec["clock"] > seen[0][0]
    assert c.wait(60) == "done", coord.errors
    assert coord.errors == []
    assert_matches_reference(cfg, coord.final_params)


def test_pause_that_cannot_complete_fails_with_an_error(make_cluster):
    """A worker that never suspends at the clock: the reconfiguration fails (bounded wait)
    with the reason in ``errors`` instead of waiting forever."""
    cfg = long_cfg(epochs=4)  # long enough (512 steps) not to end before the pause
    c = make_cluster(cfg, 1, 2)
    _wait_progress(c, 2)
    c.coord.pause_stall_timeout = 1.0
    w1 = next(w for w in c.spawner.workers if w.worker_id == 1)
    orig = w1.server.handler
    w1.server.handler = lambda h, a: {"late": False, "version": 0} if h["op"] == "PREPARE" else orig(h, a)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="finished during scaling"):
        c.coord.scale(2, 2, timeout=30)
    assert time.monotonic() - t0 < 15
    assert c.coord.state == "failed"
    assert any("did not suspend" in e and "[1]" in e for e in c.coord.errors), c.coord.errors
