"""Where an all-reduce job's new workers go (SlotView.allreduce_placement, SimConfig's, `dl2ctl sim
--allreduce-placement`): "spread" on the least loaded server (DL2's rule), "pack" on the most loaded one that
fits, so a job spans the fewest servers and whole servers stay free for the next one."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from dl2d.cli.main import cli
from dl2d.core.placement import Placer
from dl2d.policy.baselines.heuristics import AllocationBuilder
from dl2d.policy.registry import make_heuristic
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.sim.worlds import world
from dl2d.workload import philly
from tests.testkit.sim import bound_case, make_view, run_slots

GPU = np.array([1.0, 4.0, 16.0])  # one worker: a GPU, 4 cores, 16 GB
NODE = np.array([4.0, 48.0, 192.0])


def place_job(placer: Placer, workers: int, pack: bool) -> list[int]:
    """A new all-reduce job's workers placed one at a time as AllocationBuilder places them: each where the
    job already is, if it fits there."""
    servers: list[int] = []
    for n in range(workers):
        s = placer.add_preferring(GPU, servers, workers - n if pack else 0)
        assert s >= 0
        servers.append(s)
    return servers


@pytest.mark.parametrize("pack, spans", [(True, 1), (False, 2)])
def test_pack_fills_the_servers_in_use_and_keeps_whole_servers_for_the_next_job(pack, spans):
    free = np.tile(NODE, (4, 1))
    free[0] -= GPU  # one GPU of server 0 is taken by a running job
    placer = Placer(free, NODE)
    small = place_job(placer, 1, pack)
    assert small == ([0] if pack else [1])  # pack: beside the running job; spread: an empty server
    big = place_job(placer, 8, pack)
    assert len(set(big)) == 2
    last = place_job(placer, 4, pack)
    assert len(set(last)) == spans  # pack: one whole server was left; spread: two halves
    assert np.all(placer.free >= -1e-9) and placer.free[:, 0].sum() == 2


def test_pack_breaks_ties_by_the_lowest_server_and_returns_minus_one_when_nothing_fits():
    placer = Placer(np.tile(NODE, (3, 1)), NODE)
    assert placer.add_preferring(GPU, [], pack_for=2) == 0
    placer = Placer(np.zeros((2, 3)), NODE)
    assert placer.add_preferring(GPU, [], pack_for=1) == -1
    assert np.all(placer.free == 0)


@pytest.mark.parametrize("free_gpus, count, span", [
    ((4, 4, 4, 4), 8, 2),  # two servers of one class: both are counted (each holds four)
    ((4, 4, 4, 4), 16, 4),
    ((4, 4, 4, 4), 17, 5),  # does not fit: more than the servers
    ((4, 2, 4, 1), 6, 2),  # 4 + 2: the best fit of what is left
    ((4, 2, 4, 1), 2, 1),
    ((4, 2, 4, 1), 11, 4),
])
def test_packed_span_counts_every_server_of_a_class(free_gpus, count, span):
    free = np.tile(NODE, (len(free_gpus), 1))
    free[:, 0] = free_gpus
    placer = Placer(free, NODE)
    assert placer.packed_span(GPU, count) == span
    assert np.array_equal(placer.free, free)  # nothing placed


def test_a_job_on_more_servers_than_it_needs_moves_to_two_whole_ones():
    """An 8-worker job on three servers (3 + 3 + 2) while the cluster is otherwise idle moves to two whole
    servers when its size stays (a fresh packing of eight takes two servers of the same class)."""
    base = bound_view(1)
    view = dataclasses.replace(base, free=np.tile(base.capacity[0], (4, 1)), capacity=np.tile(base.capacity[0], (4, 1)),
                               max_workers=max(base.max_workers, 8), prev_workers=np.array([8]),
                               prev_worker_servers=((0, 0, 0, 1, 1, 1, 2, 2),))
    b = AllocationBuilder(view)
    assert b.add_up_to(0, "worker", 8) == 8
    assert len(set(b.worker_servers[0])) == 2


def as_asked(view):
    """Each job, in arrival order, the workers it asked for, placed as many at once (AllocationBuilder's
    add_up_to, as the target-size policy places its sizes)."""
    b = AllocationBuilder(view)
    for j in np.argsort(view.arrival_slot, kind="stable"):
        b.add_up_to(int(j), "worker", int(view.requested[j]))
    return b.allocation()


def test_the_simulator_packs_all_reduce_jobs_on_the_fewest_servers():
    """Today's world, 40 Philly jobs at 2x load on 16 nodes of 4 GPUs, each job its asked size: the same 40
    slots under both rules; with "pack" every job spans the fewest servers its workers need, with "spread" jobs
    that arrive after small ones took empty servers span more."""
    config, _ = bound_case("today")
    trace = T.from_workload(philly.generate(40, load=2.0, seed=11), config.slot_seconds, seed=11)
    extra = {}
    for rule in ("spread", "pack"):
        cfg = dataclasses.replace(config, allreduce_placement=rule)
        _, steps = run_slots(trace, as_asked, 40, cfg)
        assert all(v.allreduce_placement == rule for v, _ in steps)
        extra[rule] = [len(set(alloc.worker_servers[j])) - -(-len(alloc.worker_servers[j]) // 4)
                       for view, alloc in steps for j in range(len(view)) if alloc.worker_servers[j]]
    assert min(len(extra["pack"]), len(extra["spread"])) > 100  # job-slots placed (a job may end a slot apart)
    assert sum(extra["spread"]) > 10 and sum(extra["pack"]) == 0


def extra_servers(policy, rule: str) -> list[int]:
    """Per placed job and slot of 40 slots of today's world (40 Philly jobs at 2x load on 16 nodes of 4 GPUs):
    the servers its workers span beyond the fewest that hold them."""
    config, _ = bound_case("today")
    trace = T.from_workload(philly.generate(40, load=2.0, seed=11), config.slot_seconds, seed=11)
    _, steps = run_slots(trace, policy, 40, dataclasses.replace(config, allreduce_placement=rule))
    return [len(set(alloc.worker_servers[j])) - -(-len(alloc.worker_servers[j]) // 4)
            for view, alloc in steps for j in range(len(view)) if alloc.worker_servers[j]]


def test_policies_that_place_a_job_task_by_task_pack_it_knowing_its_size():
    """Slurm as it is starts a job whole (AllocationBuilder.add_gang) and elastic grows a job to its efficient
    size one bundle at a time: both tell each worker's placement how many are still to come, so a packed job
    goes where all of them fit. (Told nothing, each worker took the fullest server it fitted on: Slurm's jobs
    then spanned 107 servers more than they needed over these slots, more than spread's 60.)"""
    assert sum(extra_servers(make_heuristic("slurm"), "spread")) > 20
    assert sum(extra_servers(make_heuristic("slurm"), "pack")) == 0
    spread, pack = (sum(extra_servers(make_heuristic("elastic"), rule)) for rule in ("spread", "pack"))
    assert pack < 0.6 * spread  # elastic's spare GPUs still go one at a time, by marginal gain


def bound_view(n: int):
    """A view of ``n`` all-reduce jobs of today's world, all arrived, on 4 idle servers of 4 GPUs."""
    config = world("today").sim_config()
    trace = T.from_workload(philly.generate(n, load=1.0, seed=3), config.slot_seconds, seed=3)
    state = dataclasses.replace(E.SimState.initial(n), slot=int(trace.arrival_slot.max()))
    view = E.view_of(trace, state, config)
    assert len(view) == n and view.allreduce.all()
    return dataclasses.replace(view, free=view.capacity[:4].copy(), capacity=view.capacity[:4].copy())


def test_a_job_split_over_servers_moves_to_fewer_when_it_restarts_anyway_or_when_a_move_buys_that():
    """Packed, an all-reduce job that ran on two servers (2 + 2 workers) while a whole server is free is
    placed on one server when it keeps its size (a restart that buys a faster placement) and when it is
    resized (a restart wherever it goes); a job already on the fewest servers stays where it was, and
    Slurm's own (`add_gang(stay=True)`: it never moves a running job) keeps it where it was."""
    view = dataclasses.replace(bound_view(3), prev_workers=np.array([4, 1, 0]),
                               prev_worker_servers=((0, 0, 1, 1), (2,), ()))
    b = AllocationBuilder(view)
    assert b.add_up_to(0, "worker", 4) == 4 and len(set(b.worker_servers[0])) == 1  # kept 4, moved
    assert b.add_up_to(1, "worker", 1) == 1 and b.worker_servers[1] == [2]  # already packed: stays
    b = AllocationBuilder(view)
    assert b.add_up_to(0, "worker", 3) == 3 and len(set(b.worker_servers[0])) == 1  # resized: placed afresh
    b = AllocationBuilder(view)
    assert b.add_gang(0, 4, 0, stay=True) and sorted(b.worker_servers[0]) == [0, 0, 1, 1]
    spread = AllocationBuilder(dataclasses.replace(view, allreduce_placement="spread"))
    assert spread.add_up_to(0, "worker", 4) == 4 and sorted(spread.worker_servers[0]) == [0, 0, 1, 1]


def test_jobs_grown_one_task_at_a_time_are_handed_over_on_the_fewest_servers():
    """Three all-reduce jobs that ran interleaved over all four servers; DRF gives them a worker each in turn
    (each first where it ran) until the 16 GPUs are taken: packed, each job's workers end on the fewest servers
    that hold them (re-placed as wholes when the builder hands over); spread, they stay interleaved."""
    view = dataclasses.replace(bound_view(3), prev_workers=np.array([4, 4, 4]),
                               prev_worker_servers=((0, 1, 2, 3),) * 3)
    for rule, most in (("pack", 2), ("spread", 4)):
        alloc = make_heuristic("drf")(dataclasses.replace(view, allreduce_placement=rule))
        assert sum(alloc.workers) == 16
        spans = [len(set(s)) for s in alloc.worker_servers]
        assert max(spans) == most, (rule, spans)


def test_a_bad_rule_is_refused_by_the_config_the_view_and_the_command():
    with pytest.raises(ValueError, match="allreduce_placement must be one of spread, pack, got 'tight'"):
        E.SimConfig(allreduce_placement="tight")
    with pytest.raises(ValueError, match="allreduce_placement must be one of spread, pack"):
        dataclasses.replace(make_view(["resnet-50"]), allreduce_placement="tight")
    res = CliRunner().invoke(cli, ["sim", "--allreduce-placement", "tight"])
    assert res.exit_code == 2 and "--allreduce-placement" in res.output


def test_dl2ctl_sim_runs_and_reports_the_rule():
    res = CliRunner().invoke(cli, ["sim", "--jobs", "8", "--cluster", "t4-16", "--allreduce-placement", "pack",
                                   "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["sim"]["allreduce_placement"] == "pack" and len(out["results"]) == 1
    assert world("today").sim_config().allreduce_placement == "pack"  # the default
    assert E.SimConfig().allreduce_placement == "pack"
