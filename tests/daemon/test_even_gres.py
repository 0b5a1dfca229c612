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
