"""Dual-agent scheduler: RWGP kernel and posterior on hand-checked numbers, and the agents in the simulator."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import expm

from dl2d.core.contract import SlotView
from dl2d.policy.seeds import dual_agent as D
from dl2d.sim import engine as E
from dl2d.sim import hetero
from dl2d.sim.cluster import ClusterSpec
from dl2d.sim.trace import TraceConfig, generate
from dl2d.workload.catalog import view_fields
from dl2d.workload.jobtypes import type_index


def test_matern52_by_hand():
    k = D.matern52(np.array([[0.0], [1.0], [2.0]]), np.array([[0.0]]), lengthscale=1.0)[:, 0]
    s = np.sqrt(5.0)
    assert k[0] == 1.0
    assert k[1] == pytest.approx((1 + s + 5 / 3) * np.exp(-s))  # 0.52399
    assert k[1] == pytest.approx(0.523994, abs=1e-6)
    assert k[2] == pytest.approx((1 + 2 * s + 20 / 3) * np.exp(-2 * s))
    # lengthscale 2 at distance 2 equals lengthscale 1 at distance 1
    assert D.matern52([[2.0]], [[0.0]], 2.0)[0, 0] == pytest.approx(k[1])


def test_random_walk_kernel_by_hand_and_against_expm():
    # 1-node graphs: P_x = [a b], k = exp(beta a b)
    assert D.rw_kernel(np.array([[0.5]]), np.array([[0.4]]), beta=2.0) == pytest.approx(np.exp(0.4))
    # identity graphs on 2 nodes: P_x = I_4, k = sum of exp(beta I_4) = 4 e^beta
    assert D.rw_kernel(np.eye(2), np.eye(2), beta=1.0) == pytest.approx(4 * np.e)
    rng = np.random.default_rng(0)
    f1, f2 = rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
    p1, p2 = D.machine_graph(f1), D.machine_graph(f2)
    direct = expm(0.7 * np.kron(p1, p2)).sum()  # Eq. 12 in Proposition 2's closed form, the slow way
    assert D.rw_kernel(p1, p2, beta=0.7) == pytest.approx(direct, rel=1e-9)
    s1, s2 = D.Spectrum.of(p1), D.Spectrum.of(p2)
    assert D.rw_similarity(s1, s1) == pytest.approx(1.0)
    assert D.rw_similarity(s1, s2) == pytest.approx(D.rw_similarity(s2, s1))
    assert 0 < D.rw_similarity(s1, s2) < 1


def test_gp_posterior_by_hand():
    mean, var = D.gp_posterior(np.array([[1.0]]), np.array([0.5]), 1.0, np.array([2.0]), noise=0.0)
    assert mean == pytest.approx(1.0) and var == pytest.approx(0.75)
    mean, var = D.gp_posterior(np.array([[1.0]]), np.array([0.5]), 1.0, np.array([2.0]), noise=1.0)
    assert mean == pytest.approx(0.5) and var == pytest.approx(0.875)
    mean, _ = D.gp_posterior(np.array([[1.0]]), np.array([0.5]), 1.0, np.array([[2.0, 4.0]]), 0.0,
                             prior_mean=np.array([1.0, 1.0]))
    assert mean == pytest.approx([1.5, 2.5])  # 1 + 0.5 (y - 1), per machine


def test_rwgp_predicts_the_prior_until_it_has_history_and_learns_a_constant_shift():
    gp = D.RWGP(tau=4, noise=1e-6)
    feats = np.array([[1.0, 0.0], [0.5, 0.5], [0.3, 1.0]])
    spec = gp.spectrum(feats)
    prior = np.array([1.0, 0.5, 0.3])
    mean, std = gp.predict(spec, prior)
    assert np.array_equal(mean, prior) and np.all(std == 0)
    for _ in range(3):  # the same graph was always followed by the same speeds
        gp.observe(spec, np.array([0.9, 0.6, 0.3]))
    mean, std = gp.predict(spec, np.array([0.9, 0.6, 0.3]))
    assert mean == pytest.approx([0.9, 0.6, 0.3], abs=1e-4)
    assert np.all(std < 1e-3)


def test_placement_agent_refuses_a_worker_that_would_slow_the_job():
    spec = ClusterSpec(2, gpus=1.0)
    cap = spec.empty()
    n = 1
    view = SlotView(0, np.arange(n), np.array([type_index("resnet-50")]), np.zeros(n, int), np.zeros(n, int),
                      np.zeros(n), np.array([50.0]), np.zeros(n, int), np.zeros(n, int), cap.copy(), cap, 16, 16,
                      server_speed=np.array([1.0, 0.05]), **view_fields([type_index("resnet-50")], 16, 16))
    a = D.DualAgent()(view)
    assert a.worker_servers == ((0,),) and a.ps_servers == ((0,),)
    view_fast = SlotView(**{**view.__dict__, "server_speed": np.array([1.0, 1.0])})
    assert D.DualAgent()(view_fast).workers[0] == 2


def test_ordering_agent_default_is_srtf_like():
    spec = ClusterSpec(4)
    cap = spec.empty()
    view = SlotView(3, np.arange(2), np.array([type_index("vgg-16"), type_index("vgg-16")]),
                      np.array([0, 0]), np.zeros(2, int), np.zeros(2), np.array([200.0, 5.0]),
                      np.zeros(2, int), np.zeros(2, int), cap.copy(), cap, 16, 16,
                      **view_fields([type_index("vgg-16")] * 2, 16, 16))
    pri = D.DualAgent().priorities(view, 1.0)
    assert pri[1] > pri[0]  # less remaining work first


def test_dual_agent_run_stays_within_capacity_and_is_reproducible():
    trace = generate(TraceConfig(num_jobs=10, max_arrivals_per_slot=5), seed=4)
    cfg = E.SimConfig(cluster=ClusterSpec(6), cross_node_comm=True, server_speed_classes=hetero.THREE_GENERATIONS,
                      speed_walk_sigma=0.1, hetero_seed=2)
    a = E.run(trace, D.DualAgent(), cfg, seed=1)  # the engine raises CapacityError on any overflow
    b = E.run(trace, D.DualAgent(), cfg, seed=1)
    assert np.array_equal(a.jct_slots, b.jct_slots) and np.all(np.isfinite(a.jct_slots))
    agent = D.DualAgent()
    E.run(trace, agent, cfg, seed=1)
    assert len(agent.errors) > 0 and np.all(np.isfinite(np.array(agent.errors)))
