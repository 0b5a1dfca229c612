"""Training the DL2 policy in the simulator: teacher samples for the supervised warm-up, online advantage
actor-critic episodes, validation.

The simulator plays the live cluster. The math (losses, updates, replay, returns) is dl2d.policy.dl2.learn's;
this module is the rollout shell around the simulator and the jitted slot loop.
"""
from __future__ import annotations

import copy
from collections import deque
from typing import Callable, Iterable

import jax
import numpy as np

from dl2d.policy.checkpoint import make_optimizer
from dl2d.policy.dl2.config import PolicyConfig
from dl2d.policy.dl2.learn import RLState, _push, rl_update
from dl2d.policy.registry import PolicyOptions
from dl2d.policy.registry import build as build_policy
from dl2d.policy.registry import names as policy_names
from dl2d.policy.dl2.scheduler import DL2Scheduler, decide
from dl2d.policy.dl2.slot import GREEDY, SAMPLE, TEACHER
from dl2d.sim import engine as E
from dl2d.sim.trace import Trace

# ---------------------------------------------------------------- supervised warm-up


def make_teacher(name: str, speed_model: str = "measured"):
    """A baseline by name, or "oracle": the simulator's speed oracle on `speed_model` (knows the true speeds;
    benchmarks only)."""
    if name != "oracle" and name not in policy_names(heuristic=True):
        raise ValueError(f"a teacher is a heuristic ({', '.join(policy_names(heuristic=True))}) or 'oracle', "
                         f"not {name!r}")
    return build_policy(name, PolicyOptions(speed_model=speed_model))


def teacher_samples(cfg: PolicyConfig, params, trace: Trace, sim: E.SimConfig, teacher: str = "drf", seed: int = 0,
                    max_slots: int | None = None, per_slot: int = 64):
    """(states, masks, actions) of the teacher's decisions replayed as DL2 actions along its own trajectory.

    `params` only feed the (unused) logits of the replay; any initialised parameters do."""
    rng = np.random.default_rng(seed)
    heuristic = make_teacher(teacher, sim.speed_model)
    key = jax.random.PRNGKey(seed)
    state = E.SimState.initial(len(trace))
    state = E.replace(state, slot=int(trace.arrival_slot.min()))
    out_s, out_m, out_a = [], [], []
    n = 0
    while not state.done() and (max_slots is None or n < max_slots):
        view = E.view_of(trace, state, sim)
        alloc = heuristic(view)
        key, sub = jax.random.split(key)
        d = decide(cfg, params, sub, view, mode=TEACHER, targets=(alloc.workers, alloc.ps), record=True)
        for r in d.records:
            keep = rng.permutation(len(r.actions))[:per_slot]
            out_s.append(r.states[keep]), out_m.append(r.masks[keep]), out_a.append(r.actions[keep])
        state, _, _ = E.step(trace, state, alloc, sim, rng)
        n += 1
    return np.concatenate(out_s), np.concatenate(out_m), np.concatenate(out_a)


# ---------------------------------------------------------------- online RL


def rl_episode(cfg: PolicyConfig, st: RLState, trace: Trace, sim: E.SimConfig, seed: int,
               max_slots: int | None = None, on_slot: Callable | None = None) -> float:
    """Run one trace with the sampling policy, learning after every slot. Returns the episode's total reward.

    A slot's samples enter the replay once the `cfg.n_step` following slot rewards are known (or the episode
    ends), with their discounted sum as return and the first state of the slot n on as bootstrap.

    With `cfg.advantage == "greedy"` each slot is also decided greedily and simulated from the same state with
    the same noise (a copy of the generator); the slot's samples enter the replay at once with the reward
    difference as their advantage (a self-critical, myopic baseline: gamma and n_step are not used)."""
    opt = make_optimizer(cfg.rl_lr)
    rng = np.random.default_rng(seed)
    key = jax.random.PRNGKey(seed)
    state = E.replace(E.SimState.initial(len(trace)), slot=int(trace.arrival_slot.min()))
    pending: deque = deque()  # (records, reward) of the last slots, oldest first, waiting for their returns
    total, n = 0.0, 0
    while not state.done() and (max_slots is None or n < max_slots):
        view = E.view_of(trace, state, sim)
        key, sub = jax.random.split(key)
        d = decide(cfg, st.params, sub, view, mode=SAMPLE, epsilon=cfg.epsilon, record=True)
        first = d.records[0].states[0] if d.records and len(d.records[0].actions) else np.zeros(cfg.state_dim)
        if cfg.advantage == "greedy":
            key, sub = jax.random.split(key)
            g = decide(cfg, st.params, sub, view, mode=GREEDY)
            _, base, _ = E.step(trace, state, g.allocation, sim, copy.deepcopy(rng))
        elif len(pending) >= cfg.n_step:
            _push(st.replay, pending, first, cfg.gamma, terminal=False)
        state, reward, _ = E.step(trace, state, d.allocation, sim, rng)
        if cfg.advantage == "greedy":
            for r in d.records:
                st.replay.add(r.states, r.masks, r.actions, reward - base, np.zeros(cfg.state_dim), 0.0)
        else:
            pending.append((d.records, reward))
        total += reward
        n += 1
        if st.replay.size >= cfg.minibatch:
            for _ in range(cfg.updates_per_slot):
                st.params, st.opt_state, _loss, _aux = rl_update(cfg, opt, st.params, st.opt_state,
                                                                 st.replay.sample(cfg.minibatch))
                st.steps += 1
        if on_slot:
            on_slot(n, reward)
    while pending:
        _push(st.replay, pending, np.zeros(cfg.state_dim), cfg.gamma, terminal=True)
    return total


def sl_data(cfg: PolicyConfig, params, traces: Iterable[tuple[Trace, int]], sim: E.SimConfig, teacher: str,
            max_slots: int | None = None, on_trace: Callable[[], None] | None = None):
    """The supervised warm-up's (states, masks, actions): the teacher replayed on each (trace, seed)."""
    parts = []
    for trace, seed in traces:
        parts.append(teacher_samples(cfg, params, trace, sim, teacher, seed=seed, max_slots=max_slots))
        if on_trace:
            on_trace()
    return tuple(np.concatenate(x) for x in zip(*parts))


def rl_slots(cfg: PolicyConfig, st: RLState, sim: E.SimConfig, slots: int,
             episode: Callable[[int], tuple[Trace, int]], on_slot: Callable | None = None) -> list[int]:
    """Online RL for `slots` simulated slots: episode k runs on ``episode(k)`` = (trace, seed), the last one cut
    short. Returns the seeds of the episodes run."""
    seeds: list[int] = []
    done = 0

    def count(n, reward):
        nonlocal done
        done += 1
        if on_slot:
            on_slot(n, reward)

    while done < slots:
        trace, seed = episode(len(seeds))
        seeds.append(seed)
        rl_episode(cfg, st, trace, sim, seed=seed, max_slots=slots - done, on_slot=count)
    return seeds


def validate(cfg: PolicyConfig, params, trace: Trace, sim: E.SimConfig, seed: int = 0) -> E.SimResult:
    """Greedy policy on a held-out trace."""
    return E.run(trace, DL2Scheduler(cfg, params, mode=GREEDY, seed=seed), sim, seed=seed, name="dl2")
