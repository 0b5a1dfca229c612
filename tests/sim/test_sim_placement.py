"""Cross-node traffic model, heterogeneous servers and DLTAP placement."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dl2d.core.contract import Allocation, SlotView
from dl2d.core.placement import place
from dl2d.policy.registry import make_heuristic
from dl2d.sim import engine as E
from dl2d.sim import hetero, network
from dl2d.sim.cluster import ClusterSpec
from dl2d.sim.trace import Trace, TraceConfig, generate
from dl2d.workload.jobtypes import (
    BATCHES_PER_EPOCH,
    JOB_TYPES,
    type_index,
)
from dl2d.workload.catalog import view_fields

RESNET = type_index("resnet-50")


def _trace(types, est=5.0, arrival=None):
    n = len(types)
    return Trace(np.array(arrival if arrival is not None else [0] * n, int),
                 np.array([type_index(t) for t in types], int), np.full(n, est), np.full(n, est), np.ones(n))


# ---------------------------------------------------------------- the traffic formula

def test_cross_pairs_dltap_figure_1():
    # DLTAP Fig. 1: s1..s3 = servers 1..3; 2 PS, 3 workers.
    # (a) wk1, wk3 on s1; ps1, ps2 on s2; wk2 on s3: all 6 worker-PS exchanges cross servers.
    assert network.cross_pairs([1, 3, 1], [2, 2]) == (6, 6)
    # (b) wk1, wk3, ps1 on s1; ps2 on s2; wk2 on s3: 4 cross, 2 stay inside s1.
    assert network.cross_pairs([1, 3, 1], [1, 2]) == (4, 6)
    assert network.cross_fraction([1, 3, 1], [1, 2]) == pytest.approx(4 / 6)
    assert network.cross_fraction([0, 0], [0]) == 0.0
    assert network.cross_fraction([], [0]) == 0.0 and network.cross_fraction([0], []) == 0.0


def test_traffic_and_step_time_by_hand():
    # LeNet5-BS of the paper: 3 M fp32 parameters = 12 MB; 10 worker steps move 2 * 12 * 10 = 240 MB,
    # of which 4/6 cross servers in scenario (b).
    total, cross = network.traffic_mb(12.0, 10, 4 / 6)
    assert total == pytest.approx(240.0) and cross == pytest.approx(160.0)
    # ResNet-50: compute 0.449 s, 102.2 MB, 91.875 MB/s between servers, 306.5 MB/s inside one.
    assert network.step_time_s(RESNET, 1.0) == pytest.approx(0.449 + 2 * 102.2 / 91.875)
    assert network.step_time_s(RESNET, 0.0) == pytest.approx(0.449 + 2 * 102.2 / 306.5)
    assert network.comm_speed_factor(RESNET, 0.0) == pytest.approx(1.0)
    # DLTAP's scenario change (6 -> 4 crossing exchanges) saves 19% of a ResNet-50 step (paper: 15%).
    saving = 1 - network.step_time_s(RESNET, 4 / 6) / network.step_time_s(RESNET, 1.0)
    assert saving == pytest.approx(0.194, abs=0.001)
    # staying inside a server is never slower, for every model
    for t in range(len(JOB_TYPES)):
        assert network.comm_speed_factor(t, np.linspace(0, 1, 5)).max() <= 1.0 + 1e-12


def _one_job_step(cfg, worker_servers, ps_servers):
    trace = _trace(["resnet-50"], est=1000.0)
    state = E.SimState.initial(1)
    alloc = Allocation(np.array([len(worker_servers)]), np.array([len(ps_servers)]),
                         (tuple(worker_servers),), (tuple(ps_servers),))
    return E.step(trace, state, alloc, cfg, np.random.default_rng(0))


def test_step_reports_traffic_and_charges_it_only_when_on():
    cfg = E.SimConfig(cluster=ClusterSpec(4), slot_noise=0.0)
    _, _, split = _one_job_step(cfg, [0], [1])
    _, _, local = _one_job_step(cfg, [0], [0])
    steps = split["trained"][0] * BATCHES_PER_EPOCH[RESNET]
    assert split["traffic_gb"] == pytest.approx(2 * 102.2 * steps / 1024)
    assert split["cross_node_gb"] == pytest.approx(split["traffic_gb"])
    assert local["cross_node_gb"] == 0.0 and local["traffic_gb"] > 0
    assert split["trained"][0] == local["trained"][0]  # off: placement does not change speed
    on = replace(cfg, cross_node_comm=True)
    _, _, split_on = _one_job_step(on, [0], [1])
    _, _, local_on = _one_job_step(on, [0], [0])
    assert local_on["trained"][0] == local["trained"][0]
    assert split_on["trained"][0] == pytest.approx(local["trained"][0] * network.comm_speed_factor(RESNET, 1.0))


# ---------------------------------------------------------------- defaults unchanged

def _key(result):
    s = result.summary()
    return {k: v for k, v in s.items() if k not in ("wall_s", "decision_ms")}, result.jct_slots.tolist()


@pytest.fixture(scope="module")
def small_trace():
    return generate(TraceConfig(num_jobs=16, max_arrivals_per_slot=4), seed=5)


@pytest.mark.parametrize("policy", ["drf", "optimus"])
def test_default_run_unchanged_with_features_explicitly_off(small_trace, policy):
    base = E.SimConfig(cluster=ClusterSpec(10))
    off = replace(base, cross_node_comm=False, server_speed_classes=(), speed_walk_sigma=0.0)
    # the heterogeneous code path with every server at speed 1 must not change a single draw either
    ones = replace(base, server_speed_classes=(1.0,), speed_walk_sigma=0.0, hetero_seed=9)
    a = E.run(small_trace, make_heuristic(policy), base, seed=2)
    for cfg in (off, ones):
        assert _key(E.run(small_trace, make_heuristic(policy), cfg, seed=2)) == _key(a)
    assert {"cross_node_gb_total", "cross_node_gb_per_slot", "cross_node_fraction"} <= set(a.summary())


# ---------------------------------------------------------------- heterogeneous servers

def test_base_speeds_seeded_and_reproducible():
    classes = hetero.THREE_GENERATIONS
    a = hetero.base_speeds(50, classes, seed=1)
    assert np.array_equal(a, hetero.base_speeds(50, classes, seed=1))
    assert not np.array_equal(a, hetero.base_speeds(50, classes, seed=2))
    assert set(np.unique(a)) <= set(classes) and len(np.unique(a)) == 3
    assert np.array_equal(hetero.base_speeds(7), np.ones(7))
    with pytest.raises(ValueError):
        hetero.base_speeds(3, (1.0, 0.0))


def test_speed_walk_reproducible_bounded_and_mean_reverting():
    x = np.zeros(20)
    xs = []
    for t in range(200):
        x = hetero.walk_step(x, t, sigma=0.2, reversion=0.1, bound=0.5, seed=3)
        xs.append(x)
    again = np.zeros(20)
    for t in range(200):
        again = hetero.walk_step(again, t, sigma=0.2, reversion=0.1, bound=0.5, seed=3)
    assert np.array_equal(x, again)
    xs = np.array(xs)
    assert np.abs(xs).max() <= 0.5 and xs.std() > 0.05
    assert np.array_equal(hetero.walk_step(x, 0, sigma=0.0), x)
    # bottleneck: the slowest worker's server
    assert hetero.bottleneck_speed(np.array([1.0, 0.3, 0.6]), [0, 2]) == 0.6
    assert hetero.bottleneck_speed(np.array([1.0, 0.3]), []) == 1.0


def test_heterogeneous_run_reproducible_and_slower(small_trace):
    base = E.SimConfig(cluster=ClusterSpec(10))
    het = replace(base, server_speed_classes=hetero.THREE_GENERATIONS, speed_walk_sigma=0.1, hetero_seed=4)
    a = E.run(small_trace, make_heuristic("fifo"), het, seed=2)
    b = E.run(small_trace, make_heuristic("fifo"), het, seed=2)
    assert _key(a) == _key(b)
    plain = E.run(small_trace, make_heuristic("fifo"), base, seed=2)
    assert a.avg_jct_slots > plain.avg_jct_slots  # two of the three classes are slower than the homogeneous server
    state = E.SimState.initial(len(small_trace))
    view = E.view_of(small_trace, state, het)
    assert np.array_equal(view.server_speed, hetero.base_speeds(10, hetero.THREE_GENERATIONS, 4))
    assert E.view_of(small_trace, state, base).server_speed is None


# ---------------------------------------------------------------- DLTAP

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dl2d.policy.seeds import dltap as P  # noqa: E402

SPEC3 = ClusterSpec(3)  # 2 GPUs, 8 cores, 48 GB per server
W_DEM = np.array(JOB_TYPES[RESNET].worker_demand)  # (1, 2, 8)
P_DEM = np.array(JOB_TYPES[RESNET].ps_demand)  # (0, 2, 4)


def test_dltap_priority_order_by_hand():
    cap = SPEC3.empty()
    free = cap.copy()
    free[2] = [1.0, 4.0, 24.0]  # server 2 half used: load 1.5, default score 1 - 1.5/3 = 0.5
    assert P.default_scores(free, cap) == pytest.approx([1.0, 1.0, 0.5])
    # two of the job's three workers on server 1, one on server 2: Eq. 3 gives 0, 2/3, 1/3
    assert P.aggregation_degree([1, 1, 2], 3) == pytest.approx([0, 2 / 3, 1 / 3])
    scores = P.dltap_scores(free, cap, [1, 1, 2], 3, weight=1.0)
    assert scores == pytest.approx([1.0, 5 / 3, 5 / 6])
    assert list(np.argsort(-scores)) == [1, 0, 2]  # load balancing alone would pick server 0
    assert P.dltap_scores(free, cap, [1, 1, 2], 3, weight=0.0) == pytest.approx([1.0, 1.0, 0.5])


def test_dltap_place_job_by_hand():
    # 3 workers + 2 PS of ResNet-50 on 3 idle servers.
    # Workers by load balancing: servers 0, 1, 2 (ties -> lowest index). Each server then has load
    # 1/2 + 2/8 + 8/48 = 0.9167 (score 0.6944) plus aggregation 1/3: PS 1 -> server 0 (tie);
    # server 0 then scores 1 - (0.5 + 0.5 + 0.25)/3 + 1/3 = 0.9167 < 1.0278, so PS 2 -> server 1.
    free = SPEC3.empty()
    w, p = P.place_job(free, SPEC3.empty(), W_DEM, P_DEM, 3, 2, workers_first=True)
    assert (w, p) == ([0, 1, 2], [0, 1])
    assert network.cross_pairs(w, p) == (4, 6)  # DLTAP's "ideal" scenario
    assert free[0] == pytest.approx([1.0, 4.0, 36.0])
    # our packing extension: worker 2 joins worker 1 (score 0.694 + 1 > 1.0), worker 3 finds no GPU there;
    # PS 1: server 0 scores 1 - 1.8333/3 + 2/3 = 1.0556 > server 1's 1.0278; PS 2: server 0 drops to
    # 0.9444, server 1 stays 1.0278.
    w, p = P.place_job(SPEC3.empty(), SPEC3.empty(), W_DEM, P_DEM, 3, 2, pack_workers=True, workers_first=True)
    assert (w, p) == ([0, 0, 1], [0, 1])
    assert network.cross_pairs(w, p) == (3, 6)


def test_dltap_interleaved_by_hand():
    # default order worker, PS, worker, PS, worker: PS 1 joins worker 1 on server 0 (0.694 + 1/1 > 1.0);
    # worker 2 -> server 1 (least loaded); PS 2: server 0 scores 1 - 1.25/3 + 1/2 = 1.083, server 1
    # 1 - 0.9167/3 + 1/2 = 1.194 -> server 1; worker 3 -> server 2.
    w, p = P.place_job(SPEC3.empty(), SPEC3.empty(), W_DEM, P_DEM, 3, 2)
    assert (w, p) == ([0, 1, 2], [0, 1])
    # weight 0 is plain load balancing: PS 1 avoids the loaded server 0
    w, p = P.place_job(SPEC3.empty(), SPEC3.empty(), W_DEM, P_DEM, 1, 1, weight=0.0)
    assert (w, p) == ([0], [1])


def test_dltap_job_that_cannot_train_gives_back():
    free = SPEC3.empty()
    free[:, 1] = [2.0, 0.0, 0.0]  # 2 free cores in the cluster: the worker takes them, no PS fits anywhere
    before = free.copy()
    w, p = P.place_job(free, SPEC3.empty(), W_DEM, P_DEM, 1, 1)
    assert (w, p) == ([], []) and np.array_equal(free, before)


JOBS = st.lists(st.tuples(st.sampled_from(range(len(JOB_TYPES))), st.integers(0, 6), st.integers(0, 6)),
                min_size=1, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(servers=st.integers(1, 6), jobs=JOBS, used=st.lists(st.floats(0, 1), min_size=6, max_size=6),
       weight=st.sampled_from([0.0, 1.0, 5.0]), pack=st.booleans(), first=st.booleans())
def test_dltap_never_exceeds_capacity(servers, jobs, used, weight, pack, first):
    spec = ClusterSpec(servers)
    cap = spec.empty()
    free = cap * (1 - np.array(used[:servers]))[:, None]
    n = len(jobs)
    view = SlotView(0, np.arange(n), np.array([j[0] for j in jobs]), np.zeros(n, int), np.zeros(n, int),
                      np.zeros(n), np.ones(n), np.zeros(n, int), np.zeros(n, int), free, cap, 16, 16,
                    **view_fields([j[0] for j in jobs], 16, 16))
    want_w, want_p = np.array([j[1] for j in jobs]), np.array([j[2] for j in jobs])
    a = P.dltap_allocation(view, want_w, want_p, weight, pack, workers_first=first)
    usage, w, p = place(view, a)  # CapacityError on any overflow
    assert np.all(usage <= free + 1e-6)
    assert np.all(w <= want_w) and np.all(p <= want_p)
    assert np.all((w > 0) == (p > 0))  # a job holds both kinds of task or nothing


def test_dltap_wrapper_in_a_run_cuts_cross_node_traffic(small_trace):
    cfg = E.SimConfig(cluster=ClusterSpec(10), cross_node_comm=True)
    plain = E.run(small_trace, make_heuristic("fifo"), cfg, seed=2).summary()
    wrapped = P.with_dltap(make_heuristic("fifo"), pack_workers=True)
    assert wrapped.name == "fifo+dltap-pack"
    packed = E.run(small_trace, wrapped, cfg, seed=2).summary()
    assert packed["cross_node_fraction"] < plain["cross_node_fraction"]


def test_dltap_trim_counts_only_the_tasks_placed():
    """trim=True (the daemon's): a job DLTAP cannot place keeps no counts; trim=False keeps the inner ones."""
    spec = ClusterSpec(1)
    cap = spec.empty()
    view = SlotView(0, np.arange(2), np.zeros(2, int), np.zeros(2, int), np.zeros(2, int), np.zeros(2),
                      np.ones(2), np.zeros(2, int), np.zeros(2, int), cap.copy(), cap, 16, 16,
                      **view_fields([0, 0], 16, 16))
    inner = lambda v: Allocation(np.array([1, 3]), np.array([1, 0]))  # job 1 has no PS: it cannot train
    kept = P.with_dltap(inner)(view)
    trimmed = P.with_dltap(inner, trim=True)(view)
    assert list(kept.workers) == [1, 3] and list(kept.ps) == [1, 0]
    assert list(trimmed.workers) == [1, 0] and list(trimmed.ps) == [1, 0]
    assert trimmed.worker_servers == ((0,), ()) and trimmed.ps_servers == ((0,), ())
