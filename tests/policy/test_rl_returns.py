"""Online-RL plumbing: n-step returns, the replay ring buffer, advantage normalisation, and deployment
decisions that record nothing."""
from __future__ import annotations

from collections import deque
from dataclasses import replace

import jax
import numpy as np
import pytest
from testkit.policy import tiny_trace

from dl2d.policy.dl2 import learn as LN
from dl2d.policy.dl2 import train as T
from dl2d.policy.checkpoint import make_optimizer
from dl2d.policy.dl2.scheduler import WindowRecord, decide
from dl2d.policy.dl2.slot import GREEDY, SAMPLE
from dl2d.sim import engine as E


def _records(cfg, n, tag):
    s = np.full((n, cfg.state_dim), tag, np.float32)
    m = np.ones((n, cfg.num_actions), bool)
    return [WindowRecord(s, m, np.full(n, tag, np.int32), np.zeros(n, bool))]


def test_nstep_return_is_the_discounted_sum():
    assert LN.nstep_return([1.0], 0.9) == pytest.approx(1.0)
    assert LN.nstep_return([1.0, 2.0, 4.0], 0.5) == pytest.approx(1.0 + 1.0 + 1.0)


def test_push_uses_all_pending_rewards_and_gamma_to_the_n(cfg):
    replay = LN.Replay(cfg, seed=0)
    pending = deque([(_records(cfg, 2, 1), 1.0), (_records(cfg, 3, 2), 2.0), (_records(cfg, 1, 3), 4.0)])
    boot = np.full(cfg.state_dim, 9.0, np.float32)
    LN._push(replay, pending, boot, 0.5, terminal=False)
    assert len(pending) == 2 and replay.size == 2  # only the oldest slot's two samples
    np.testing.assert_allclose(replay.r[:2], 1.0 + 0.5 * 2.0 + 0.25 * 4.0)
    np.testing.assert_allclose(replay.disc[:2], 0.125)
    np.testing.assert_array_equal(replay.a[:2], 1)
    np.testing.assert_array_equal(replay.s2[:2], boot[None].repeat(2, 0))
    LN._push(replay, pending, boot, 0.5, terminal=True)
    assert replay.size == 5
    np.testing.assert_allclose(replay.r[2:5], 2.0 + 0.5 * 4.0)
    np.testing.assert_allclose(replay.disc[2:5], 0.0)


def test_replay_ring_buffer_wraps_and_keeps_the_newest(cfg):
    small = replace(cfg, replay_size=5)
    replay = LN.Replay(small, seed=0)
    for tag in range(1, 4):  # 3 x 2 samples into 5 rows
        r = _records(small, 2, tag)[0]
        replay.add(r.states, r.masks, r.actions, float(tag), r.states[0], 0.9)
    assert replay.size == 5 and replay.i == 1
    assert sorted(replay.a.tolist()) == [1, 2, 2, 3, 3]  # tag 1's first sample was overwritten
    np.testing.assert_array_equal(replay.r[replay.a == 3], 3.0)
    r = _records(small, 7, 4)[0]  # more than fits: the last 5
    replay.add(r.states, r.masks, r.actions, 4.0, r.states[0], 0.9)
    assert replay.size == 5 and set(replay.a.tolist()) == {4}


def test_normalised_advantage_is_invariant_to_the_reward_scale(cfg, params):
    rng = np.random.default_rng(0)
    n = 64
    masks = np.ones((n, cfg.num_actions), bool)
    actions = rng.integers(0, cfg.num_actions, n).astype(np.int32)
    s, s2 = rng.random((n, cfg.state_dim), dtype=np.float32), rng.random((n, cfg.state_dim), dtype=np.float32)
    ret = rng.random(n).astype(np.float32) * 10
    zero_v = jax.tree_util.tree_map(np.zeros_like, params["value"])  # V = 0: advantage = return
    p = {"policy": params["policy"], "value": zero_v}
    disc = np.zeros(n, np.float32)
    _, a1 = LN.rl_loss(cfg, p, (s, masks, actions, ret, s2, disc))
    _, a2 = LN.rl_loss(cfg, p, (s, masks, actions, 100 * ret, s2, disc))
    assert float(a1["pg"]) == pytest.approx(float(a2["pg"]), rel=1e-3)
    raw = replace(cfg, normalize_advantage=False)
    _, b1 = LN.rl_loss(raw, p, (s, masks, actions, ret, s2, disc))
    _, b2 = LN.rl_loss(raw, p, (s, masks, actions, 100 * ret, s2, disc))
    assert float(b2["pg"]) == pytest.approx(100 * float(b1["pg"]), rel=1e-4)


@pytest.mark.parametrize("mode", [GREEDY, SAMPLE])
def test_decisions_without_records_allocate_the_same(cfg, params, sim, mode):
    """record=False (deployment) keeps no states or masks but gives the same allocation, servers included."""
    trace = tiny_trace(20, seed=3)
    state = E.replace(E.SimState.initial(len(trace)), slot=0)
    rng = np.random.default_rng(0)
    for n in range(3):
        view = E.view_of(trace, state, sim)
        key = jax.random.PRNGKey(n)
        a = decide(cfg, params, key, view, mode=mode, epsilon=0.3, record=True)
        b = decide(cfg, params, key, view, mode=mode, epsilon=0.3, record=False)
        assert len(a.records) >= 1 and b.records == []
        np.testing.assert_array_equal(a.allocation.workers, b.allocation.workers)
        np.testing.assert_array_equal(a.allocation.ps, b.allocation.ps)
        assert a.allocation.worker_servers == b.allocation.worker_servers
        assert a.allocation.ps_servers == b.allocation.ps_servers
        state, _, _ = E.step(trace, state, a.allocation, sim, rng)


def test_nstep_episode_stores_every_sample_with_valid_discounts(cfg, sim, params):
    c = replace(cfg, n_step=3)
    trace = tiny_trace(8, seed=2, max_epochs=20)
    st = LN.RLState(params, make_optimizer(c.rl_lr).init(params), LN.Replay(c, seed=0))
    T.rl_episode(c, st, trace, sim, seed=0, max_slots=10)
    disc = st.replay.disc[: st.replay.size]
    assert np.all(np.isclose(disc, 0.0) | np.isclose(disc, c.gamma ** 3))
    assert np.any(disc == 0.0) and np.any(disc > 0)  # the last three slots end the episode
    assert np.all(st.replay.r[: st.replay.size] >= 0)


def test_greedy_advantage_is_the_reward_difference_over_the_greedy_slot(cfg, sim, params):
    """advantage="greedy": a slot's samples carry reward(sampled) - reward(greedy on the same state and noise),
    and a greedy-only policy (epsilon 0, all its mass on one action) would get exactly zero."""
    c = replace(cfg, advantage="greedy", epsilon=0.0)
    trace = tiny_trace(8, seed=2, max_epochs=20)
    st = LN.RLState(params, make_optimizer(c.rl_lr).init(params), LN.Replay(c, seed=0))
    rewards = []
    T.rl_episode(c, st, trace, sim, seed=0, max_slots=6, on_slot=lambda n, r: rewards.append(r))
    adv = st.replay.r[: st.replay.size]
    assert np.all(st.replay.disc[: st.replay.size] == 0.0)
    assert np.all(np.abs(adv) <= max(rewards) + 1e-6) and np.any(adv != 0)
    # the same slot twice: greedy vs greedy gives zero
    view = E.view_of(trace, E.replace(E.SimState.initial(len(trace)), slot=0), sim)
    state = E.replace(E.SimState.initial(len(trace)), slot=0)
    g = decide(c, params, jax.random.PRNGKey(0), view, mode=GREEDY).allocation
    rng = np.random.default_rng(0)
    _, r1, _ = E.step(trace, state, g, sim, __import__("copy").deepcopy(rng))
    _, r2, _ = E.step(trace, state, g, sim, rng)
    assert r1 == r2


def test_greedy_advantage_keeps_its_sign(cfg, params):
    c = replace(cfg, advantage="greedy")
    n = 16
    masks = np.ones((n, c.num_actions), bool)
    actions = np.zeros(n, np.int32)
    s = np.zeros((n, c.state_dim), np.float32)
    up = jax.grad(lambda p: LN.rl_loss(c, p, (s, masks, actions, np.full(n, 0.5, np.float32), s,
                                             np.zeros(n, np.float32)))[0])(params)
    # a positive advantage on action 0 everywhere: the gradient step raises action 0's logit bias
    assert float(up["policy"]["out"]["bias"][0]) < 0
    with pytest.raises(ValueError, match="advantage"):
        replace(cfg, advantage="bogus")
