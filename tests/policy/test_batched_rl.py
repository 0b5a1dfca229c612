"""Batched rollouts (dl2d/policy/batched.py): the vmapped slot loop matches the single one; a batched episode
learns and fills the replay."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from dl2d.policy import batched as B
from dl2d.policy.checkpoint import make_optimizer
from dl2d.policy.scheduler import decide
from dl2d.policy.slot import GREEDY, pad_window, run_window
from dl2d.policy.train import Replay, RLState
from dl2d.sim import engine as E

from conftest import tiny_trace


def _view(trace, sim):
    return E.view_of(trace, E.replace(E.SimState.initial(len(trace)), slot=int(trace.arrival_slot.min())), sim)


def test_vmapped_windows_match_single(cfg, sim, params):
    views = [_view(tiny_trace(8, seed=s), sim) for s in (1, 2)]
    key = jax.random.PRNGKey(3)
    batch = B.decide_batch(cfg, params, key, views)
    keys = jax.random.split(key, 2)
    for i, v in enumerate(views):
        win = pad_window(cfg, v.type_idx, v.slots_run, v.remaining_epochs, v.free, v.capacity)
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
    totals = B.rl_batch(cfg, st, traces, sim, seed=0, max_slots=4)
    assert len(totals) == 3 and np.isfinite(totals).all()
    assert st.replay.size > 0 and st.steps > 0
    leaves = jax.tree_util.tree_leaves(st.params)
    assert all(np.isfinite(np.asarray(x)).all() for x in leaves)
    with pytest.raises(ValueError):
        B.decide_batch(cfg, params, jax.random.PRNGKey(0), [_big_view(cfg, sim)])


def _big_view(cfg, sim):
    from dataclasses import replace
    tr = tiny_trace(cfg.max_jobs + 2, seed=7)
    tr = replace(tr, arrival_slot=np.zeros_like(tr.arrival_slot))
    return _view(tr, sim)
