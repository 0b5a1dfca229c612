"""Resize hysteresis: the plan keeps a job's size for min_resize_slots after a change and
grows it only for min_resize_gain of predicted speed, for every policy; a held shrink never overflows a node;
the real daemon stops a flip-flopping policy's churn."""
from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from dl2d.core.contract import Allocation
from dl2d.daemon import plan as P
from dl2d.daemon.backend import NodeInfo
from dl2d.daemon.config import ConfigError, build_config
from dl2d.daemon.hysteresis import Hysteresis, damp
from dl2d.daemon.main import build_loop
from dl2d.db.engine import session_scope
from dl2d.db.jobs import submit_job
from dl2d.db.models import Allocation as AllocRow
from dl2d.db.models import Decision
from dl2d.policy.registry import StatelessPolicy

SPEC = {"worker": {"gpus": 1, "cpus": 2, "mem_gb": 8}, "ps": {"cpus": 2, "mem_gb": 4}}


def view(slot, prev, nodes=2):
    rows = [P.job_row(i + 1, "resnet-50", 100.0, 0.0, w, p, 3, SPEC, f"j{i}") for i, (w, p) in enumerate(prev)]
    return P.build_view(slot, rows, [NodeInfo(f"n{k}", 2, 8, 48.0) for k in range(nodes)])


def alloc_of(v, sizes):
    """The allocation of `sizes`, placed least-loaded as the engine would."""
    from dl2d.core.placement import place_servers
    _, w, p, ws, ps = place_servers(v, Allocation(np.array([s[0] for s in sizes]), np.array([s[1] for s in sizes])))
    return Allocation(w, p, ws, ps)


def test_a_job_keeps_a_new_size_for_min_slots():
    h = Hysteresis(min_slots=3)
    v = view(10, [(1, 2)])
    a, held = damp(v, alloc_of(v, [(1, 1)]), {1: 8}, h)  # resized at slot 8: held until slot 11
    assert (a.workers[0], a.ps[0]) == (1, 2) and "resized 2 slot(s) ago" in held[1]
    assert P.check_allocation(v, a) is None
    a, held = damp(v, alloc_of(v, [(1, 1)]), {1: 7}, h)  # three slots on: free to change
    assert (a.workers[0], a.ps[0]) == (1, 1) and held == {}
    start = view(10, [(0, 0)])
    a, held = damp(start, alloc_of(start, [(2, 1)]), {1: 9}, h)  # starting a waiting job is never held
    assert a.workers[0] == 2 and held == {}


def test_a_held_shrink_that_no_longer_fits_is_released():
    v = view(10, [(2, 2), (0, 0)], nodes=2)  # job 1 runs on 2 of the 4 GPUs; the policy shrinks it for job 2
    policy = alloc_of(v, [(1, 1), (3, 1)])
    a, held = damp(v, policy, {1: 9}, Hysteresis(min_slots=3))
    assert (a.workers.tolist(), a.ps.tolist()) == ([1, 3], [1, 1]) and held == {}  # no room to keep 2 workers
    assert P.check_allocation(v, a) is None
    roomy = view(10, [(2, 2), (0, 0)], nodes=4)
    a, held = damp(roomy, alloc_of(roomy, [(1, 1), (3, 1)]), {1: 9}, Hysteresis(min_slots=3))
    assert (a.workers.tolist(), a.ps.tolist()) == ([2, 3], [2, 1]) and list(held) == [1]
    assert P.check_allocation(roomy, a) is None


def test_a_growth_needs_the_minimum_predicted_gain():
    v = view(10, [(1, 1)], nodes=4)
    speeds = {(1, 1): 1.0, (2, 1): 1.04, (4, 2): 2.5}
    speed = lambda j, w, p: speeds[(w, p)]  # noqa: E731
    a, held = damp(v, alloc_of(v, [(2, 1)]), {}, Hysteresis(min_gain=0.1), speed)
    assert a.workers[0] == 1 and "predicted speed-up 4.0% < min_resize_gain 10%" in held[1]
    a, held = damp(v, alloc_of(v, [(4, 2)]), {}, Hysteresis(min_gain=0.1), speed)
    assert a.workers[0] == 4 and held == {}


def test_the_config_checks_the_keys():
    with pytest.raises(ConfigError, match="guardrails.min_resize_slots: must be >= 0"):
        build_config({"guardrails": {"min_resize_slots": -1}}, {})
    with pytest.raises(ConfigError, match="guardrails.min_resize_gain: must be within"):
        build_config({"guardrails": {"min_resize_gain": 50}}, {})


def run_flip_flop(tmp_path, min_slots: int):
    cfg = build_config({"state_dir": str(tmp_path), "sim": {"cluster": "tiny", "noise": 0.0},
                        "metrics": {"enabled": False}, "guardrails": {"min_resize_slots": min_slots}}, {})
    loop = build_loop(cfg)

    def flip(v):  # Optimus's flip-flop: one or two PS on alternate slots
        k = 1 + v.slot % 2
        return alloc_of(v, [(2, k)] * len(v))

    loop.policy = StatelessPolicy(flip, "flip-flop")
    with session_scope(loop.engine) as s:
        job = submit_job(s, {"name": "j", "owner": "alice", "job_type": "resnet-50", "total_epochs": 5000.0,
                             "command": "python t.py", **SPEC}).id
    loop.run(max_slots=12)
    with session_scope(loop.engine) as s:
        sizes = [(a.workers, a.ps) for a in s.scalars(select(AllocRow).where(AllocRow.job_id == job)
                                                          .order_by(AllocRow.id))]
        flags = [d.job_flags for d in s.scalars(select(Decision).order_by(Decision.id))]
    return sizes, flags


def test_the_daemon_stops_a_flip_flop(tmp_path):
    churn, _ = run_flip_flop(tmp_path / "off", 0)
    changes = sum(a != b for a, b in zip(churn, churn[1:]))
    assert changes == 11  # every slot
    calm, flags = run_flip_flop(tmp_path / "on", 4)
    changes = [i for i, (a, b) in enumerate(zip(calm, calm[1:]), 1) if a != b]
    assert changes and all(b - a >= 4 for a, b in zip(changes, changes[1:]))  # at most one change per 4 slots
    assert len(changes) <= 3
    assert any(f and any("min_resize_slots 4" in x for x in f.get("1", [])) for f in flags)


def test_a_held_growth_stays_on_the_servers_it_runs_on():
    """The policy grows job 1 and places it afresh on node n1; held, it keeps its size on n0 where it runs (the
    daemon would carry out the same size on n1 as a move, a restart), since n0 has room for it."""
    rows = [P.job_row(1, "cifar10", 100.0, 0.0, 2, 0, 3, {"kind": "allreduce", "batch_size": 128.0}, "j0")]
    nodes = [NodeInfo(f"n{k}", 4, 48, 192.0) for k in range(2)]
    v = P.build_view(10, rows, nodes, placed={1: (("n0", "n0"), ())})
    grown = Allocation(np.array([4]), np.array([0]), ((1, 1, 1, 1),), ((),))
    a, held = damp(v, grown, {1: 9}, Hysteresis(min_slots=3))
    assert 1 in held and a.workers.tolist() == [2] and a.worker_servers == ((0, 0),)
    assert not P.moves(v, a).any()
    crowded = Allocation(np.array([4]), np.array([0]), ((1, 1, 1, 1),), ((),))
    full = P.build_view(10, rows, [NodeInfo("n0", 0, 48, 192.0), nodes[1]], placed={1: (("n0", "n0"), ())})
    a, _ = damp(full, crowded, {1: 9}, Hysteresis(min_slots=3))  # n0 has no GPU free now: where the policy put it
    assert a.worker_servers == ((1, 1),)
