"""dl2d.daemon.slurm.planning (pure): the apply plan (start / hot / restart / shrink / stop / noop), whether
a job's runtime can be resized hot now, progress and status."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest

from dl2d.core.jobs import JobDemand, TaskDemand
from dl2d.daemon.backend import (
    FAILED,
    FINISHED,
    HOT,
    NOOP,
    PENDING,
    RESTART,
    RUNNING,
    SHRINK,
    START,
    STOP,
    Target,
)
from dl2d.daemon.slurm.mapping import (
    NodeShape,
    SlurmAllocation,
    allocation_for,
    nodes_to_host,
)
from dl2d.daemon.slurm.planning import (
    Current,
    Plan,
    epochs_from_progress,
    finish_time,
    is_elastic,
    lost_epochs_from_progress,
    plan_apply,
    runtime_scales_hot,
    status_from,
    time_limit,
)
from dl2d.slurm.driver import SlurmJob

SHAPE = NodeShape(gpus=4, cpus=16, mem_gb=15.6)
DEMAND = JobDemand(TaskDemand(1, 1, 0), TaskDemand(0, 1, 0))  # 1 GPU and 1 core per worker, 1 core per PS


def plan(cur: Current, target: Target, needed: SlurmAllocation | None = None) -> Plan:
    """plan_apply with the facts the backend gathers: ``needed`` by the allocation rule (unless given),
    how few of the running job's nodes host the target."""
    if needed is None and (target.workers, target.ps) != (0, 0):
        needed = allocation_for(target.workers, target.ps, DEMAND, SHAPE)
    hosting = None
    if cur.slurm_state == "RUNNING" and cur.allocation is not None and needed is not None:
        hosting = nodes_to_host(cur.allocation, target.workers, target.ps, DEMAND, SHAPE)
    return plan_apply(cur, target, needed, hosting)


def test_is_elastic():
    assert is_elastic({"command": "dl2-run --workers $DL2D_WORKERS --ps 1"})
    assert is_elastic({"command": "exec /opt/venv/bin/dl2-run --epochs 3"})
    assert is_elastic({"command": "python -m dl2d.elastic.launcher --local"})
    assert not is_elastic({"command": "python train.py"})
    assert not is_elastic({"command": "dl2-run", "elastic": False})
    assert is_elastic({"script": "#!/bin/sh\n...", "elastic": True})
    assert not is_elastic({"command": "echo 'unbalanced"})


# -- the apply plan --------------------------------------------------------------------------

RUN2 = Current("RUNNING", SlurmAllocation(2, 2), (4, 1))  # a job that is not elastic
HOT2 = replace(RUN2, elastic=True, hot_scaling=True)  # elastic, its runtime ready to be resized
COLD2 = replace(RUN2, elastic=True, hot_scaling=False)  # elastic, but its runtime cannot be resized now


@pytest.mark.parametrize("cur,target,needed,expected", [
    (Current(None, None, (0, 0)), Target(2, 1), None, START),
    (Current(None, None, (0, 0)), Target(0, 0), None, NOOP),
    (Current(None, None, (0, 0), finished=True), Target(2, 1), None, NOOP),
    (Current("PENDING", SlurmAllocation(1, 2, 3), (2, 1)), Target(2, 1), None, NOOP),
    (Current("PENDING", SlurmAllocation(1, 2), (2, 1)), Target(2, 1), None, START),  # asked for no CPUs
    (Current("PENDING", SlurmAllocation(1, 2), (2, 1)), Target(6, 1), None, START),
    (Current("PENDING", SlurmAllocation(1, 2), (2, 1)), Target(0, 0), None, STOP),
    (RUN2, Target(4, 1), None, NOOP),
    (HOT2, Target(4, 1), None, NOOP),
    (HOT2, Target(0, 0), None, STOP),
    (RUN2, Target(2, 1), None, SHRINK),
    (HOT2, Target(2, 1), None, SHRINK),
    (COLD2, Target(2, 1), None, RESTART),  # scaled down hot before nodes go: not possible now
    (RUN2, Target(3, 2), None, RESTART),  # its nodes host it, but not elastic: only a relaunch reaches it
    (RUN2, Target(4, 0), None, NOOP),  # not elastic, a PS fewer: it keeps its size (not reached, not recorded)
    (HOT2, Target(3, 2), None, HOT),
    (HOT2, Target(4, 3), None, HOT),  # more PS on the held nodes
    (HOT2, Target(6, 1), None, RESTART),  # 3 workers per node: more GPUs per node than held
    (HOT2, Target(9, 1), None, RESTART),
    (RUN2, Target(9, 1), None, RESTART),
    (HOT2, Target(4, 0), None, RESTART),  # the elastic runtime needs a PS
])
def test_plan_apply(cur, target, needed, expected):
    assert plan(cur, target, needed).method == expected


def test_a_job_that_is_not_elastic_keeps_its_size_when_it_would_only_lose_servers():
    assert plan(RUN2, Target(4, 0)) == Plan(NOOP, reached=False)
    assert plan(RUN2, Target(4, 1)) == Plan(NOOP)  # its size: reached
    assert plan(HOT2, Target(4, 2)).method == HOT  # an elastic job's runtime drops the server


def test_a_grow_the_held_nodes_host_stays_hot():
    """2 -> 4 workers on 2 nodes x 2 GPUs: a new allocation would be 1 node x 4 GPUs, but the nodes the
    job holds host 2 workers each, and its runtime can take them: no restart."""
    cur = replace(HOT2, applied=(2, 1))
    assert plan(cur, Target(4, 2)) == Plan(HOT)
    assert plan(cur, Target(3, 1)) == Plan(HOT)


def test_a_grow_restarts_when_the_runtime_cannot_scale_hot():
    for cur in (replace(COLD2, applied=(2, 1)),  # elastic, but not now (starting, busy, or an old coordinator)
                replace(HOT2, applied=(2, 0))):  # the elastic runtime needs >= 1 PS on both sides
        assert plan(cur, Target(4, 2)) == Plan(RESTART, SlurmAllocation(1, 4, 6))
    # A job that is not elastic is relaunched at the new size: recording a size its processes never took, on
    # an allocation Slurm keeps, would count GPUs free that Slurm holds.
    assert plan(replace(RUN2, applied=(2, 1)), Target(4, 2)) == Plan(RESTART, SlurmAllocation(1, 4, 6))


def test_a_grow_beyond_the_held_nodes_restarts_even_when_the_runtime_could_scale_hot():
    """Slurm adds neither nodes nor GPUs per node to a running allocation."""
    cur = replace(HOT2, applied=(2, 1))
    assert plan(cur, Target(5, 1)) == Plan(RESTART, SlurmAllocation(2, 3, 3))
    assert plan(cur, Target(16, 1)) == Plan(RESTART, SlurmAllocation(4, 4, 5))
    assert plan_apply(cur, Target(4, 1), SlurmAllocation(1, 4), None) == Plan(RESTART, SlurmAllocation(1, 4))


def test_shrink_keeps_the_fewest_nodes_that_host_the_target_when_they_hold_no_gpu_it_does_not_use():
    cur = Current("RUNNING", SlurmAllocation(3, 3), (9, 1))
    assert plan(cur, Target(6, 1)) == Plan(SHRINK, SlurmAllocation(2, 3))
    assert plan(cur, Target(5, 1)) == Plan(SHRINK, SlurmAllocation(2, 3))  # a fresh request holds as many
    assert plan(cur, Target(3, 1)) == Plan(SHRINK, SlurmAllocation(1, 3))
    # 4 workers would keep 2 nodes of 3 GPUs, 6 GPUs: a relaunch on one node of 4 instead
    assert plan(cur, Target(4, 1)).method == RESTART
    assert plan(cur, Target(1, 1)).method == RESTART
    # A placed target keeps its spread: 1 worker + 1 PS placed on 2 nodes do not shrink to one.
    placed = Current("RUNNING", SlurmAllocation(2, 1), (1, 1))
    assert plan(placed, Target(1, 1), needed=SlurmAllocation(2, 1)) == Plan(NOOP)
    assert plan(placed, Target(1, 1)) == Plan(SHRINK, SlurmAllocation(1, 1))


def test_plan_apply_needs_an_allocation_for_a_nonzero_target():
    with pytest.raises(ValueError):
        plan_apply(RUN2, Target(1, 1), None, None)


# -- can the runtime be resized hot now? -------------------------------------------------------

COORD = {"address": "node1:4000", "job_id": "7", "pid": 12}


@pytest.mark.parametrize("elastic,coordinator,written,started,progress,expected", [
    (True, COORD, 1000.5, 1000, {"state": "running"}, True),
    (True, COORD, 1000.5, None, None, True),  # no start time, no progress: nothing says no
    (False, COORD, 1000.5, 1000, {"state": "running"}, False),  # not an elastic runtime
    (True, None, None, 1000, {"state": "running"}, False),  # no coordinator published
    (True, {"job_id": "7"}, 1000.5, 1000, {"state": "running"}, False),  # no address in it
    (True, COORD, 990.0, 1000, {"state": "running"}, False),  # left by an earlier run
    (True, COORD, 1000.5, 1000, {"state": "starting"}, False),
    (True, COORD, 1000.5, 1000, {"state": "scaling"}, False),  # busy with a resize
    (True, COORD, 1000.5, 1000, {"state": "checkpointing"}, False),
])
def test_runtime_scales_hot(elastic, coordinator, written, started, progress, expected):
    assert runtime_scales_hot(elastic, coordinator, written, started, progress) is expected


# -- progress and status ---------------------------------------------------------------------

def test_epochs_from_progress():
    assert epochs_from_progress(None) == 0.0
    assert epochs_from_progress({"epoch": 3, "epochs": 8, "status": "running"}) == 3.0
    # dl2-run: 2.5 epochs done of 4 at 10 steps per epoch
    assert epochs_from_progress({"epoch": 2, "step": 25, "total_steps": 40, "epochs": 4,
                                 "state": "running"}) == pytest.approx(2.5)
    assert epochs_from_progress({"epoch": "garbage"}) == 0.0


def sjob(state="RUNNING", job_id="7", nodes=("node1",), reason="", **kw) -> SlurmJob:
    return SlurmJob(job_id=job_id, name="dl2d-1", state=state, reason=reason, nodes=nodes,
                    num_nodes=len(nodes), gpus_per_node=1, comment="dl2d:1", **kw)


REC = {"slurm_job_id": "7", "applied": {"workers": 2, "ps": 1}, "elastic": True}


@pytest.mark.parametrize("record,slurm,progress,state,workers,message", [
    (REC, sjob(), {"epoch": 2}, RUNNING, 2, ""),
    (REC, sjob("PENDING", nodes=(), reason="Resources"), None, PENDING, 2, "Resources"),
    (REC, sjob("COMPLETED"), {"epoch": 8, "status": "done"}, FINISHED, 0, "done"),
    (REC, sjob("FAILED", reason="NonZeroExitCode"), {"epoch": 1, "status": "running"}, FAILED, 0,
     "ended FAILED (NonZeroExitCode)"),
    (REC, sjob("COMPLETED"), {"epoch": 1, "status": "running"}, FAILED, 0, "ended COMPLETED"),
    (REC, sjob("COMPLETED"), {"epoch": 3, "status": "checkpointed"}, PENDING, 0, "checkpointed"),
    (REC, sjob("FAILED"), {"epoch": 3, "state": "checkpointed"}, PENDING, 0, "checkpointed"),
    ({**REC, "stopped": True}, sjob("CANCELLED"), {"epoch": 3}, PENDING, 0, "stopped"),
    ({**REC, "cancelled": True}, sjob("CANCELLED"), None, FAILED, 0, "cancelled"),
    ({**REC, "final": FAILED, "message": "boom"}, None, None, FAILED, 0, "boom"),
    (REC, None, {"epoch": 3}, PENDING, 0, "gone"),
    ({}, None, None, PENDING, 0, "not submitted"),
])
def test_status_from(record, slurm, progress, state, workers, message):
    st = status_from(1, record, slurm, progress)
    assert (st.state, st.workers) == (state, workers), st
    assert message in st.message
    assert st.epochs_done == epochs_from_progress(progress)


def test_the_default_time_limit_applies_when_the_spec_has_none_or_null():
    """A stored submission without -t holds time_limit_min = null: the [slurm] default applies."""
    assert time_limit({"time_limit_min": None}, 10) == 10
    assert time_limit({}, 10) == 10
    assert time_limit({"time_limit_min": 30}, 10) == 30
    assert time_limit({"time_limit_min": None}, None) is None  # neither: the partition's limit


def test_the_finish_time_is_the_most_exact_fact():
    t = 1_700_000_000  # a clock reading: the job's own word is believed only within its run and the years 2000-2100
    done = {"status": "done", "epoch": 3}
    ended = SlurmJob("7", "dl2d-1", "COMPLETED", start_time=t, end_time=t + 50)
    running = SlurmJob("7", "dl2d-1", "RUNNING", start_time=t, end_time=t + 999_999)  # start + limit: says nothing
    rec = {"slurm_job_id": "7"}
    assert finish_time({"finished_at": t + 10.5}, ended, done, t + 40) == t + 10.5  # recorded first
    assert finish_time(rec, ended, done, t + 40) == t + 50  # Slurm's EndTime of the ended job
    assert finish_time(rec, running, {**done, "time": t + 45.2}, t + 40) == t + 45.2  # its own record
    assert finish_time(rec, running, done, t + 40) == t + 40  # else when it last wrote its progress
    assert finish_time(rec, None, done, None) is None
    # a job cannot date its end before its run, in the future, or outside any clock's range
    assert finish_time(rec, running, {**done, "time": t - 5}, t + 40) == t + 40
    assert finish_time(rec, running, {**done, "time": t + 100}, t + 40, now=t + 60) == t + 40
    assert finish_time(rec, None, {**done, "time": 1e18}, 1e17) is None
    st = status_from(1, rec, ended, done, t + 40)
    assert st.state == FINISHED and st.finished_at == datetime.fromtimestamp(t + 50, timezone.utc)
    failed = status_from(1, rec, SlurmJob("7", "dl2d-1", "FAILED", end_time=t + 60), {"epoch": 1})
    assert failed.state == FAILED and failed.finished_at.timestamp() == t + 60
    assert status_from(1, rec, running, {"epoch": 1}).finished_at is None  # not finished: no time


def test_a_job_that_says_done_while_slurm_runs_it_still_holds_its_gpus():
    """The job's word does not end what Slurm runs: until its Slurm job ends it is RUNNING at its size (the
    backend cancels it after done_grace_s), then FINISHED at Slurm's EndTime."""
    t = 1_700_000_000
    rec = {"slurm_job_id": "7", "applied": {"workers": 4, "ps": 0}}
    running = SlurmJob("7", "dl2d-1", "RUNNING", start_time=t, nodes=("n1",))
    st = status_from(1, rec, running, {"status": "done", "epoch": 3, "time": t + 2}, t + 2, now=t + 5)
    assert (st.state, st.workers, st.finished_at) == (RUNNING, 4, None) and "says done" in st.message
    gone = SlurmJob("7", "dl2d-1", "CANCELLED", start_time=t, end_time=t + 400)
    st = status_from(1, rec, gone, {"status": "done", "epoch": 3, "time": t + 2}, t + 2, now=t + 401)
    assert st.state == FINISHED and st.finished_at.timestamp() == t + 400


def test_a_shrink_keeps_what_each_node_holds():
    cur = Current("RUNNING", SlurmAllocation(3, 3, 4, 3072), (9, 1))
    assert plan(cur, Target(5, 1)) == Plan(SHRINK, SlurmAllocation(2, 3, 4, 3072))


def test_a_job_of_one_process_per_worker_changes_size_only_by_restart():
    """launch = "srun": its process count is fixed for a run, and releasing a node in place would kill some
    of its ranks: a shrink, a grow within its nodes, a grow beyond them are all a checkpoint-restart."""
    fixed = Current("RUNNING", SlurmAllocation(2, 4), (8, 0), fixed_size=True)
    assert plan(fixed, Target(8, 0)) == Plan(NOOP)
    assert plan(fixed, Target(4, 0)) == Plan(RESTART, SlurmAllocation(1, 4, 4))  # SHRINK when not fixed
    assert plan(replace(fixed, fixed_size=False), Target(4, 0)).method == SHRINK
    assert plan(fixed, Target(7, 0)).method == RESTART  # its nodes host 7, but its processes are 8
    assert plan(replace(fixed, fixed_size=False), Target(7, 0)).method == RESTART  # nor is a job that is not elastic
    assert plan(fixed, Target(12, 0)) == Plan(RESTART, SlurmAllocation(3, 4, 4))
    assert plan(fixed, Target(0, 0)).method == STOP


def test_lost_epochs_from_progress():
    assert lost_epochs_from_progress({"lost_steps": 30, "total_steps": 300, "epochs": 2.0}) == pytest.approx(0.2)
    for bad in (None, {}, {"lost_steps": 30}, {"lost_steps": 30, "total_steps": 0, "epochs": 2},
                {"lost_steps": "x", "total_steps": 300, "epochs": 2}, {"lost_steps": 0, "total_steps": 3, "epochs": 1},
                {"lost_steps": True, "total_steps": 3, "epochs": 1}):
        assert lost_epochs_from_progress(bad) == 0.0
