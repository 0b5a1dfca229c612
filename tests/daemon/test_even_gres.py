"""Sizes Slurm's per-node requests hold exactly (dl2d.daemon.plan.even_gres): ``--nodes=N --gres=gpu:G`` gives
every node of a job the same GPUs, so an all-reduce job of 10 one-GPU workers on 4-GPU nodes would hold 12."""
from __future__ import annotations

import numpy as np

from dl2d.core.contract import Allocation
from dl2d.core.jobs import JobKind
from dl2d.daemon import plan as P
from dl2d.daemon.backend import NodeInfo


def test_even_workers_on_four_gpu_nodes():
    got = {w: P.even_workers(w, 4) for w in range(1, 17)}
    assert got == {1: 1, 2: 2, 3: 3, 4: 4, 5: 4, 6: 6, 7: 6, 8: 8, 9: 9, 10: 9, 11: 9, 12: 12, 13: 12, 14: 12,
                   15: 12, 16: 16}
    for w, even in got.items():  # what Slurm holds for the even size is the size itself
        nodes = -(-even // 4)
        assert nodes * -(-even // nodes) == even and even <= w
    assert P.even_workers(5, 8) == 5 and P.even_workers(9, 8) == 8 and P.even_workers(0, 4) == 0


def _row(job_id: int, kind: JobKind):
    if kind == JobKind.ALLREDUCE:
        return P.JobRow(id=job_id, job_type="cifar10", total_epochs=10.0,
                        spec={"kind": "allreduce", "batch_size": 128.0, "workers": 4})
    return P.JobRow(id=job_id, job_type="resnet-50", total_epochs=10.0, spec={"workers": 3})


def test_even_gres_cuts_all_reduce_jobs_and_their_placements_only():
    nodes = [NodeInfo(f"n{i}", 4, 16, 64.0) for i in range(4)]
    rows = [_row(1, JobKind.ALLREDUCE), _row(2, JobKind.ALLREDUCE), _row(3, JobKind.PS)]
    view = P.build_view(0, rows, nodes)
    alloc = Allocation(np.array([5, 6, 3]), np.array([0, 0, 1]),
                       ((0, 0, 0, 0, 1), (1, 1, 2, 2, 2, 2), (3, 3, 3)), ((), (), (3,)))
    out, cut = P.even_gres(view, alloc)
    assert out.workers.tolist() == [4, 6, 3] and out.ps.tolist() == [0, 0, 1]
    assert out.worker_servers[0] == (0, 0, 0, 0) and out.worker_servers[1:] == alloc.worker_servers[1:]
    assert list(cut) == [1] and "5 would hold more than 5" in cut[1]
    same, none = P.even_gres(view, out)
    assert same is out and none == {}


def test_a_size_in_between_is_rounded_up_where_its_nodes_and_the_idle_gpus_hold_the_next_one():
    nodes = [NodeInfo(f"n{i}", 4, 16, 64.0) for i in range(4)]
    rows = [P.JobRow(id=i, job_type="cifar10", total_epochs=10.0,
                     spec={"kind": "allreduce", "batch_size": 128.0, "workers": 8,
                           "worker": {"gpus": 1, "cpus": 1, "mem_gb": 1}}) for i in (1, 2)]
    view = P.build_view(0, rows, nodes)
    alloc = Allocation(np.array([7, 4]), np.array([0, 0]), ((0, 0, 0, 0, 1, 1, 1), (2, 2, 2, 2)), ((), ()))
    out, why = P.even_gres(view, alloc, {1: 8, 2: 8})
    # 8 = 2 nodes of 4: its own node 0, and node 1 (its 3 and the idle one); node 3 stays idle for others
    assert out.workers.tolist() == [8, 4] and out.worker_servers[0] == (0,) * 4 + (1,) * 4
    assert list(why) == [1] and "7 would hold 8's, and they were idle" in why[1]
    cut, why = P.even_gres(view, alloc, {1: 7, 2: 8})  # its own bound is 7: cut
    assert cut.workers.tolist() == [6, 4] and "7 would hold more than 7" in why[1]
    crowded = Allocation(np.array([7, 5]), np.array([0, 0]), ((0, 0, 0, 0, 1, 1, 1), (1, 2, 2, 2, 2)), ((), ()))
    # node 1 is full: 8 goes to its node 0 and the idle node 3; then 5 fits as 6, 3 on each of its nodes
    out, why = P.even_gres(view, crowded, {1: 8, 2: 8})
    assert out.workers.tolist() == [8, 6] and sorted(why) == [1, 2]
    assert out.worker_servers == ((0,) * 4 + (3,) * 4, (1, 1, 1, 2, 2, 2))
    three = P.build_view(0, rows + [P.JobRow(id=3, job_type="cifar10", total_epochs=10.0, spec=rows[0].spec)], nodes)
    full = Allocation(np.array([7, 4, 4]), np.array([0, 0, 0]), ((0, 0, 0, 0, 1, 1, 1), (1, 2, 2, 2), (3,) * 4),
                      ((), (), ()))
    out, why = P.even_gres(three, full, {1: 8, 2: 8, 3: 8})  # the one idle GPU is on node 2: 8 fits nowhere
    assert out.workers.tolist() == [6, 4, 4] and list(why) == [1] and "7 would hold more than 7" in why[1]


def test_a_job_sized_below_its_minimum_waits_instead():
    nodes = [NodeInfo(f"n{i}", 4, 16, 64.0) for i in range(2)]
    rows = [_row(1, JobKind.ALLREDUCE), _row(2, JobKind.ALLREDUCE)]
    view = P.build_view(0, rows, nodes)
    alloc = Allocation(np.array([2, 3]), np.array([0, 0]), ((0, 0), (1, 1, 1)), ((), ()))
    out, cut = P.below_minimum(view, alloc, {1: 3, 2: 3})
    assert out.workers.tolist() == [0, 3] and out.worker_servers == ((), (1, 1, 1))
    assert cut == {1: "pending: sized 2, below its minimum of 3 workers: it waits"}
    assert P.below_minimum(view, out, {1: 3, 2: 3}) == (out, {})


def test_the_daemon_never_runs_a_job_below_its_minimum(tmp_path):
    from dl2d.daemon.loop import SlotLoop
    from dl2d.daemon.sim_backend import SimBackend
    from dl2d.db.engine import make_engine, session_scope, upgrade
    from dl2d.db.jobs import submit_job
    from dl2d.db.models import Job, JobState
    from dl2d.db.slots import pending_reasons
    from dl2d.policy.registry import make_heuristic
    from dl2d.sim.cluster import ClusterSpec

    engine = make_engine(f"sqlite:///{tmp_path / 'dl2d.sqlite'}")
    upgrade(engine)
    spec = {"owner": "u", "kind": "allreduce", "job_type": "cifar10", "batch_size": 512.0, "command": "run",
            "total_epochs": 100.0, "worker": {"gpus": 1, "cpus": 1, "mem_gb": 1}}
    with session_scope(engine) as s:
        small = submit_job(s, {**spec, "name": "small", "workers": 2}).id
        ranged = submit_job(s, {**spec, "name": "ranged", "workers": 8, "min_workers": 4, "max_workers": 8}).id
    backend = SimBackend(ClusterSpec(1, 4, 16, 64.0), 60.0, noise=0.0, start_time=0.0)
    loop = SlotLoop(engine, backend, None, make_heuristic("drf"), slot_seconds=60.0, pace=False)
    loop.run(max_slots=1)  # DRF shares the 4 GPUs: 2 each, below the ranged job's minimum
    with session_scope(engine) as s:
        assert s.get(Job, small).workers == 2
        assert (s.get(Job, ranged).state, s.get(Job, ranged).workers) == (JobState.PENDING, 0)
        assert "below its minimum of 4 workers" in pending_reasons(s)[ranged]
    assert ranged not in backend.observe()  # never started
