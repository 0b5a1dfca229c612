"""dl2d.daemon.slurm.mapping (pure): a job's demand and a target -> the Slurm allocation, whether the
nodes a running job holds host a new size, and the node selection of a placed target (DLTAP)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dl2d.core.jobs import JobDemand, JobKind, TaskDemand
from dl2d.daemon.backend import JobRequest, NodeInfo, Target
from dl2d.daemon.slurm.mapping import (
    NodeShape,
    SlurmAllocation,
    TaskSize,
    allocation_for,
    allocation_for_selection,
    gpus_held_by_others,
    held_shape,
    job_demand,
    mem_mb,
    node_info,
    node_shape,
    nodes_to_host,
    per_node_request,
    slurm_node_selection,
    spread,
    target_selection,
)
from dl2d.slurm.driver import SlurmJob, SlurmNode
from dl2d.slurm.parsing import parse_sinfo_json

FIXTURES = Path(__file__).parent / "fixtures"
SHAPE = NodeShape(gpus=4, cpus=16, mem_gb=15.6)


def demand(gpus=1.0, cpus=1.0, mem_gb=0.0, ps_cpus=1.0, ps_mem_gb=0.0) -> JobDemand:
    return JobDemand(TaskDemand(gpus, cpus, mem_gb), TaskDemand(0.0, ps_cpus, ps_mem_gb))


# -- the job's demand --------------------------------------------------------------------------

def test_job_demand_is_the_spec_with_the_job_types_defaults():
    """One source of a job's demand: what the policy plans from (dl2d.core.jobs), not a second set of
    defaults. resnet-50's default worker is 1 GPU, 2 cores, 8 GB; its PS 2 cores, 4 GB."""
    silent = JobRequest(1, "resnet-50", 5, {"command": "true"})
    assert job_demand(silent) == JobDemand(TaskDemand(1, 2, 8), TaskDemand(0, 2, 4), JobKind.PS)
    two = JobRequest(1, "resnet-50", 5, {"worker": {"gpus": 2}, "ps": {"mem_gb": 1}})
    assert job_demand(two) == JobDemand(TaskDemand(2, 2, 8), TaskDemand(0, 2, 1), JobKind.PS)
    assert job_demand(JobRequest(1, "dssm", 5, {})).worker.gpus == 0  # a CPU-only type
    with pytest.raises(ValueError, match="a PS job's model must be one of DL2's types"):
        job_demand(JobRequest(1, "gpt-9", 5, {"kind": "ps"}))
    # any other model is an all-reduce job: one GPU per worker by default (dl2d.workload.catalog), no PS
    assert job_demand(JobRequest(1, "gpt-9", 5, {})) == \
        JobDemand(TaskDemand(1, 8, 40), TaskDemand(0, 0, 0), JobKind.ALLREDUCE)
    with pytest.raises(ValueError, match="worker.gpus"):
        job_demand(JobRequest(1, "resnet-50", 5, {"worker": {"gpus": -1}}))
    with pytest.raises(ValueError, match="ps.cpus"):
        job_demand(JobRequest(1, "resnet-50", 5, {"ps": {"cpus": "two"}}))


def test_slurm_gets_whole_gpus_and_cpus():
    assert TaskSize.of(TaskDemand(0.5, 1.5, 2.5)) == TaskSize(1, 2, 2.5)
    assert TaskSize.of(TaskDemand(2.0, 0.0, 0.0)) == TaskSize(2, 0, 0.0)
    # Half a GPU per worker is a whole one here: 4 such workers fill a 4-GPU node.
    assert allocation_for(5, 0, demand(gpus=0.5), SHAPE) == SlurmAllocation(2, 3, 3)


# -- the allocation rule -----------------------------------------------------------------------

@pytest.mark.parametrize("workers,ps,dem,expected", [
    (1, 1, demand(), SlurmAllocation(1, 1, 2)),
    (3, 1, demand(), SlurmAllocation(1, 3, 4)),
    (4, 2, demand(), SlurmAllocation(1, 4, 6)),
    (5, 1, demand(), SlurmAllocation(2, 3, 3)),  # 3 workers | 2 workers + the PS
    (6, 4, demand(), SlurmAllocation(2, 3, 5)),
    (8, 0, demand(gpus=2), SlurmAllocation(4, 4, 2)),
    (3, 0, demand(gpus=2), SlurmAllocation(2, 4, 2)),  # a worker's 2 GPUs are on one node: 2 + 1 workers
    (0, 3, demand(), SlurmAllocation(1, 0, 3)),  # PS only: no GPUs
    (2, 2, demand(gpus=0, cpus=8, ps_cpus=4), SlurmAllocation(2, 0, 12)),
    (1, 1, demand(mem_gb=10, ps_mem_gb=10), SlurmAllocation(2, 1, 1, 10240)),
    (3, 1, demand(cpus=2, mem_gb=8, ps_cpus=2, ps_mem_gb=4), SlurmAllocation(3, 1, 4, 12288)),  # resnet-50's: 8 GB each
    (2, 1, demand(cpus=5), SlurmAllocation(1, 2, 11)),
    (3, 1, demand(cpus=5, ps_cpus=2), SlurmAllocation(2, 2, 10)),  # 3 x 5 + 2 cores > 16
    (5, 0, demand(cpus=6), SlurmAllocation(3, 2, 12)),  # tasks do not split: 2 workers of 6 cores per node
])
def test_allocation_rule(workers, ps, dem, expected):
    assert allocation_for(workers, ps, dem, SHAPE) == expected


def test_allocation_rejects_tasks_bigger_than_a_node_and_empty_targets():
    with pytest.raises(ValueError, match="5 GPUs"):
        allocation_for(1, 1, demand(gpus=5), SHAPE)
    with pytest.raises(ValueError, match="CPUs"):
        allocation_for(1, 1, demand(ps_cpus=17), SHAPE)
    with pytest.raises(ValueError, match="memory"):
        allocation_for(1, 0, demand(mem_gb=16), SHAPE)
    with pytest.raises(ValueError, match="non-zero"):
        allocation_for(0, 0, demand(), SHAPE)


def test_unknown_node_cpus_and_memory_are_no_limit():
    assert allocation_for(4, 4, demand(cpus=8, mem_gb=100), NodeShape(4, 0, 0.0)) == SlurmAllocation(1, 4, 36, 409600)


def test_node_shape_is_the_smallest_usable_node():
    nodes = [NodeInfo("a", 4, 16, 16.0), NodeInfo("b", 2, 32, 64.0),
             NodeInfo("c", 1, 1, 1.0, usable=False)]
    assert node_shape(nodes) == NodeShape(2, 16, 16.0)
    assert node_shape([NodeInfo("c", 1, 1, 1.0, usable=False)]) is None


def test_sinfo_memory_is_parsed_and_mapped_to_node_info():
    nodes = parse_sinfo_json((FIXTURES / "sinfo-22.05.json").read_text())
    assert nodes and all(n.mem_mb == 16000 for n in nodes)
    info = node_info(nodes[0])
    assert info.mem_gb == pytest.approx(16000 / 1024)
    drained = node_info(SlurmNode("n9", "idle", flags=("DRAIN",), cpus=4, gpus=2))
    assert not drained.usable and drained.reason == "idle,DRAIN"


def test_every_node_asks_for_the_cpus_and_memory_of_the_busiest_node():
    """The issue's job (--cpus-per-worker 2 --mem-per-worker 1G --cpus-per-ps 1 --mem-per-ps 512M) asks
    Slurm for what its tasks on each node need, not 1 CPU and no memory."""
    dem = demand(gpus=1, cpus=2, mem_gb=1, ps_cpus=1, ps_mem_gb=0.5)
    assert allocation_for(2, 1, dem, SHAPE) == SlurmAllocation(1, 2, 5, 2560)  # 2 x (2, 1G) + (1, 512M)
    # 4-GPU workers: one per node; the 2 PS go to two of the nodes, so each node asks for a worker + a PS
    big = demand(gpus=4, cpus=2, mem_gb=1, ps_cpus=1, ps_mem_gb=0.5)
    assert allocation_for(3, 2, big, SHAPE) == SlurmAllocation(3, 4, 3, 1536)
    assert spread(3, 3, 2, TaskSize(4, 2, 1), TaskSize(0, 1, 0.5), SHAPE) == [(1, 1), (1, 1), (1, 0)]
    # the PS go where there is room: not onto the node whose workers left too few cores
    assert spread(2, 3, 3, TaskSize(1, 6, 0), TaskSize(0, 4, 0), SHAPE) == [(2, 1), (1, 2)]
    assert per_node_request([(2, 1), (1, 2)], TaskSize(1, 6, 0), TaskSize(0, 4, 0)) == (16, 0)
    # nothing to run asks for Slurm's minimum of one core and leaves memory out (--mem=0 is the whole node)
    assert per_node_request([(0, 1)], TaskSize(0, 0, 0), TaskSize(0, 0, 0)) == (1, 0)
    assert mem_mb(100 / 1024) == 100 and mem_mb(0.5) == 512 and mem_mb(0.0) == 0


def test_the_held_cpus_and_memory_bound_what_a_running_job_hosts():
    """A running job holds its CPUs and memory per node; Slurm adds none. A record from before dl2d asked
    for them (0) falls back to the node shape."""
    held = SlurmAllocation(2, 2, 2, 2048)  # 2 nodes x (2 GPUs, 2 cores, 2 GB)
    dem = demand(cpus=1, mem_gb=1, ps_cpus=1, ps_mem_gb=1)
    assert nodes_to_host(held, 2, 2, dem, SHAPE) == 2
    assert nodes_to_host(held, 2, 1, dem, SHAPE) == 2  # 2 workers fill a node's 2 cores: the PS needs the other
    assert nodes_to_host(held, 3, 2, dem, SHAPE) is None  # 5 tasks need 5 cores; it holds 4
    assert nodes_to_host(SlurmAllocation(2, 2), 3, 2, dem, SHAPE) == 2  # unknown: the shape's 16 cores
    assert held_shape(held, SHAPE) == NodeShape(2, 2, 2.0)


# -- what the nodes a running job holds can host ------------------------------------------------

@pytest.mark.parametrize("held,workers,ps,dem,expected", [
    (SlurmAllocation(2, 2), 4, 1, demand(), 2),  # 2 workers per node: both nodes
    (SlurmAllocation(2, 2), 2, 1, demand(), 1),  # one node is enough: the other can go
    (SlurmAllocation(2, 2), 5, 1, demand(), None),  # a 5th GPU: Slurm cannot add one
    (SlurmAllocation(2, 3), 4, 2, demand(), 2),  # 2 + 2 workers, though a new allocation would be 1 x 4
    (SlurmAllocation(1, 4), 2, 2, demand(gpus=2), 1),
    (SlurmAllocation(1, 4), 3, 1, demand(gpus=2), None),
    (SlurmAllocation(1, 2), 1, 1, demand(cpus=2, mem_gb=8, ps_cpus=2, ps_mem_gb=4), 1),
    (SlurmAllocation(1, 2), 1, 2, demand(cpus=2, mem_gb=8, ps_cpus=2, ps_mem_gb=4), None),  # 8 + 2 x 4 GB > 15.6
    (SlurmAllocation(2, 0), 0, 3, demand(), 1),
])
def test_nodes_to_host(held, workers, ps, dem, expected):
    assert nodes_to_host(held, workers, ps, dem, SHAPE) == expected


def test_an_allocation_hosts_what_it_was_sized_for():
    """Else a running job would be restarted at the same size forever."""
    for dem in (demand(), demand(gpus=2), demand(gpus=0.5, cpus=3, mem_gb=5, ps_cpus=3, ps_mem_gb=2),
                demand(gpus=0, cpus=7, ps_cpus=5)):
        for workers in range(0, 9):
            for ps in range(0, 5):
                if workers + ps == 0:
                    continue
                a = allocation_for(workers, ps, dem, SHAPE)
                assert nodes_to_host(a, workers, ps, dem, SHAPE) == a.nodes, (dem, workers, ps, a)


# -- node selection from a placement (DLTAP) ----------------------------------------------------

def test_slurm_node_selection_by_hand():
    # DLTAP Fig. 1(b) with s1..s3 = n0..n2: wk1, wk3, ps1 on n0; ps2 on n1; wk2 on n2
    sel = slurm_node_selection([0, 2, 0], [0, 1], ["n0", "n1", "n2"])
    assert sel.nodelist == ("n0", "n1", "n2") and sel.tasks_per_node == (3, 1, 1)
    assert sel.hostfile == ("n0", "n1", "n0", "n2", "n0")
    assert sel.roles == ("ps", "ps", "worker", "worker", "worker")
    assert sel.sbatch_args() == ["--nodes=3", "--nodelist=n0,n1,n2", "--ntasks=5", "--distribution=arbitrary"]
    sel = slurm_node_selection([3, 3], [1], ["a", "b", "c", "d"])
    assert sel.nodelist == ("d", "b") and sel.tasks_per_node == (2, 1)
    with pytest.raises(ValueError):
        slurm_node_selection([], [], ["a"])
    with pytest.raises(ValueError):
        slurm_node_selection([5], [0], ["a"])


def test_target_selection_and_its_allocation():
    assert target_selection(Target(2, 1)) is None
    # DLTAP Fig. 1(b): wk1, wk3, ps1 on node1; ps2 on node2; wk2 on node3
    sel = target_selection(Target(3, 2, ("node1", "node3", "node1"), ("node1", "node2")))
    assert sel.nodelist == ("node1", "node2", "node3") and sel.tasks_per_node == (3, 1, 1)
    assert sel.hostfile == ("node1", "node2", "node1", "node3", "node1")
    # node1 holds 2 workers and a PS: every node asks for its 2 GPUs and 3 cores (and its memory)
    assert allocation_for_selection(sel, demand()) == SlurmAllocation(3, 2, 3)
    assert allocation_for_selection(sel, demand(gpus=2)) == SlurmAllocation(3, 4, 3)
    assert allocation_for_selection(sel, demand(gpus=1.5)) == SlurmAllocation(3, 4, 3)  # whole GPUs
    assert allocation_for_selection(sel, demand(cpus=2, mem_gb=8, ps_cpus=1, ps_mem_gb=0.5)) \
        == SlurmAllocation(3, 2, 5, 16896)
    ps_only = target_selection(Target(0, 2, (), ("node4", "node4")))
    assert ps_only.nodelist == ("node4",) and allocation_for_selection(ps_only, demand()) == SlurmAllocation(1, 0, 2)
    with pytest.raises(ValueError, match="places 1 workers / 1 PS on nodes but asks for 2/1"):
        target_selection(Target(2, 1, ("node1",), ("node1",)))


def test_the_gpus_other_slurm_jobs_hold_are_the_nodes_count_less_dl2ds_own():
    """Each node's GRES in use less what dl2d's own Slurm jobs hold there: a job of dl2d's that is completing
    still holds its GPUs, one still pending holds none; a planted job with a dl2d name and comment, and another
    user's job asking its GPUs per job (no per-node GRES reported), are someone else's."""
    nodes = [SlurmNode("n1", "mixed", gpus=4, gpus_alloc=4), SlurmNode("n2", "mixed", gpus=4, gpus_alloc=3),
             SlurmNode("n3", "idle", gpus=4), SlurmNode("n4", "allocated", gpus=4, gpus_alloc=4)]
    jobs = [SlurmJob("10", "dl2d-1", "RUNNING", nodes=("n1", "n2"), num_nodes=2, gpus_per_node=2),
            SlurmJob("11", "dl2d-2", "COMPLETING", nodes=("n1",), num_nodes=1, gpus_per_node=2),
            SlurmJob("12", "dl2d-3", "PENDING", num_nodes=1, gpus_per_node=4),
            SlurmJob("13", "dl2d-4", "RUNNING", nodes=("n2",), num_nodes=1, gpus_per_node=1, comment="dl2d:4"),
            SlurmJob("14", "train", "RUNNING", nodes=("n4",), num_nodes=1)]
    assert gpus_held_by_others(nodes, jobs, {"10", "11", "12"}) == {"n1": 0, "n2": 1, "n3": 0, "n4": 4}
    assert gpus_held_by_others(nodes, jobs, set()) == {"n1": 4, "n2": 3, "n3": 0, "n4": 4}
    assert node_info(nodes[3], 4).gpus_other == 4 and node_info(nodes[3]).gpus_other == 0
