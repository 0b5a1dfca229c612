"""Online RL in the daemon (DL2 section 4.2): decide with the sampling policy, learn from each slot's reward.

The daemon calls :meth:`OnlineLearner.decide` at the start of a slot and :meth:`OnlineLearner.observe` once
the slot's reward is known. A slot's (state, mask, action) records enter the replay buffer when the next
slot's first state is known (its s'), exactly as ``dl2d.policy.dl2.train.rl_episode`` does against the
simulator; then ``updates_per_slot`` advantage actor-critic steps run on a minibatch. The math is
``train.rl_update``; this module only holds the state between slots and the checkpoint round trip.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.checkpoint import Checkpoint, load, make_optimizer, save
from dl2d.policy.dl2.config import PolicyConfig
from dl2d.policy.dl2.learn import Replay, rl_update
from dl2d.policy.dl2.nets import init_params
from dl2d.policy.dl2.scheduler import Decision, WindowRecord, decide
from dl2d.policy.dl2.slot import GREEDY, SAMPLE


def first_state(cfg: PolicyConfig, records: list[WindowRecord]) -> np.ndarray:
    """The state the policy saw first in a slot (the s' of the previous slot's transitions)."""
    if records and len(records[0].actions):
        return records[0].states[0]
    return np.zeros(cfg.state_dim, np.float32)


def push_slot(replay: Replay, records: list[WindowRecord], reward: float, next_state: np.ndarray, done: float) -> int:
    """Add one slot's transitions (all sharing the slot's reward, as in DL2); returns how many."""
    n = 0
    for r in records:
        replay.add(r.states, r.masks, r.actions, reward, next_state, done)
        n += len(r.actions)
    return n


@dataclass
class OnlineStats:
    updates: int = 0
    transitions: int = 0
    last_loss: float | None = None
    reverts: int = 0  # times the parameters were put back to the last good ones (dl2d.policy.target.online)


class OnlineLearner:
    """Holds the policy parameters, the optimiser state and the replay buffer across slots."""

    name = "dl2"

    def __init__(self, cfg: PolicyConfig, params, opt_state=None, *, learn: bool = True, seed: int = 0,
                 version: int = 0):
        self.cfg, self.params, self.learn = cfg, params, learn
        self.opt = make_optimizer(cfg.rl_lr)
        self.opt_state = opt_state if opt_state is not None else self.opt.init(params)
        self.replay = Replay(cfg, seed=seed) if learn else None  # tens of MB: only when learning
        self.key = jax.random.PRNGKey(seed)
        self.version = version  # bumped by every update; recorded with each decision
        self.stats = OnlineStats()
        self._pending: tuple[list[WindowRecord], float] | None = None
        self._last: Decision | None = None

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, learn: bool, seed: int = 0) -> "OnlineLearner":
        ck = load(path)
        return cls(ck.config, ck.params, ck.opt_state, learn=learn, seed=seed,
                   version=int(ck.meta.get("policy_version", 0)))

    @classmethod
    def untrained(cls, cfg: PolicyConfig = PolicyConfig(), *, learn: bool, seed: int = 0) -> "OnlineLearner":
        return cls(cfg, init_params(cfg, jax.random.PRNGKey(seed)), learn=learn, seed=seed)

    def __call__(self, view: SlotView):
        """The slot's allocation: sampled (with job-aware exploration) when learning, greedy otherwise."""
        self.key, sub = jax.random.split(self.key)
        mode = SAMPLE if self.learn else GREEDY
        d = decide(self.cfg, self.params, sub, view, mode=mode, epsilon=self.cfg.epsilon if self.learn else 0.0,
                   record=self.learn)
        self._last = d
        return d.allocation

    def applied(self, view: SlotView, allocation: Allocation, overridden: bool) -> None:
        """The guardrails overrode the last decision: its actions were not carried out, do not learn from them."""
        if overridden:
            self._last = None

    def observe(self, reward: float) -> OnlineStats:
        """The reward of the slot just decided; learns when enough transitions are buffered."""
        if not self.learn:
            return self.stats
        d, self._last = self._last, None
        records = d.records if d is not None else []
        if self._pending is not None:
            self.stats.transitions += push_slot(self.replay, *self._pending, first_state(self.cfg, records), 0.0)
        self._pending = (records, float(reward)) if records else None
        if self.replay.size >= self.cfg.minibatch:
            for _ in range(self.cfg.updates_per_slot):
                self.params, self.opt_state, loss, _aux = rl_update(self.cfg, self.opt, self.params, self.opt_state,
                                                                    self.replay.sample(self.cfg.minibatch))
                self.stats.updates += 1
                self.stats.last_loss = float(loss)
                self.version += 1
        return self.stats

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        save(path, Checkpoint(self.cfg, self.params, self.opt_state,
                              {**(meta or {}), "policy_version": self.version, "updates": self.stats.updates}))
