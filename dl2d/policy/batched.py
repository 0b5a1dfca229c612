"""Batched RL rollouts: K simulated clusters step in lockstep and their slots are decided by ONE vmapped call of
the jitted slot loop (`jax.vmap(run_window)` over K windows), so one policy update sees K slots' samples.

Scope: one window per cluster (at most J = cfg.max_jobs active jobs per slot, e.g. the small preset with 40-job
traces); a slot with more jobs raises. The per-cluster bookkeeping (n-step returns, replay) is that of
`train.rl_episode`: each cluster keeps its own queue of pending slots.
"""
from __future__ import annotations

from collections import deque
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.checkpoint import make_optimizer
from dl2d.policy.config import PolicyConfig
from dl2d.policy.learn import RLState, _push, rl_update
from dl2d.policy.scheduler import WindowRecord, _collect_servers, window_job_info
from dl2d.policy.slot import SAMPLE, pad_window, run_window
from dl2d.sim import engine as E
from dl2d.sim.trace import Trace


@partial(jax.jit, static_argnames=("cfg", "mode"))
def run_windows(cfg: PolicyConfig, params, keys, wins, epsilon=0.0, mode: str = SAMPLE):
    """`run_window` (record=True) over a batch of windows (every leaf of `wins` has a leading K axis)."""
    return jax.vmap(lambda k, w: run_window(cfg, params, k, w, mode=mode, epsilon=epsilon, record=True))(keys, wins)


def decide_batch(cfg: PolicyConfig, params, key, views: list[SlotView], epsilon: float = 0.0, mode: str = SAMPLE):
    """(allocation, record) per view, from one vmapped slot loop."""
    for v in views:
        if len(v) > cfg.max_jobs:
            raise ValueError(f"{len(v)} jobs in a slot: batched rollouts support one window of {cfg.max_jobs}")
    wins = [pad_window(cfg, v.type_idx, v.slots_run, v.remaining_epochs, v.free, v.capacity,
                       worker_demand=v.worker_demand, ps_demand=v.ps_demand, allreduce=v.allreduce,
                       job_info=window_job_info(cfg, v, slice(0, len(v)))) for v in views]
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *wins)
    out = jax.device_get(run_windows(cfg, params, jax.random.split(key, len(views)), stacked, epsilon, mode=mode))
    res = []
    for i, v in enumerate(views):
        o = jax.tree_util.tree_map(lambda x: None if x is None else x[i], out)
        n, steps = len(v), int(o.n_steps)
        w_srv: list[list[int]] = [[] for _ in range(n)]
        p_srv: list[list[int]] = [[] for _ in range(n)]
        _collect_servers(0, slice(0, n), o, steps, w_srv, p_srv)
        alloc = Allocation.from_servers(w_srv, p_srv)
        rec = WindowRecord(o.states[:steps], o.masks[:steps], o.actions[:steps], o.explored[:steps])
        res.append((alloc, rec))
    return res


def rl_batch(cfg: PolicyConfig, st: RLState, traces: list[Trace], sim: E.SimConfig, seed: int,
             max_slots: int | None = None, on_slot: Callable | None = None) -> list[float]:
    """One episode on each of the K traces at once, `cfg.updates_per_slot` updates after every batched slot.
    Returns each cluster's total reward."""
    opt = make_optimizer(cfg.rl_lr)
    K = len(traces)
    rngs = [np.random.default_rng(seed + k) for k in range(K)]
    key = jax.random.PRNGKey(seed)
    states = [E.replace(E.SimState.initial(len(t)), slot=int(t.arrival_slot.min())) for t in traces]
    pending = [deque() for _ in range(K)]
    totals, n = [0.0] * K, 0
    while any(not s.done() for s in states) and (max_slots is None or n < max_slots):
        live = [k for k in range(K) if not states[k].done()]
        views = [E.view_of(traces[k], states[k], sim) for k in live]
        key, sub = jax.random.split(key)
        rewards = []
        for k, (alloc, rec) in zip(live, decide_batch(cfg, st.params, sub, views, cfg.epsilon)):
            first = rec.states[0] if len(rec.actions) else np.zeros(cfg.state_dim)
            if len(pending[k]) >= cfg.n_step:
                _push(st.replay, pending[k], first, cfg.gamma, terminal=False)
            states[k], reward, _ = E.step(traces[k], states[k], alloc, sim, rngs[k])
            if states[k].done():  # flush at once: this cluster takes no more slots
                pending[k].append(([rec], reward))
                while pending[k]:
                    _push(st.replay, pending[k], np.zeros(cfg.state_dim), cfg.gamma, terminal=True)
            else:
                pending[k].append(([rec], reward))
            totals[k] += reward
            rewards.append(reward)
        n += 1
        if st.replay.size >= cfg.minibatch:
            for _ in range(cfg.updates_per_slot):
                st.params, st.opt_state, _l, _a = rl_update(cfg, opt, st.params, st.opt_state,
                                                            st.replay.sample(cfg.minibatch))
                st.steps += 1
        if on_slot:
            on_slot(n, rewards)
    for k in range(K):
        while pending[k]:
            _push(st.replay, pending[k], np.zeros(cfg.state_dim), cfg.gamma, terminal=True)
    return totals
