"""A job's per-task demand has one source, its spec: a job submitted with 2 GPUs per worker is planned with 2 by
the policy (the view, every registered daemon policy's placement), by the guardrails (capacity check) and by the
backends (the simulated cluster's accounting here; Slurm's request in tests/slurm)."""
from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from dl2d.core.contract import Allocation
from dl2d.daemon import plan as P
from dl2d.daemon.backend import NodeInfo
from dl2d.daemon.config import build_config
from dl2d.daemon.main import build_loop
from dl2d.db.engine import session_scope
from dl2d.db.jobs import submit_job
from dl2d.db.models import Allocation as AllocRow
from dl2d.policy import registry
from testkit.policy import world_for

TWO_GPU_SPEC = {"worker": {"gpus": 2, "cpus": 2, "mem_gb": 8}, "ps": {"cpus": 2, "mem_gb": 4}}
NODES = [NodeInfo(f"n{i}", 2, 8, 48.0) for i in range(4)]  # 8 GPUs, 32 cores


def view_of(spec):
    return P.build_view(0, [P.job_row(1, "resnet-50", 100.0, 0.0, 0, 0, 0, spec, "big")], NODES)


def gpus_per_server(view, alloc) -> np.ndarray:
    used = np.zeros(len(view.capacity))
    for j, servers in enumerate(alloc.worker_servers):
        for s in servers:
            used[s] += view.worker_demand[j][0]
    return used


def test_the_view_carries_the_spec_demand_and_the_type_default_where_silent():
    view = view_of(TWO_GPU_SPEC)
    assert view.worker_demand.tolist() == [[2.0, 2.0, 8.0]] and view.ps_demand.tolist() == [[0.0, 2.0, 4.0]]
    assert view.kind == ("ps",) and view.node_names == ("n0", "n1", "n2", "n3")
    plain = view_of({})  # resnet-50's default: 1 GPU, 2 cores, 8 GB per worker
    assert plain.worker_demand.tolist() == [[1.0, 2.0, 8.0]]


@pytest.mark.parametrize("name", registry.names(daemon=True, learned=False) + ("dl2",))
def test_every_daemon_policy_plans_two_gpus_per_worker(name):
    options = registry.PolicyOptions(allow_untrained=True, world=world_for(name))
    two, one = view_of(TWO_GPU_SPEC), view_of({})  # a PS job: both worlds' policies plan it
    alloc = registry.build(name, options)(two)
    assert P.check_allocation(two, alloc) is None, name
    used = gpus_per_server(two, alloc)
    assert used.sum() == 2 * alloc.workers[0] and np.all(used <= 2), name
    assert alloc.workers[0] <= 4  # 8 GPUs hold at most four 2-GPU workers
    if name == "drf":  # DRF fills the GPUs: 4 workers at 2 GPUs, more at the type's 1 GPU (cores bind first)
        assert alloc.workers[0] == 4 and registry.build(name, options)(one).workers[0] > 4


def test_the_guardrails_check_capacity_with_the_spec_demand():
    two, one = view_of(TWO_GPU_SPEC), view_of({})
    both_on_n0 = Allocation(np.array([2]), np.array([1]), ((0, 0),), ((1,),))
    assert P.check_allocation(one, both_on_n0) is None  # two 1-GPU workers fit on a 2-GPU node
    assert P.check_allocation(two, both_on_n0).startswith("over capacity")  # two 2-GPU workers do not
    g = P.guard(two, registry.StatelessPolicy(lambda v: both_on_n0, "packer"), registry.make_heuristic("drf"), {}, 6)
    assert g.source == "fallback" and g.reason.startswith("over capacity")
    assert P.check_allocation(two, g.allocation) is None and g.allocation.workers[0] == 4


def test_the_daemon_plans_and_the_simulated_cluster_runs_two_gpu_workers(tmp_path):
    cfg = build_config({"state_dir": str(tmp_path), "sim": {"cluster": "tiny", "noise": 0.0},
                        "metrics": {"enabled": False}}, {})
    loop = build_loop(cfg)
    with session_scope(loop.engine) as s:
        job_id = submit_job(s, {"name": "big", "owner": "alice", "job_type": "resnet-50", "total_epochs": 50.0,
                                "command": "python train.py", **TWO_GPU_SPEC}).id
    loop.run(max_slots=2)
    with session_scope(loop.engine) as s:
        workers = [a.workers for a in s.scalars(select(AllocRow).where(AllocRow.job_id == job_id))]
    assert workers == [4, 4]  # the tiny cluster's 8 GPUs: four 2-GPU workers (eight at the type's 1 GPU)
    job = loop.backend.jobs[job_id]
    assert job["worker_demand"] == [2.0, 2.0, 8.0] and job["workers"] == 4
