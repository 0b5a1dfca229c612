"""Online learning for the target-size policy (``dl2-target`` with ``policy.online_rl``), with a revert rule.

The daemon's live slots are learned from with training's own update (dl2d.policy.target.ppo): every job's
(workers, PS) pair is sampled from the policy, the fill places it (dl2d.policy.target.view.TargetPolicy.place), and
each job present in a slot is charged the slot, over ``reward_jobs`` (the job count the checkpoint trained
with, so the value head keeps its scale): summed, minus the average JCT, as in the JAX environment. A job that
is gone at the next slot (finished, or cancelled) ends its episode there. Every ``window`` slots (8 by default,
so a cluster of a few jobs learns as soon as a large one) the pairs of those slots get per-job GAE advantages,
bootstrapped from the values of the slot being decided, and four epochs of clipped PPO in two minibatches.
A pair the daemon did not carry out as the policy chose it (the guardrails' fallback, the hysteresis holding a
resize) is not learned from, though its slots still count in the returns of the jobs around it.

**The revert rule.** Each slot the learner also asks the fallback heuristic (``guardrails.fallback``) and the
last good parameters (greedy) what they would do on the same view, and scores the three allocations the same
way (:func:`slot_score`: the sum over jobs of the share of its remaining work the allocation trains in the
slot, at the speeds the scheduler believes). When a window closes, the parameters that decided it are judged
on it: if their total score is below ``1 - margin`` (0.8 by default) of the fallback's *and* of the last good
parameters', they are put back to the last good ones, the optimiser starts again and the revert is reported
(:meth:`OnlineTargetLearner.take_reverts`: the daemon records it as a ``policy_revert`` event); the window
is not learned from. Otherwise those parameters become the last good ones and the update runs. The last
good parameters are at first the checkpoint the daemon started from; a window they decided themselves (the
first, and the first after a revert) is learned from without a verdict. Below the fallback alone is not
enough: in a phase where every policy of this kind scores below the fallback (one long job left, which the
fallback gives every GPU), a revert would change nothing, every window. The score is a proxy that favours
finishing short jobs, as the JCT does; it uses the scheduler's speed estimates, since what the fallback would
really have done is never observed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.target import ppo as PPO
from dl2d.policy.target import policy as T
from dl2d.policy.target import view as TV
from dl2d.policy.checkpoint import TargetCheckpoint, load_target, save_target
from dl2d.policy.dl2.online import OnlineStats
from dl2d.policy.registry import ONLINE_EXPLORE

#: Online PPO: training's loss and learning rate, fewer samples per update (a window of live slots).
ONLINE_PPO = PPO.PPOConfig(lr=1e-4, ent_coef=0.0, epochs=4, minibatches=2, credit="job")


def slot_score(view: SlotView, alloc: Allocation) -> float:
    """The sum over jobs of the share of its remaining (estimated) work ``alloc`` trains in the slot at the
    speeds the scheduler believes (``view.est_speed``), each at most 1: the revert rule's measure."""
    if not len(view):
        return 0.0
    w = np.minimum(np.asarray(alloc.workers, int), view.max_workers)
    p = np.where(view.allreduce, 0, np.minimum(np.asarray(alloc.ps, int), view.max_ps))
    rate = view.est_speed[np.arange(len(view)), p, w]
    share = rate * view.slot_seconds / np.maximum(np.asarray(view.remaining_epochs, float), 1e-9)
    return float(np.minimum(share, 1.0).sum())


@dataclass(frozen=True)
class RevertRule:
    """Put the parameters back when a window's score is below ``1 - margin`` of the fallback's and of the last
    good parameters'."""

    margin: float = 0.2

    def __post_init__(self):
        if not 0 <= self.margin < 1:
            raise ValueError(f"revert margin must be in [0, 1), got {self.margin}")

    def verdict(self, learned: list[float], fallback: list[float], good: list[float]) -> str | None:
        """Why the window fails the rule, or None when it passes: the learning parameters' score is below
        ``1 - margin`` of the fallback's and of the last good parameters' (greedy) on the same views. (Below
        the fallback alone is not enough: where the good parameters score as low, a revert changes nothing.)"""
        a, b, g = float(np.sum(learned)), float(np.sum(fallback)), float(np.sum(good))
        keep = 1 - self.margin
        if b > 0 and a < keep * b and a < keep * g:
            return (f"the learning policy's score over {len(learned)} slots was {a:.3g}, below {keep:.0%} of the "
                    f"fallback's {b:.3g} and of the last good parameters' {g:.3g} on the same views")
        return None


@dataclass
class _Slot:
    """One decided slot, as the update needs it (one row per job of the view)."""

    job_ids: np.ndarray
    x: np.ndarray
    allreduce: np.ndarray
    learn: np.ndarray  # the pair was the policy's own (a kind it knows) and was carried out as chosen
    action: np.ndarray
    log_prob: np.ndarray
    value: np.ndarray
    allocation: Allocation
    score: float
    fallback_score: float
    good_score: float  # the last good parameters' greedy allocation's (NaN: they are the deciding ones)


def good_path(path: str | Path) -> Path:
    """Where the last good parameters are saved beside an online checkpoint."""
    return Path(f"{path}.good")


@partial(jax.jit, static_argnames=("tcfg", "pcfg"))
def _update(tcfg: T.TargetConfig, pcfg: PPO.PPOConfig, net, opt_state, batch, last_value, key):
    """GAE per job over a window [K, rows] and clipped-PPO epochs over its slots: (net, opt_state, stats)."""
    adv, ret = PPO.gae(pcfg, batch["reward"], batch["value"], batch["done"], last_value)
    learn = batch["learn"]
    mean = PPO.masked_mean(adv, learn)
    std = jnp.sqrt(PPO.masked_mean((adv - mean) ** 2, learn))
    adv = jnp.where(learn, (adv - mean) / (std + 1e-8), 0.0)
    data = {k: batch[k] for k in ("x", "active", "allreduce", "idx", "logp", "learn")}
    return PPO.update(tcfg, pcfg, net, opt_state, {**data, "adv": adv, "ret": ret}, key)


class OnlineTargetLearner(TV.TargetPolicy):
    """The target-size policy learning from the daemon's slots (module docstring). A Policy and a Learner."""

    def __init__(self, cfg: T.TargetConfig, params, *, fallback, window: int = 8, margin: float = 0.2,
                 reward_jobs: int = 40, seed: int = 0, version: int = 0, good_params=None,
                 good_version: int | None = None, meta: dict | None = None,
                 name: str = "dl2-target", kinds: tuple[str, ...] = ("ps", "allreduce"),
                 temperature: float = 1.0, explore: str = "every", pcfg: PPO.PPOConfig = ONLINE_PPO,
                 whole_nodes: bool = False):
        if window < pcfg.minibatches:
            raise ValueError(f"online window must be at least {pcfg.minibatches} slots, got {window}")
        if explore not in ONLINE_EXPLORE:
            raise ValueError(f"online explore must be one of {', '.join(ONLINE_EXPLORE)}, got {explore!r}")
        # which jobs sample their pair: "every" job, every slot; or only those "resizing" anyway (not running yet,
        # or whose greedy pair changes what they hold), the others keeping their greedy pair, not learned from.
        # Why: where every change of size is a restart, a running job sampled away from its greedy pair pays a
        # restart (and one more to come back); a job that restarts anyway explores for free.
        self.explore = explore
        super().__init__(cfg, params, name=name, kinds=kinds, whole_nodes=whole_nodes)
        pcfg = dataclasses.replace(pcfg, temperature=temperature)
        self.fallback, self.window, self.rule = fallback, int(window), RevertRule(margin)
        self.reward_jobs, self.pcfg, self.meta = max(int(reward_jobs), 1), pcfg, dict(meta or {})
        self.opt = PPO.make_optimizer(pcfg)
        self.opt_state = self.opt.init(params)
        self.good_params = params if good_params is None else good_params
        self.version = int(version)
        self.good_version = self.version if good_params is None or good_version is None else int(good_version)
        self.stats = OnlineStats()
        self.key = jax.random.PRNGKey(seed)
        self._sample = jax.jit(lambda p, o, k: T.decide(cfg, p, o, self.kinds, key=k, temperature=temperature))
        self._values = jax.jit(lambda p, o: T.decide(cfg, p, o, self.kinds)["value"])
        self._closed: list[_Slot] = []
        self._pending: _Slot | None = None
        self._reverts: list[dict] = []

    # ------------------------------------------------------------------------------------------ the Policy

    def __call__(self, view: SlotView) -> Allocation:
        n = len(view)
        obs = TV.view_obs(self.cfg, view)
        padded = TV.padded(obs, n)
        if len(self._closed) >= self.window:
            values = np.asarray(self._values(self.params, padded))[:n]
            self._end_window(dict(zip(map(int, view.job_ids), values)))
        self.key, k = jax.random.split(self.key)
        out = {name: np.asarray(a)[:n] for name, a in self._sample(self.params, padded, k).items()}
        learn = out["known"].astype(bool)
        if self.explore == "resizing":
            greedy = out["greedy"]  # the same network call's argmax
            held = self.place(view, greedy, obs)  # what the greedy pairs give each job, after the fill
            resizing = (np.asarray(view.prev_workers) == 0) | (np.asarray(held.workers) != view.prev_workers) | (
                np.asarray(held.ps) != view.prev_ps)
            out["action"] = np.where(resizing, out["action"], greedy)
            learn &= resizing
        alloc = self.place(view, out["action"], obs)
        good = np.nan
        if self.good_params is not self.params:
            good = slot_score(view, self.place(view, np.asarray(self._decide(self.good_params, padded))[:n], obs))
        self._pending = _Slot(np.asarray(view.job_ids, int), out["x"], np.asarray(view.allreduce, bool),
                              learn, out["action"], out["log_prob"], out["value"], alloc,
                              slot_score(view, alloc), slot_score(view, self.fallback(view)), good)
        return alloc

    def applied(self, view: SlotView, allocation: Allocation, overridden: bool) -> None:
        """What was carried out: a job whose size differs from the policy's fill is not learned from."""
        s = self._pending
        if s is None or len(s.job_ids) != len(view) or not np.array_equal(s.job_ids, view.job_ids):
            return
        same = (np.asarray(allocation.workers) == s.allocation.workers) & (np.asarray(allocation.ps) == s.allocation.ps)
        s.learn = s.learn & same

    def observe(self, reward: float) -> OnlineStats:
        """The slot decided last has run (its own reward is the jobs' time, known from the next view)."""
        if self._pending is not None:
            self._closed.append(self._pending)
            self.stats.transitions += int(self._pending.learn.sum())
            self._pending = None
        return self.stats

    # ------------------------------------------------------------------------------------------ learning

    def _end_window(self, next_values: dict[int, float]) -> None:
        """Judge the parameters that decided the closed window (the revert rule), then learn from it."""
        slots, self._closed = self._closed, []
        judged = not any(np.isnan(s.good_score) for s in slots)  # decided by parameters newer than the good ones
        why = self.rule.verdict([s.score for s in slots], [s.fallback_score for s in slots],
                                [s.good_score for s in slots]) if judged else None
        if why is not None:
            self.params, self.opt_state = self.good_params, self.opt.init(self.good_params)
            self.version += 1
            self.stats.reverts += 1
            self._reverts.append({"reason": why, "policy_version": self.version, "good_version": self.good_version,
                                  "slots": len(slots)})
            return
        if judged:
            self.good_params, self.good_version = self.params, self.version
        batch, last_value = window_batch(slots, next_values, self.reward_jobs, self.cfg.feature_dim)
        if not batch["learn"].any():
            return
        self.key, k = jax.random.split(self.key)
        self.params, self.opt_state, stats = _update(self.cfg, self.pcfg, self.params, self.opt_state, batch,
                                                     last_value, k)
        self.stats.updates += 1
        self.stats.last_loss = float(stats["loss"])
        self.version += 1

    def take_reverts(self) -> list[dict]:
        """The reverts since the last call (each: reason, policy_version, good_version, slots)."""
        out, self._reverts = self._reverts, []
        return out

    # ------------------------------------------------------------------------------------------ checkpoints

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        """The learning parameters at ``path``, the last good ones beside it (:func:`good_path`)."""
        base = {**self.meta, **(meta or {}), "updates": self.stats.updates, "reverts": self.stats.reverts}
        save_target(good_path(path), TargetCheckpoint(self.cfg, self.good_params,
                                                      {**base, "policy_version": self.good_version}))
        save_target(path, TargetCheckpoint(self.cfg, self.params, {**base, "policy_version": self.version,
                                                                   "good_version": self.good_version}))

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, fallback, **kwargs) -> OnlineTargetLearner:
        """From a trained checkpoint, or an online one (then its last good parameters too, when saved)."""
        from dl2d.policy.target.entry import trained_kinds

        ck = load_target(path)
        good = load_target(good_path(path)) if good_path(path).exists() else None
        return cls(ck.config, ck.params, fallback=fallback, version=int(ck.meta.get("policy_version", 0)),
                   good_params=good.params if good else None,
                   good_version=int(good.meta.get("policy_version", 0)) if good else None,
                   meta=ck.meta, reward_jobs=int(ck.meta.get("jobs") or 40),
                   kinds=trained_kinds(ck.meta), **kwargs)


def window_batch(slots: list[_Slot], next_values: dict[int, float], reward_jobs: int, features: int):
    """A window's slots as the update's arrays [K, rows], one column per job seen in it (padded as a view is,
    :func:`dl2d.policy.target.view.padded_rows`), and the bootstrap values [rows] of the jobs still present at the
    next slot."""
    ids = sorted({int(j) for s in slots for j in s.job_ids})
    rows = TV.padded_rows(len(ids))
    col = {j: c for c, j in enumerate(ids)}
    k = len(slots)
    f32 = np.float32
    b = {"x": np.zeros((k, rows, features), f32), "active": np.zeros((k, rows), bool),
         "allreduce": np.zeros((k, rows), bool), "learn": np.zeros((k, rows), bool),
         "idx": np.zeros((k, rows), np.int32), "logp": np.zeros((k, rows), f32), "value": np.zeros((k, rows), f32),
         "reward": np.zeros((k, rows), f32), "done": np.zeros((k, rows), bool)}
    for t, s in enumerate(slots):
        c = np.array([col[int(j)] for j in s.job_ids], int)
        after = {int(j) for j in slots[t + 1].job_ids} if t + 1 < k else set(next_values)
        b["x"][t, c], b["active"][t, c], b["allreduce"][t, c] = s.x, True, s.allreduce
        b["learn"][t, c], b["idx"][t, c], b["logp"][t, c], b["value"][t, c] = s.learn, s.action, s.log_prob, s.value
        b["reward"][t, c] = -1.0 / reward_jobs
        b["done"][t, c] = [int(j) not in after for j in s.job_ids]
    last = np.zeros(rows, f32)
    for j, v in next_values.items():
        if j in col:
            last[col[j]] = v
    return b, last


def as_scheduler(learner: OnlineTargetLearner):
    """The learner as a plain scheduler for the simulator, driven as the daemon drives it: the slot before is
    closed, the view decided, the decision carried out as chosen (benchmarks: bench/bench_online_target.py,
    bench/bench_today.py's ``dl2-target@online``)."""

    def decide(view: SlotView) -> Allocation:
        learner.observe(0.0)
        alloc = learner(view)
        learner.applied(view, alloc, overridden=False)
        return alloc

    decide.name = f"{learner.name}@online"
    return decide
