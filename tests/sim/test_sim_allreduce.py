"""All-reduce jobs in the simulator: measured speed by placement, restarts, shared servers, mixed traces."""
from __future__ import annotations

import numpy as np
import pytest

from testkit.policy import build_any, world_for

from dl2d.core.contract import Allocation
from dl2d.policy import registry
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.sim.cluster import ClusterSpec
from dl2d.workload import catalog, philly
from dl2d.workload.workloads import WorkloadJob, packaged_workload

NODES = ClusterSpec(4, gpus=4, cpus=48, mem_gb=192)


def allreduce_trace(*jobs, factor=None):
    """jobs: (arrival_slot, model, GPUs asked, total batch)."""
    wl = [WorkloadJob(f"j{i}", a * 60.0, m, g, b) for i, (a, m, g, b) in enumerate(jobs)]
    tr = T.from_workload(wl, 60.0, interference_sigma=0.0)
    if factor is not None:
        tr = T.Trace(tr.arrival_slot, tr.type_idx, tr.est_epochs, tr.true_epochs, np.asarray(factor, float),
                     batch_size=tr.batch_size, requested=tr.requested)
    return tr


def cfg(**kw):
    return E.SimConfig(cluster=kw.pop("cluster", NODES), slot_seconds=60.0, slot_noise=0.0, max_workers=16,
                       max_ps=4, **kw)


def one_slot(trace, state, servers, config):
    alloc = Allocation.from_servers(servers, [()] * len(servers))
    return E.step(trace, state, alloc, config, np.random.default_rng(0))


def test_a_job_trains_at_the_measured_speed_of_its_placement_and_packed_beats_spread():
    tr = allreduce_trace((0, "bert", 2, 12))
    state = E.SimState.initial(1)
    packed, _, _ = one_slot(tr, state, [(0, 0)], cfg())
    spread, _, _ = one_slot(tr, state, [(0, 1)], cfg())
    rate = catalog.allreduce_epoch_rate("bert", 12.0, (2,))
    assert packed.epochs_done[0] == pytest.approx(rate * 60.0)
    assert spread.epochs_done[0] == pytest.approx(catalog.allreduce_epoch_rate("bert", 12.0, (1, 1)) * 60.0)
    assert packed.epochs_done[0] > 1.3 * spread.epochs_done[0]  # bert: 26 vs 16 samples/s measured


def test_a_job_that_moves_or_resizes_loses_the_restart_time_and_a_long_restart_carries_over():
    tr = allreduce_trace((0, "cifar10", 1, 128))
    c = cfg(resize_overhead_s=90.0)
    rate = catalog.allreduce_epoch_rate("cifar10", 128.0, (1,))
    s1, _, info = one_slot(tr, E.SimState.initial(1), [(0,)], c)  # start: 90 s to lose, 60 this slot
    assert info["resized"] == 1 and s1.epochs_done[0] == 0 and s1.restart_debt[0] == 30.0
    s2, _, info = one_slot(tr, s1, [(0,)], c)  # the rest of the restart, then 30 s of training
    assert info["resized"] == 0 and s2.epochs_done[0] == pytest.approx(rate * 30.0)
    s3, _, _ = one_slot(tr, s2, [(0,)], c)  # kept: a full slot
    assert s3.epochs_done[0] - s2.epochs_done[0] == pytest.approx(rate * 60.0)
    s4, _, info = one_slot(tr, s3, [(1,)], c)  # same size, another server: a restart as well
    assert info["resized"] == 1 and s4.epochs_done[0] == s3.epochs_done[0]


def test_multi_server_jobs_sharing_a_server_are_slowed_by_the_setting():
    tr = allreduce_trace((0, "cifar10", 2, 256), (0, "cifar10", 2, 256))
    apart = [(0, 1), (2, 3)]
    shared = [(0, 1), (0, 1)]
    for slowdown in (0.0, 0.25):
        c = cfg(shared_node_slowdown=slowdown)
        a, _, _ = one_slot(tr, E.SimState.initial(2), apart, c)
        b, _, _ = one_slot(tr, E.SimState.initial(2), shared, c)
        assert b.epochs_done == pytest.approx(a.epochs_done * (1 - slowdown))
    packed = [(0, 0), (0, 0)]  # two single-server jobs on one server: no network to share
    c = cfg(shared_node_slowdown=0.25)
    p, _, _ = one_slot(tr, E.SimState.initial(2), packed, c)
    assert p.epochs_done[0] == pytest.approx(catalog.allreduce_epoch_rate("cifar10", 256.0, (2,)) * 60.0)


def test_the_hidden_interference_factor_scales_an_allreduce_job():
    tr = allreduce_trace((0, "ncf", 1, 256), (0, "ncf", 1, 256), factor=[1.0, 0.5])
    s, _, _ = one_slot(tr, E.SimState.initial(2), [(0,), (1,)], cfg())
    assert s.epochs_done[1] == pytest.approx(0.5 * s.epochs_done[0])


def test_parameter_servers_for_an_allreduce_job_are_refused():
    tr = allreduce_trace((0, "ncf", 1, 256))
    with pytest.raises(ValueError, match="all-reduce"):
        E.step(tr, E.SimState.initial(1), Allocation(np.array([1]), np.array([1])), cfg(), np.random.default_rng(0))


def mixed_trace(seed=0) -> T.Trace:
    ps = T.generate(T.TraceConfig(num_jobs=12, max_arrivals_per_slot=3), seed=seed)
    ar = T.from_workload(philly.generate(12, load=2.0, cluster_gpus=16, seed=seed, max_gpus=8), 1200.0, seed=seed)
    rows = np.argsort(np.concatenate([ps.arrival_slot, ar.arrival_slot]), kind="stable")
    cat = lambda a, b: np.concatenate([a, b])[rows]  # noqa: E731
    return T.Trace(cat(ps.arrival_slot, ar.arrival_slot), cat(ps.type_idx, ar.type_idx),
                   cat(ps.est_epochs, ar.est_epochs), cat(ps.true_epochs, ar.true_epochs),
                   cat(ps.speed_factor, ar.speed_factor), batch_size=cat(ps.batch_size, ar.batch_size),
                   requested=cat(ps.requested, ar.requested))


# The planning room's policies plan the DL2 paper's world of PS jobs alone and refuse any other (their own tests:
# tests/policy/test_lp_lookahead.py, test_plan_net.py): a trace with all-reduce jobs is outside what they run.
@pytest.mark.parametrize("name", [n for n in registry.names() if world_for(n) == "today"])
def test_every_policy_runs_a_mixed_trace_within_capacity(name):
    tr = mixed_trace()
    config = E.SimConfig(cluster=ClusterSpec(4, gpus=4, cpus=48, mem_gb=192), resize_overhead_s=30.0,
                         shared_node_slowdown=0.1)
    policy = build_any(name)
    state = E.SimState.initial(len(tr))
    state = E.replace(state, slot=int(tr.arrival_slot.min()))
    rng = np.random.default_rng(0)
    cap = config.cluster.empty()
    for _ in range(5000):
        if state.done():
            break
        view = E.view_of(tr, state, config)
        alloc = policy(view)
        assert np.all(np.asarray(alloc.ps)[view.allreduce] == 0), "PS given to an all-reduce job"
        state, _, info = E.step(tr, state, alloc, config, rng)
        used = np.zeros_like(cap)
        for j in range(len(view)):
            for s in info["worker_servers"][j]:
                used[s] += view.worker_demand[j]
            for s in info["ps_servers"][j]:
                used[s] += view.ps_demand[j]
        assert np.all(used <= cap + 1e-9)
    assert state.done(), f"{name} did not finish the mixed trace"


def test_packaged_workloads_become_traces():
    jobs = packaged_workload(3, "workloads")
    tr = T.from_workload(jobs, 60.0, seed=1)
    assert len(tr) == 160 and tr.allreduce.all()
    assert list(tr.requested) == [j.gpus for j in sorted(jobs, key=lambda j: j.arrival_s)]
    seconds = np.array([j.arrival_s for j in sorted(jobs, key=lambda j: j.arrival_s)])
    # seen at the slot boundary at or after its submission, its JCT counted from the submission
    assert np.all(tr.arrival_slot == np.ceil(seconds / 60)) and np.allclose(tr.submitted, seconds / 60)
    assert set(tr.est_epochs) <= {float(catalog.epochs_to_converge(m)) for m in catalog.ALLREDUCE_MODELS}


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_mixed_traces_round_trip_through_files(tmp_path, suffix):
    tr = mixed_trace(seed=3)
    path = tmp_path / f"t{suffix}"
    T.save(tr, path)
    back = T.load(path)
    for field in ("arrival_slot", "type_idx", "est_epochs", "true_epochs", "speed_factor", "batch_size",
                  "requested"):
        assert np.array_equal(getattr(back, field), getattr(tr, field)), field
