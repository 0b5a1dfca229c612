"""The slot engine: placement, one step (speed, noise, interference, resize overhead, DL2's reward), whole
runs and their metrics on cases worked out by hand, determinism under a seed, and a property test that no
baseline ever exceeds the cluster over whole simulations."""
from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit.sim import make_trace

from dl2d.core.contract import Allocation, CapacityError
from dl2d.core.placement import Placer, place
from dl2d.policy.baselines import heuristics as B
from dl2d.policy import registry
from dl2d.policy.registry import make_heuristic
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.sim.cluster import ClusterSpec, preset
from dl2d.workload.jobtypes import JOB_TYPES, TYPE_NAMES
from dl2d.workload.speed import measured_table

TABLE = measured_table()
QUIET = dict(slot_noise=0.0)  # no per-slot noise: speeds exactly from the table


def per_slot(name, p, w, slot_seconds=1200.0):
    """Epochs a job of this type trains in one slot with (p, w), no noise, speed factor 1."""
    t = TYPE_NAMES.index(name)
    return TABLE[t, p, w] * slot_seconds / JOB_TYPES[t].batches_per_epoch


def fifo():
    return make_heuristic("fifo")


# ---------------------------------------------------------------- placement

def test_placer_uses_the_least_loaded_server_and_never_overfills():
    spec = ClusterSpec(3)
    pl = Placer(spec.empty(), spec.server_capacity)
    worker, ps = (1.0, 2.0, 8.0), (0.0, 2.0, 4.0)
    assert [pl.add(worker) for _ in range(3)] == [0, 1, 2]  # ties: lowest index
    assert pl.add(ps) == 0  # all equally loaded again
    assert pl.add(worker) == 1  # server 0 carries a worker and a PS now
    assert pl.add(worker) == 2
    assert pl.add(worker) == 0 and pl.add(worker) == -1  # 6 GPUs used, 7th refused
    assert np.all(pl.free >= 0) and pl.free[:, 0].sum() == 0
    pl.remove(1, worker)
    assert pl.add(worker) == 1


def test_add_bundle_is_all_or_nothing():
    spec = ClusterSpec(1, gpus=1, cpus=3, mem_gb=48)
    pl = Placer(spec.empty(), spec.server_capacity)
    assert pl.add_bundle((1, 2, 8), (0, 2, 4)) is None  # the worker fits, the PS then does not
    assert pl.free.tolist() == [[1, 3, 48]]
    assert pl.add_bundle((1, 2, 8)) == [0]


def test_least_loaded_placement_can_strand_capacity():
    # A documented property of DL2's default placement: bundles split across servers, so 4 servers that
    # could hold 8 bundles take 7 with FIFO (the 8th worker finds no server with a GPU and 2 free cores).
    from testkit.sim import make_view
    alloc = B.fifo(make_view(["resnet-50"], servers=4))
    assert alloc.workers.tolist() == [7]


def test_engine_placement_drops_what_fits_nowhere_and_counts_it():
    tr = make_trace([(0, "resnet-50", 50)])
    cfg = E.SimConfig(cluster=ClusterSpec(1), **QUIET)
    state = E.SimState.initial(1)
    nxt, _, info = E.step(tr, state, Allocation(np.array([5]), np.array([1])), cfg, np.random.default_rng(0))
    assert info["workers"].tolist() == [2] and info["ps"].tolist() == [1]  # 2 GPUs; then 1 core left
    assert info["unplaced"] == 3
    assert nxt.workers.tolist() == [2] and nxt.ps.tolist() == [1]
    assert np.all(info["utilisation"] <= 1) and info["utilisation"][0] == 1.0


def test_given_servers_that_overflow_raise_capacity_error():
    tr = make_trace([(0, "resnet-50", 50)])
    cfg = E.SimConfig(cluster=ClusterSpec(1))
    alloc = Allocation(np.array([3]), np.array([0]), worker_servers=((0, 0, 0),), ps_servers=((),))
    with pytest.raises(CapacityError, match=r"overflows server\(s\) \[0\]"):
        E.step(tr, E.SimState.initial(1), alloc, cfg, np.random.default_rng(0))


@pytest.mark.parametrize("w, p", [([-1], [1]), ([17], [1]), ([1], [17]), ([1, 1], [1, 1])])
def test_allocations_outside_the_limits_are_rejected(w, p):
    tr = make_trace([(0, "wlm", 5)])
    with pytest.raises(ValueError, match="allocation"):
        E.step(tr, E.SimState.initial(1), Allocation(np.array(w), np.array(p)), E.SimConfig(cluster=preset("tiny")),
               np.random.default_rng(0))


# ---------------------------------------------------------------- one step: speed, reward, noise

def test_one_slot_trains_table_speed_times_interference_and_reward_is_dl2_eq1():
    # two jobs: est 10 / true 10 and est 20 / true 30, speed factors 1 and 0.5; reward = sum(trained / est)
    tr = make_trace([(0, "resnet-50", 10), (0, "dssm", 20, 30)], speed_factor=[1.0, 0.5])
    cfg = E.SimConfig(cluster=ClusterSpec(4), **QUIET)
    alloc = Allocation(np.array([2, 1]), np.array([1, 3]))
    nxt, reward, info = E.step(tr, E.SimState.initial(2), alloc, cfg, np.random.default_rng(0))
    e0, e1 = per_slot("resnet-50", 1, 2), 0.5 * per_slot("dssm", 3, 1)
    assert info["trained"] == pytest.approx([e0, e1])
    assert nxt.epochs_done == pytest.approx([e0, e1])
    assert reward == pytest.approx(e0 / 10 + e1 / 20)
    assert nxt.slot == 1 and nxt.slots_run.tolist() == [1, 1] and np.all(np.isnan(nxt.finish_time))


def test_the_view_carries_each_jobs_measured_speed_factor_as_the_daemon_measures_it():
    """Measured / predicted speed (the table's at the pair it ran), the mean of its last SPEED_FACTOR_SLOTS full
    slots: the hidden interference where there is no noise; not measured before it ran, in a slot it ran
    nothing, or in the slot it finished."""
    from dl2d.core.contract import SPEED_FACTOR_SLOTS

    e = per_slot("wlm", 1, 1)
    tr = make_trace([(0, "resnet-50", 10_000), (0, "dssm", 10_000), (0, "wlm", 1.5 * e)],
                    speed_factor=[1.0, 0.5, 1.0])
    cfg = E.SimConfig(cluster=ClusterSpec(4), **QUIET)
    state = E.SimState.initial(3)
    assert np.all(np.isnan(E.view_of(tr, state, cfg).job_speed_factor))
    alloc = Allocation(np.array([2, 1, 1]), np.array([1, 3, 1]))
    for _ in range(2):
        state, _, _ = E.step(tr, state, alloc, cfg, np.random.default_rng(0))
    view = E.view_of(tr, state, cfg)
    # the wlm job finished in its second slot, no longer in view: its first, full, slot was measured, the second not
    assert view.job_speed_factor == pytest.approx([1.0, 0.5]) and len(view) == 2
    assert state.speed_factors[2, -1] == pytest.approx(1.0) and np.all(np.isnan(state.speed_factors[2, :-1]))
    # a slot with nothing for the dssm job measures nothing; the mean is over the measured slots
    state, _, _ = E.step(tr, state, Allocation(np.array([2, 0]), np.array([1, 0])), cfg, np.random.default_rng(0))
    assert E.view_of(tr, state, cfg).job_speed_factor == pytest.approx([1.0, 0.5])
    # with noise: the mean of the last slots' factor x noise, within the noise's range
    noisy = E.SimConfig(cluster=ClusterSpec(4), slot_noise=0.1)
    state = E.SimState.initial(3)
    for k in range(SPEED_FACTOR_SLOTS + 2):
        n = len(E.view_of(tr, state, noisy))
        state, _, _ = E.step(tr, state, Allocation(np.array([2, 1, 1][:n]), np.array([1, 3, 1][:n])), noisy,
                             np.random.default_rng(k))
    f = E.view_of(tr, state, noisy).job_speed_factor
    assert f[1] != pytest.approx(0.5) and 0.45 <= f[1] <= 0.55 and 0.9 <= f[0] <= 1.1


def test_a_job_finishing_mid_slot_gets_a_fractional_finish_time_and_only_its_remaining_epochs():
    e = per_slot("wlm", 1, 1)
    tr = make_trace([(0, "wlm", 0.25 * e)])
    cfg = E.SimConfig(cluster=ClusterSpec(1), **QUIET)
    nxt, reward, info = E.step(tr, E.SimState.initial(1), Allocation(np.array([1]), np.array([1])), cfg,
                               np.random.default_rng(0))
    assert nxt.finish_time[0] == pytest.approx(0.25)
    assert info["trained"][0] == pytest.approx(0.25 * e) and reward == pytest.approx(1.0)
    assert nxt.done()


def test_a_job_without_workers_or_ps_trains_nothing():
    tr = make_trace([(0, "wlm", 5)])
    cfg = E.SimConfig(cluster=ClusterSpec(1), **QUIET)
    for w, p in ((0, 3), (3, 0), (0, 0)):
        nxt, reward, _ = E.step(tr, E.SimState.initial(1), Allocation(np.array([w]), np.array([p])), cfg,
                                np.random.default_rng(0))
        assert nxt.epochs_done[0] == 0 and reward == 0


def test_slot_noise_is_bounded_and_seeded():
    tr = make_trace([(0, "seq2seq", 1000)] * 50)
    cfg = E.SimConfig(cluster=ClusterSpec(100), slot_noise=0.1)
    alloc = Allocation(np.ones(50, int), np.ones(50, int))
    base = per_slot("seq2seq", 1, 1)
    runs = [E.step(tr, E.SimState.initial(50), alloc, cfg, np.random.default_rng(s))[2]["trained"] for s in (1, 1, 2)]
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], runs[2])
    ratio = runs[0] / base
    assert np.all(ratio >= 0.9 - 1e-12) and np.all(ratio <= 1.1 + 1e-12) and np.std(ratio) > 0.02


def test_resize_overhead_costs_training_time_only_when_the_allocation_changes():
    tr = make_trace([(0, "wlm", 1000)])
    cfg = E.SimConfig(cluster=ClusterSpec(1), resize_overhead_s=300, **QUIET)
    alloc = Allocation(np.array([1]), np.array([1]))
    s1, _, i1 = E.step(tr, E.SimState.initial(1), alloc, cfg, np.random.default_rng(0))  # 0 -> 1: a change
    s2, _, i2 = E.step(tr, s1, alloc, cfg, np.random.default_rng(0))  # unchanged
    assert i1["resized"] == 1 and i2["resized"] == 0
    assert i1["trained"][0] == pytest.approx(0.75 * i2["trained"][0])


def test_advance_does_not_modify_its_input_state():
    tr = make_trace([(0, "wlm", 5), (0, "vgg-16", 5)])
    state = E.SimState.initial(2)
    before = {k: np.copy(v) for k, v in vars(state).items() if isinstance(v, np.ndarray)}
    nxt, _, _ = E.advance(state, tr, np.array([0, 1]), np.array([1.0, 10.0]))
    for k, v in before.items():
        assert np.array_equal(getattr(state, k), v, equal_nan=True), k
    assert nxt.epochs_done.tolist() == [1.0, 5.0] and nxt.finish_time[1] == pytest.approx(0.5)


# ---------------------------------------------------------------- whole runs and metrics

def test_a_lone_job_runs_for_the_hand_computed_time():
    e = per_slot("resnet-50", 2, 2)  # FIFO on one server: 2 bundles
    tr = make_trace([(3, "resnet-50", 2.5 * e)])
    res = E.run(tr, fifo(), E.SimConfig(cluster=ClusterSpec(1), **QUIET))
    assert res.jct_slots.tolist() == pytest.approx([2.5])
    assert res.makespan_slots == pytest.approx(2.5)
    assert res.gpu_util.tolist() == [1.0, 1.0, 1.0] and res.cpu_util.tolist() == [1.0, 1.0, 1.0]
    assert res.rewards == pytest.approx([0.4, 0.4, 0.2])
    assert res.avg_jct_hours == pytest.approx(2.5 * 1200 / 3600)


def test_metrics_of_two_jobs_worked_out_by_hand():
    # FIFO on one server: the resnet-50 job (arrives at 0) takes every GPU and core and ends at 1.5; the
    # CPU-only dssm job (arrives at 1) waits for the slot boundary at 2 and needs 2 slots: ends at 4.
    ea, eb = per_slot("resnet-50", 2, 2), per_slot("dssm", 2, 2)
    tr = make_trace([(0, "resnet-50", 1.5 * ea), (1, "dssm", 4 * eb, 2 * eb)])  # dssm estimate: twice its need
    res = E.run(tr, fifo(), E.SimConfig(cluster=ClusterSpec(1), **QUIET))
    assert res.jct_slots.tolist() == pytest.approx([1.5, 3.0])
    assert res.avg_jct_slots == pytest.approx(2.25)
    assert res.makespan_slots == pytest.approx(4.0)
    assert res.gpu_util.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert res.cpu_util.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert res.per_type_jct_hours() == pytest.approx({"resnet-50": 0.5, "dssm": 1.0})
    assert res.rewards.sum() == pytest.approx(1.0 + 0.5)  # sum of true / estimated epochs
    s = res.summary()
    assert s["avg_jct_hours"] == 0.75 and s["makespan_hours"] == pytest.approx(4 / 3, abs=1e-3)
    assert s["gpu_util"] == 0.5 and s["jobs"] == 2 and s["unplaced_tasks"] == 0
    assert set(s) >= {"policy", "avg_jct_slots", "makespan_slots", "cpu_util", "total_reward", "resizes",
                      "decision_ms", "wall_s", "per_type_jct_hours"}


def test_srtf_beats_fifo_on_avg_jct_when_a_long_job_arrives_first():
    e = per_slot("resnet-50", 2, 2)
    tr = make_trace([(0, "resnet-50", 10 * e), (0, "resnet-50", e)])
    cfg = E.SimConfig(cluster=ClusterSpec(1), **QUIET)
    f, s = E.run(tr, fifo(), cfg), E.run(tr, make_heuristic("srtf"), cfg)
    assert f.jct_slots.tolist() == pytest.approx([10, 11])
    assert s.jct_slots.tolist() == pytest.approx([11, 1])
    assert s.makespan_slots == pytest.approx(f.makespan_slots)


def test_same_seed_same_result_other_seed_other_result():
    tr = T.generate(T.TraceConfig(num_jobs=12, max_arrivals_per_slot=3), seed=4)
    cfg = E.SimConfig(cluster=preset("tiny"))
    strip = lambda r: {k: v for k, v in r.summary().items() if k not in ("wall_s", "decision_ms")}  # noqa: E731
    a, b, c = (E.run(tr, make_heuristic("drf"), cfg, seed=s) for s in (7, 7, 8))
    assert np.array_equal(a.jct_slots, b.jct_slots) and np.array_equal(a.rewards, b.rewards)
    assert strip(a) == strip(b)
    assert not np.array_equal(a.jct_slots, c.jct_slots)


def test_a_starving_scheduler_is_stopped():
    tr = make_trace([(0, "wlm", 5)])
    idle = lambda v: Allocation(np.zeros(len(v), int), np.zeros(len(v), int))  # noqa: E731
    with pytest.raises(RuntimeError, match="did not finish within 20 slots"):
        E.run(tr, idle, E.SimConfig(cluster=ClusterSpec(1), max_slots=20))


def test_sim_config_rejects_bad_values():
    for kwargs in ({"slot_seconds": 0}, {"slot_noise": 1.0}, {"max_workers": 0},
                   {"resize_overhead_s": -1.0}, {"resize_overhead_s": float("inf")},
                   {"shared_node_slowdown": 1.0}):
        with pytest.raises(ValueError):
            E.SimConfig(**kwargs)
    with pytest.raises(ValueError, match="unknown cluster preset 'huge'"):
        preset("huge")
    with pytest.raises(ValueError, match="at least one server"):
        ClusterSpec(0)


# ---------------------------------------------------------------- property: whole runs within capacity

@st.composite
def small_runs(draw):
    n = draw(st.integers(1, 6))
    jobs = sorted((draw(st.integers(0, 4)), draw(st.sampled_from(TYPE_NAMES)), draw(st.floats(0.2, 6.0)),
                   draw(st.floats(0.2, 6.0))) for _ in range(n))
    spec = ClusterSpec(draw(st.integers(1, 3)), gpus=draw(st.sampled_from([1.0, 2.0, 4.0])),
                       cpus=draw(st.sampled_from([4.0, 8.0])))
    return make_trace(jobs), spec, draw(st.integers(0, 2**16))


@settings(max_examples=25, deadline=None)
@given(small_runs())
def test_no_baseline_exceeds_capacity_over_a_whole_run(case):
    tr, spec, seed = case
    cfg = E.SimConfig(cluster=spec, max_workers=4, max_ps=4)
    for name in registry.names(heuristic=True):
        policy = make_heuristic(name)
        usage_seen = []

        def checked(view, policy=policy, usage_seen=usage_seen):
            alloc = policy(view)
            usage, _, _ = place(view, alloc)
            assert np.all(usage <= view.capacity + 1e-9), name
            usage_seen.append(usage.sum(axis=0))
            return alloc

        res = E.run(tr, checked, cfg, seed=seed)
        assert not np.any(np.isnan(res.jct_slots)) and np.all(res.jct_slots > 0), name
        assert np.all(res.gpu_util <= 1 + 1e-9) and np.all(res.cpu_util <= 1 + 1e-9), name
        assert res.unplaced == 0, name
        # DL2 eq. 1 summed over the run: each job contributes true / estimated epochs
        assert res.rewards.sum() == pytest.approx(np.sum(tr.true_epochs / tr.est_epochs)), name


def test_one_slot_of_a_scheduler_is_its_decision_on_the_view_then_the_step():
    """run_slot = the view, the scheduler's allocation on it, step with that view: the same state, reward and
    progress as step building the view itself; no job in the system asks nothing of the scheduler."""
    tr = make_trace([(0, "resnet-50", 10_000), (1, "dssm", 10_000)])
    cfg = E.SimConfig(cluster=ClusterSpec(4), slot_noise=0.1)
    asked = []

    def scheduler(view):
        asked.append(len(view))
        return fifo()(view)

    state = E.SimState.initial(2)
    for _ in range(3):
        nxt, reward, info = E.run_slot(tr, state, scheduler, cfg, np.random.default_rng(7))
        alone, alone_reward, alone_info = E.step(tr, state, info["allocation"], cfg, np.random.default_rng(7))
        assert reward == alone_reward and np.array_equal(nxt.epochs_done, alone.epochs_done)
        assert np.array_equal(info["trained"], alone_info["trained"]) and info["decide_s"] >= 0
        assert list(info["view"].job_ids) == list(E.view_of(tr, state, cfg).job_ids)
        state = nxt
    assert asked == [1, 2, 2]
    empty = E.run_slot(make_trace([(5, "dssm", 10)]), E.SimState.initial(1), scheduler, cfg,
                       np.random.default_rng(0))
    assert len(empty[2]["allocation"].workers) == 0 and asked == [1, 2, 2]
