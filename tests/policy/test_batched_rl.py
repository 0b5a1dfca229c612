"""Batched rollouts (dl2d/policy/batched.py): the vmapped slot loop matches the single one; a batched episode
learns and fills the replay."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from testkit.policy import tiny_trace

from dl2d.policy import batched as B
from dl2d.policy.checkpoint import make_optimizer
from dl2d.policy.learn import Replay, RLState
from dl2d.policy.scheduler import decide
from dl2d.policy.slot import GREEDY, pad_window, run_window
from dl2d.sim import engine as E


def _view(trace, sim):
    return E.view_of(trace, E.replace(E.SimState.initial(len(trace)), slot=int(trace.arrival_slot.min())), sim)


def test_vmapped_windows_match_single(cfg, sim, params):
    views = [_view(tiny_trace(8, seed=s), sim) for s in (1, 2)]
    key = jax.random.PRNGKey(3)
    batch = B.decide_batch(cfg, params, key, views)
    keys = jax.random.split(key, 2)
    for i, v in enumerate(views):
        win = pad_window(cfg, v.type_idx, v.slots_run, v.remaining_epochs, v.free, v.capacity,
                         worker_demand=v.worker_demand, ps_demand=v.ps_demand)
        one = jax.device_get(run_window(cfg, params, keys[i], win, record=True))
        np.testing.assert_array_equal(batch[i][1].actions, one.actions[:int(one.n_steps)])
        np.testing.assert_array_equal(batch[i][0].workers, one.workers[:len(v)])
    g = B.decide_batch(cfg, params, key, views, mode=GREEDY)
    for (alloc, _), v in zip(g, views):
        want = decide(cfg, params, key, v, mode=GREEDY).allocation
        np.testing.assert_array_equal(alloc.workers, want.workers)
        assert alloc.worker_servers == want.worker_servers and alloc.ps_servers == want.ps_servers


def test_rl_batch_updates(cfg, sim, params):
    st = RLState(params, make_optimizer(cfg.rl_lr).init(params), Replay(cfg, seed=0))
    traces = [tiny_trace(8, seed=s, max_epochs=20) for s in (4, 5, 6)]
    before = jax.tree_util.tree_leaves(params)
    # six slots: the replay passes one minibatch (32) within them whatever the random policy picks (it holds
    # 31-34 after four, which made four slots a coin toss)
    totals = B.rl_batch(cfg, st, traces, sim, seed=0, max_slots=6)
    assert len(totals) == 3 and np.isfinite(totals).all()
    assert st.replay.size >= cfg.minibatch and st.steps > 0
    assert any(not np.array_equal(a, b) for a, b in zip(before, jax.tree_util.tree_leaves(st.params)))
    leaves = jax.tree_util.tree_leaves(st.params)
    assert all(np.isfinite(np.asarray(x)).all() for x in leaves)
    with pytest.raises(ValueError):
        B.decide_batch(cfg, params, jax.random.PRNGKey(0), [_big_view(cfg, sim)])


def _big_view(cfg, sim):
    from dataclasses import replace
    tr = tiny_trace(cfg.max_jobs + 2, seed=7)
    tr = replace(tr, arrival_slot=np.zeros_like(tr.arrival_slot))
    return _view(tr, sim)


@pytest.mark.parametrize("rule,poor", [("both", True), ("workers", False), ("none", False)])
def test_poor_skew_rule(cfg, sim, rule, poor):
    """One worker with many PS (Optimus-like) is a poor state only under DL2's rule; many workers on one PS is
    poor under "both" and "workers"."""
    from dataclasses import replace

    import jax.numpy as jnp

    from dl2d.policy.slot import action_mask, poor_state_action

    c = replace(cfg, poor_ratio=2.0, poor_skew=rule)
    v = _view(tiny_trace(8, seed=1), sim)
    win = pad_window(c, v.type_idx, v.slots_run, v.remaining_epochs, v.free, v.capacity,
                     worker_demand=v.worker_demand, ps_demand=v.ps_demand)
    w = jnp.zeros(c.max_jobs, jnp.int32).at[0].set(1)
    u = jnp.zeros(c.max_jobs, jnp.int32).at[0].set(3)
    mask = jnp.ones(c.num_actions, bool)
    a, is_poor = poor_state_action(c, win, w, u, mask)
    assert bool(is_poor) == poor and (not poor or int(a) == 0)
    a, is_poor = poor_state_action(c, win, u, w, mask)  # 3 workers, 1 PS
    assert bool(is_poor) == (rule != "none") and (rule == "none" or int(a) == 1)
    with pytest.raises(ValueError):
        replace(cfg, poor_skew="nope")
    assert action_mask(c, win, w, u, win.free).shape == (c.num_actions,)
