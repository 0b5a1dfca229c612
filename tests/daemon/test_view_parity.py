"""The daemon's view of a cluster state is the simulator's (dl2d.daemon.plan.build_view vs dl2d.sim.engine.view_of),
so a policy decides the same in both, down to where each task goes.

What differed: the daemon's view had no servers for the running jobs (``prev_worker_servers`` None). Sizes came
out the same, but each slot the policy placed every job on an empty cluster, and the daemon carried out only the
size changes: a new job's workers went to the node a running job still held (two jobs on one node's GPUs) and a
spread job that the policy packed again stayed spread. With each job's recorded nodes (plan.known_servers) and the
policy's moves carried out (plan.moves) the two agree; the demo's JCT is the bare simulator's
(tests/daemon/test_demo_resizes.py)."""
from __future__ import annotations

import numpy as np
import pytest

from dl2d.daemon import plan as P
from dl2d.daemon.backend import NodeInfo
from dl2d.daemon.main import DemoFeeder
from dl2d.daemon.sim_backend import node_names
from dl2d.policy import registry
from dl2d.policy.registry import PolicyOptions
from dl2d.sim import allreduce
from dl2d.sim.worlds import world
from tests.testkit.sim import run_slots

FIELDS = ("type_idx", "arrival_slot", "slots_run", "epochs_done", "est_epochs", "prev_workers", "prev_ps", "free",
          "capacity", "worker_demand", "ps_demand", "est_speed", "requested_workers", "job_speed_factor")


def daemon_view(sv, feeder, nodes, known=True):
    """The daemon's view of the state the simulator's view ``sv`` shows: the demo's submissions as JobRows (DB id =
    trace index + 1), each running job's nodes as the loop records and the backend reports them."""
    specs = {int(i): feeder.submission(int(i)) for i in sv.job_ids}
    rows = [P.job_row(int(i) + 1, specs[int(i)]["job_type"], float(sv.est_epochs[k]), float(sv.epochs_done[k]),
                      int(sv.prev_workers[k]), int(sv.prev_ps[k]), int(sv.slots_run[k]), specs[int(i)])
            for k, i in enumerate(sv.job_ids)]
    names = [n.name for n in nodes]
    placed = {int(i) + 1: (tuple(names[s] for s in sv.prev_worker_servers[k]), ())
              for k, i in enumerate(sv.job_ids) if sv.prev_workers[k]}
    observed = {j: tuple(sorted(set(w))) for j, (w, _) in placed.items()}
    factor = {int(i) + 1: float(f) for i, f in zip(sv.job_ids, sv.job_speed_factor) if not np.isnan(f)}
    return P.build_view(sv.slot, rows, nodes, slot_seconds=sv.slot_seconds, speed_factor=factor,
                        placed=placed if known else None, observed=observed if known else None)


@pytest.fixture(scope="module")
def contended_run():
    """100 slots of elastic on the demo's trace (40 Philly jobs at load 3 on t4-16): jobs start, wait, shrink and
    grow, some spread over nodes."""
    cfg = world("today").sim_config()
    feeder = DemoFeeder(40, 0, world="today", slot_seconds=cfg.slot_seconds, cluster_gpus=64, load=3.0)
    _, steps = run_slots(feeder.trace, registry.build("elastic"), 100, cfg)
    nodes = [NodeInfo(n, 4, 48, 192.0) for n in node_names(cfg.cluster.num_servers)]
    return feeder, steps, nodes


@pytest.mark.parametrize("name", ["elastic", "dl2-target"])
def test_a_policy_decides_the_same_on_the_daemons_view_as_on_the_simulators(contended_run, name):
    feeder, steps, nodes = contended_run
    policy = registry.build(name, PolicyOptions(world="today"))
    compared, placed_elsewhere_blind, moved = 0, 0, 0
    for sv, _ in steps[::4]:
        if not len(sv):
            continue
        dv = daemon_view(sv, feeder, nodes)
        for f in FIELDS:
            np.testing.assert_allclose(getattr(dv, f), getattr(sv, f), err_msg=f"slot {sv.slot}: {f}")
        assert (dv.max_workers, dv.max_ps, dv.kind, dv.slot_seconds, dv.allreduce_placement) == \
            (sv.max_workers, sv.max_ps, sv.kind, sv.slot_seconds, sv.allreduce_placement)
        assert dv.prev_worker_servers == sv.prev_worker_servers and dv.prev_ps_servers == sv.prev_ps_servers
        a, b = policy(sv), policy(dv)
        assert np.array_equal(a.workers, b.workers) and np.array_equal(a.ps, b.ps), f"slot {sv.slot}"
        assert a.worker_servers == b.worker_servers, f"slot {sv.slot}"
        # what the daemon carries out as a move is what the simulator restarts a same-size job for
        same = (np.asarray(a.workers) == sv.prev_workers) & (sv.prev_workers > 0)
        sim_moved = same & allreduce.moved(sv.prev_worker_servers, a.worker_servers)
        assert np.array_equal(P.moves(dv, b), sim_moved), f"slot {sv.slot}"
        moved += int(sim_moved.sum())
        blind = policy(daemon_view(sv, feeder, nodes, known=False))
        assert np.array_equal(blind.workers, a.workers)  # the sizes never differed ...
        placed_elsewhere_blind += blind.worker_servers != a.worker_servers  # ... where the tasks go did
        compared += 1
    assert compared >= 20 and placed_elsewhere_blind > 0 and moved > 0


def _row(job_id, workers, ps=0, job_type="cifar10"):
    spec = {"kind": "allreduce", "batch_size": 128.0, "workers": 1} if job_type == "cifar10" else {}
    return P.job_row(job_id, job_type, 10.0, 0.0, workers, ps, 3, spec)


NODES = [NodeInfo(n, 4, 48, 192.0) for n in ("a", "b", "c")]


def test_a_recorded_placement_is_used_only_while_it_describes_the_job():
    rows = [_row(1, 2), _row(2, 3), _row(3, 1), _row(4, 2), _row(5, 0)]
    placed = {1: (("a", "a"), ()), 2: (("b", "b"), ()),  # 2: a worker short of its size (resized since)
              3: (("z",), ()),  # a node the cluster does not have
              4: (("c", "c"), ())}  # the backend says it runs elsewhere (it chose its own nodes)
    observed = {1: ("a",), 4: ("b",)}
    workers, ps = P.known_servers(rows, NODES, placed, observed)
    assert workers == ((0, 0), (), (), (), ()) and ps == ((),) * 5
    view = P.build_view(7, rows, NODES, placed=placed, observed=observed)
    assert view.prev_worker_servers == workers
    assert P.build_view(7, rows, NODES).prev_worker_servers is None  # nothing recorded: none known


def test_only_an_all_reduce_job_that_keeps_its_size_on_other_servers_moves():
    from dl2d.core.contract import Allocation

    rows = [_row(1, 2), _row(2, 2), _row(3, 1), _row(4, 1, 1, job_type="resnet-50")]
    placed = {1: (("a", "a"), ()), 2: (("b", "b"), ()), 3: (("c",), ()), 4: (("a",), ("a",))}
    view = P.build_view(7, rows, NODES, placed=placed)
    alloc = Allocation(np.array([2, 2, 2, 1]), np.array([0, 0, 0, 1]),
                       ((0, 0), (2, 2), (2, 2), (1,)), ((), (), (), (1,)))
    assert P.moves(view, alloc).tolist() == [False, True, False, False]  # 3 grows: a resize; 4 is a PS job
    targets, _ = P.plan_targets(view, alloc, [n.name for n in NODES])
    assert [(t.job_id, t.target.workers, t.target.worker_nodes) for t in targets] == \
        [(2, 2, ("c", "c")), (3, 2, ("c", "c"))]  # the move goes first, as a shrink does
