"""Learning the DL2 policy, as pure math and small buffers: the supervised and actor-critic losses and their
jitted updates, minibatch epochs, the replay buffer and n-step returns. No simulator here: the daemon's
online learner (dl2d.policy.dl2.online) uses this module; the simulated training pipelines (dl2d.policy.dl2.train)
drive it with rollouts.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dl2d.policy.checkpoint import make_optimizer
from dl2d.policy.dl2.config import PolicyConfig
from dl2d.policy.dl2.nets import masked_logits, policy_logits, value

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


# ---------------------------------------------------------------- supervised fitting

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


# ---------------------------------------------------------------- online RL: replay and returns

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
