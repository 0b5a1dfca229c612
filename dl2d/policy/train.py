"""Training the DL2 policy: supervised warm-up from a heuristic, then online advantage actor-critic.

The simulator plays the live cluster. The math (losses, TD targets) is pure and jitted; rollouts and the
replay buffer are a thin NumPy shell around the simulator and the jitted slot loop.
"""
from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dl2d.policy.checkpoint import make_optimizer
from dl2d.policy.config import PolicyConfig
from dl2d.policy.nets import masked_logits, policy_logits, value
from dl2d.policy.scheduler import DL2Scheduler, decide
from dl2d.policy.slot import GREEDY, SAMPLE, TEACHER
from dl2d.sim import engine as E
from dl2d.sim.baselines import make_baseline
from dl2d.sim.oracle import SpeedOracle
from dl2d.sim.trace import Trace

# ---------------------------------------------------------------- losses (pure)


def sl_loss(cfg: PolicyConfig, params, states, masks, actions):
    """Cross entropy between the masked policy and the teacher's actions."""
    logp = jax.nn.log_softmax(masked_logits(policy_logits(cfg, params, states), masks))
    return -jnp.mean(jnp.take_along_axis(logp, actions[:, None], axis=1))


def rl_loss(cfg: PolicyConfig, params, batch):
    """Advantage actor-critic: -log pi(a|s) A - beta H(pi) + c (y - V(s))^2 with y = R + disc V(s'), A = y - V(s).

    R is the discounted return of the next n slots' rewards and disc = gamma^n (0 where the episode ended
    within them), so n = 1 is the one-step TD target r + gamma V(s'). With `cfg.normalize_advantage` the
    advantages are standardised over the minibatch (the policy step then does not depend on the reward scale)."""
    states, masks, actions, returns, next_states, discounts = batch
    logp = jax.nn.log_softmax(masked_logits(policy_logits(cfg, params, states), masks))
    v = value(cfg, params, states)
    y = returns + discounts * jax.lax.stop_gradient(value(cfg, params, next_states))
    if cfg.advantage == "greedy":  # `returns` already are advantages over the greedy policy: keep their sign
        adv = returns / (jnp.std(returns) + 1e-6) if cfg.normalize_advantage else returns
    else:
        adv = jax.lax.stop_gradient(y - v)
        if cfg.normalize_advantage:
            adv = (adv - jnp.mean(adv)) / (jnp.std(adv) + 1e-6)
    pg = -jnp.mean(jnp.take_along_axis(logp, actions[:, None], axis=1)[:, 0] * adv)
    p = jnp.exp(logp)
    entropy = -jnp.mean(jnp.sum(jnp.where(masks, p * logp, 0.0), axis=1))
    v_loss = jnp.mean((y - v) ** 2)
    return pg - cfg.entropy_weight * entropy + cfg.value_weight * v_loss, {"pg": pg, "entropy": entropy, "v_loss": v_loss}


@partial(jax.jit, static_argnames=("cfg", "opt"))
def sl_update(cfg, opt, params, opt_state, states, masks, actions):
    loss, grads = jax.value_and_grad(partial(sl_loss, cfg))(params, states, masks, actions)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


@partial(jax.jit, static_argnames=("cfg", "opt"))
def rl_update(cfg, opt, params, opt_state, batch):
    (loss, aux), grads = jax.value_and_grad(partial(rl_loss, cfg), has_aux=True)(params, batch)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, aux


# ---------------------------------------------------------------- supervised warm-up


def make_teacher(name: str, speed_model: str = "measured"):
    """A baseline by name, or "oracle": the simulator's speed oracle on `speed_model` (knows the true speeds;
    benchmarks only)."""
    return SpeedOracle(speed_model) if name == "oracle" else make_baseline(name)


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


def fit_epochs(step: Callable, params, opt_state, arrays, batch: int, epochs: int, seed: int = 0,
               on_epoch: Callable | None = None):
    """Shuffled minibatch epochs of ``step(params, opt_state, *minibatch) -> (params, opt_state, loss)`` over
    ``arrays`` (indexed alike); returns (params, opt_state, per-epoch mean losses)."""
    rng = np.random.default_rng(seed)
    n = len(arrays[0])
    losses = []
    for ep in range(epochs):
        order = rng.permutation(n)
        ep_loss = []
        for i in range(0, n, batch):
            b = order[i:i + batch]
            params, opt_state, loss = step(params, opt_state, *(a[b] for a in arrays))
            ep_loss.append(float(loss))
        losses.append(float(np.mean(ep_loss)))
        if on_epoch:
            on_epoch(ep, losses[-1], params)
    return params, opt_state, losses


def supervised(cfg: PolicyConfig, params, data, epochs: int, seed: int = 0, on_epoch: Callable | None = None):
    """Fit the policy to teacher samples; returns (params, per-epoch mean losses)."""
    opt = make_optimizer(cfg.sl_lr)
    params, _, losses = fit_epochs(lambda p, o, s, m, a: sl_update(cfg, opt, p, o, s, m, a), params,
                                   opt.init(params), [jnp.asarray(x) for x in data], cfg.sl_batch, epochs,
                                   seed, on_epoch)
    return params, losses


def imitation_accuracy(cfg: PolicyConfig, params, data) -> float:
    states, masks, actions = data
    logits = masked_logits(policy_logits(cfg, params, jnp.asarray(states)), jnp.asarray(masks))
    return float(np.mean(np.asarray(jnp.argmax(logits, axis=1)) == actions))


# ---------------------------------------------------------------- online RL


class Replay:
    """A ring buffer of (s, mask, a, R, s', disc): the critic's target is R + disc V(s'); samples uniformly."""

    def __init__(self, cfg: PolicyConfig, seed: int = 0):
        n, d, a = cfg.replay_size, cfg.state_dim, cfg.num_actions
        self.s, self.m = np.zeros((n, d), np.float32), np.zeros((n, a), bool)
        self.a, self.r = np.zeros(n, np.int32), np.zeros(n, np.float32)
        self.s2, self.disc = np.zeros((n, d), np.float32), np.zeros(n, np.float32)
        self.n, self.i, self.size = n, 0, 0
        self.rng = np.random.default_rng(seed)

    def add(self, s, m, a, r, s2, disc):
        """Samples s[k], m[k], a[k] sharing the return r, bootstrap state s2 and discount disc."""
        k = len(a)
        if k == 0:
            return
        if k > self.n:  # only the last n fit
            s, m, a, k = s[-self.n:], m[-self.n:], a[-self.n:], self.n
        idx = (self.i + np.arange(k)) % self.n
        self.s[idx], self.m[idx], self.a[idx] = s, m, a
        self.r[idx], self.s2[idx], self.disc[idx] = r, s2, disc
        self.i = int((self.i + k) % self.n)
        self.size = min(self.size + k, self.n)

    def sample(self, k: int):
        idx = self.rng.integers(0, self.size, min(k, self.size))
        return tuple(jnp.asarray(x[idx]) for x in (self.s, self.m, self.a, self.r, self.s2, self.disc))


@dataclass
class RLState:
    params: dict
    opt_state: object
    replay: Replay
    steps: int = 0


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


def nstep_return(rewards, gamma: float) -> float:
    return float(sum(r * gamma ** k for k, r in enumerate(rewards)))


def _push(replay: Replay, pending: deque, next_state, gamma: float, terminal: bool):
    """Store the oldest pending slot's samples: return over all pending rewards, bootstrap `next_state`."""
    rewards = [r for _, r in pending]
    ret = nstep_return(rewards, gamma)
    disc = 0.0 if terminal else gamma ** len(rewards)
    records, _ = pending.popleft()
    for r in records:
        replay.add(r.states, r.masks, r.actions, ret, next_state, disc)


def validate(cfg: PolicyConfig, params, trace: Trace, sim: E.SimConfig, seed: int = 0) -> E.SimResult:
    """Greedy policy on a held-out trace."""
    return E.run(trace, DL2Scheduler(cfg, params, mode=GREEDY, seed=seed), sim, seed=seed, name="dl2")
