"""The pure planning functions: the policy's view, guardrails, targets, reward."""
from __future__ import annotations

import numpy as np

from dl2d.core.contract import Allocation
from dl2d.daemon import plan as P
from dl2d.daemon.backend import JobStatus, NodeInfo, Target
from dl2d.db.models import IntentKind
from dl2d.policy.baselines.heuristics import drf

NODES = [NodeInfo(f"n{i}", 2, 8, 48.0) for i in range(4)]


def rows(n=3):
    return [P.JobRow(id=10 + i, job_type="resnet-50", total_epochs=30.0, slots_run=i) for i in range(n)]


def test_build_view_drained_node_has_nothing_free_and_arrival_from_slots_run():
    nodes = [*NODES[:3], NodeInfo("n3", 2, 8, 48.0, usable=False, reason="stale")]
    v = P.build_view(7, list(reversed(rows())), nodes)
    assert v.job_ids.tolist() == [10, 11, 12]  # submission order whatever the input order
    assert v.arrival_slot.tolist() == [7, 6, 5]
    assert v.free[3].tolist() == [0, 0, 0] and v.capacity[3].tolist() == [2, 8, 48]
    alloc = drf(v)
    assert not any(3 in s for s in alloc.worker_servers)  # nothing lands on the drained node


def test_guard_keeps_a_valid_policy_allocation():
    v = P.build_view(0, rows(), NODES)
    g = P.guard(v, drf, drf, {}, 3)
    assert g.source == "policy" and g.reason is None and g.allocation.workers.sum() > 0


def bad(w, p, ws=None, ps=None):
    return lambda view: Allocation(np.array(w), np.array(p), ws, ps)


def test_guard_falls_back_on_nan_range_capacity_and_exceptions():
    v = P.build_view(0, rows(), NODES)
    cases = {
        "NaN": bad([np.nan, 1, 1], [1, 1, 1]),
        "outside": bad([17, 1, 1], [1, 1, 1]),
        "non-integer": bad([1.5, 1, 1], [1, 1, 1]),
        "jobs": bad([1, 1], [1, 1]),
        "over capacity": bad([8, 8, 8], [1, 1, 1]),  # 24 GPUs on an 8-GPU cluster
        "placement on a server that does not exist": bad([1, 0, 0], [0, 0, 0], ((9,), (), ()), ((), (), ())),
        "policy raised ZeroDivisionError": lambda view: 1 / 0,
    }
    for why, policy in cases.items():
        g = P.guard(v, policy, drf, {}, 3)
        assert g.source == "fallback" and why in g.reason, (why, g.reason)
        assert P.check_allocation(v, g.allocation) is None
        np.testing.assert_array_equal(g.allocation.workers, drf(v).workers)


def test_overflowing_explicit_placement_is_caught():
    v = P.build_view(0, rows(), NODES)
    three_on_n0 = bad([3, 0, 0], [0, 0, 0], ((0, 0, 0), (), ()), ((), (), ()))  # 3 GPUs on a 2-GPU node
    assert "over capacity" in P.check_allocation(v, three_on_n0(v))


def test_starvation_fallback_only_when_the_fallback_would_run_the_job():
    v = P.build_view(0, rows(), NODES)
    starve_first = lambda view: Allocation(np.array([0, 1, 1]), np.array([0, 1, 1]),  # noqa: E731
                                           ((), (0,), (1,)), ((), (0,), (1,)))
    starved = {}
    for slot in range(2):
        g = P.guard(v, starve_first, drf, starved, 3)
        assert g.source == "policy"
        starved = P.update_starved(v, g.allocation, starved)
    assert starved == {10: 2, 11: 0, 12: 0}
    g = P.guard(v, starve_first, drf, starved, 3)
    assert g.source == "fallback" and "starves job(s) 10 for 3 slots" in g.reason
    # a full cluster: the fallback cannot run job 10 either, so the policy stands
    full = [NodeInfo("n0", 2, 8, 48.0)]
    v1 = P.build_view(0, rows(), full)
    hog = lambda view: Allocation(np.array([0, 2, 0]), np.array([0, 1, 0]), ((), (0, 0), ()), ((), (0,), ()))  # noqa: E731
    fb_no_room = lambda view: hog(view)  # noqa: E731
    assert P.guard(v1, hog, fb_no_room, {10: 5}, 3).source == "policy"


def test_plan_targets_only_changes_shrinks_first_and_limits():
    v = P.build_view(0, [P.JobRow(1, "resnet-50", 30, workers=2, ps=2), P.JobRow(2, "resnet-50", 30),
                         P.JobRow(3, "vgg-16", 30, workers=1, ps=1)], NODES)
    alloc = Allocation(np.array([1, 3, 1]), np.array([1, 3, 1]),
                       ((0,), (1, 2, 3), (0,)), ((0,), (1, 2, 3), (0,)))
    planned, sizes = P.plan_targets(v, alloc, [n.name for n in NODES], {2: (2, 16)})
    assert sizes == {1: (1, 1), 2: (2, 3), 3: (1, 1)}
    assert [(t.job_id, t.kind) for t in planned] == [(1, IntentKind.RESIZE), (2, IntentKind.SUBMIT)]
    assert planned[1].target == Target(2, 3, ("n1", "n2"), ("n1", "n2", "n3"))
    assert P.target_from_json(P.target_to_json(planned[1].target)) == planned[1].target


def test_slot_reward_is_dl2_eq1():
    st = lambda j, e: JobStatus(j, "running", 1, 1, e)  # noqa: E731
    r = P.slot_reward({1: 10.0, 2: 0.0, 3: 5.0}, {1: st(1, 13.0), 2: st(2, 2.0)}, {1: 30.0, 2: 20.0, 3: 10.0})
    assert abs(r - (3 / 30 + 2 / 20)) < 1e-12
