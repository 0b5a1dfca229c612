"""Target-size policy: a learned size for every job, filled in shortest-remaining-work order.

Why a second action structure beside DL2's: DL2 hands out one task per inference, so a slot of a 64-GPU cluster
is hundreds of inferences, and its probability a product of hundreds of terms that all share one reward. Here a
slot is one decision per job (issue #16): the network reads every job at once (a job's own features with the
cluster's, pooled over the jobs: the same weights for any number of jobs) and picks each job's target size
among a few ``levels`` (0 keeps it waiting); a slot's log-probability is the sum over the active jobs, a few
dozen terms. What is not learned is the fill: jobs in shortest-remaining-work order (as the elastic heuristic)
take their target or what still fits, in bundles (a worker, and a PS for a PS job).

Everything the network sees comes from :func:`job_features`, a pure function of arrays that the simulator's
JAX environment provides (training, dl2d.policy.ppo) and a :class:`~dl2d.core.contract.SlotView` holds too (the
daemon's and the NumPy simulator's side; not wired yet: the policy is not registered): the remaining work at
one worker, age, last size, demand, and the job's estimated speed-up at each level (the speed model the
scheduler believes, never the truth).
:func:`teacher_actions` is the elastic heuristic's efficient size on the same arrays, the warm-up's target.
"""
from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp

#: Candidate sizes (workers; a PS job's PS follow from its PS ratio), cut at the cluster's max_workers.
BASE_LEVELS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: PS per worker a PS job may choose (ps = ceil(ratio x workers), at least 1, at most max_ps); an all-reduce job
#: has none (only the first ratio is open to it).
PS_RATIOS = (1.0, 0.5, 0.25)
#: The elastic heuristic's efficiency threshold (dl2d.policy.elastic.EFFICIENCY): the teacher's rule.
TEACHER_EFFICIENCY = 0.6


def levels_for(max_workers: int) -> tuple[int, ...]:
    """The levels of a cluster whose jobs may have up to ``max_workers`` workers."""
    out = sorted({k for k in BASE_LEVELS if k <= max_workers} | {int(max_workers)})
    if len(out) < 2:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    return tuple(out)


@dataclass(frozen=True)
class TargetConfig:
    """The network's shape; static (hashable) so jitted functions take it as a static argument."""

    max_workers: int = 16
    max_ps: int = 16
    hidden: int = 64

    @property
    def levels(self) -> tuple[int, ...]:
        return levels_for(self.max_workers)

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    @property
    def num_actions(self) -> int:
        """Per job: a level and a PS ratio, one categorical over the pairs (level-major)."""
        return self.num_levels * len(PS_RATIOS)

    @property
    def feature_dim(self) -> int:
        return 9 + 2 * self.num_levels


# ------------------------------------------------------------------------------------------ features (pure)

def job_features(cfg: TargetConfig, obs: dict) -> jnp.ndarray:
    """[J, feature_dim] from arrays every side has (``obs``; J rows, ``active`` marks the real ones):

    ``active`` [J] bool, ``remaining_epochs`` [J], ``slots_run`` [J], ``age`` [J] slots since arrival,
    ``prev_workers`` [J], ``worker_gpus`` [J] a bundle's GPUs over a server's, ``allreduce`` [J] bool,
    ``curves`` [J, L] estimated epochs/s at each level, ``slot_seconds`` [], ``capacity_gpus`` [] the cluster's.
    """
    act = obs["active"]
    c = jnp.maximum(obs["curves"], 0.0)
    one = jnp.maximum(c[:, 1], 1e-12)  # level 1 is one worker
    rem_slots = obs["remaining_epochs"] / (one * obs["slot_seconds"])
    lv = jnp.asarray(cfg.levels, c.dtype)
    eff = jnp.where(lv[None, :] > 0, c / (one[:, None] * jnp.maximum(lv[None, :], 1.0)), 0.0)
    speedup = jnp.log1p(c / one[:, None])
    # remaining work's rank among the active jobs (0 = shortest) and how contended the cluster is
    t = jnp.where(act, rem_slots, jnp.inf)
    rank = jnp.sum(act[None, :] & (t[None, :] < t[:, None]), axis=1)
    n_act = jnp.maximum(jnp.sum(act), 1)
    want = teacher_sizes(cfg, c)
    demand = jnp.sum(jnp.where(act, want * obs["worker_gpus"], 0.0)) / jnp.maximum(obs["capacity_gpus"], 1e-9)
    cols = [jnp.log1p(rem_slots), jnp.log1p(obs["slots_run"]), jnp.log1p(obs["age"]),
            obs["prev_workers"] / cfg.max_workers, obs["worker_gpus"], obs["allreduce"].astype(c.dtype),
            rank / n_act, jnp.broadcast_to(jnp.log1p(n_act.astype(c.dtype)), act.shape),
            jnp.broadcast_to(jnp.log1p(demand), act.shape)]
    x = jnp.concatenate([jnp.stack(cols, axis=1), eff, speedup], axis=1)
    return jnp.where(act[:, None], jnp.nan_to_num(x, posinf=50.0), 0.0)


def teacher_sizes(cfg: TargetConfig, curves: jnp.ndarray) -> jnp.ndarray:
    """[J] the elastic heuristic's efficient size on the levels: the largest level k >= 1 whose speed is at
    least TEACHER_EFFICIENCY * k * c(1) and faster than every smaller level (1 when none is)."""
    lv = jnp.asarray(cfg.levels, curves.dtype)
    best_before = jax.lax.cummax(curves, axis=1)
    faster = jnp.concatenate([jnp.ones_like(curves[:, :1], bool), curves[:, 1:] > best_before[:, :-1]], axis=1)
    good = (curves >= TEACHER_EFFICIENCY * lv[None, :] * curves[:, 1:2]) & faster & (lv[None, :] >= 1)
    return jnp.where(good.any(axis=1), jnp.max(jnp.where(good, lv[None, :], 0.0), axis=1), 1.0)


def teacher_actions(cfg: TargetConfig, obs: dict) -> jnp.ndarray:
    """[J] the teacher's action: its size's level, with one PS per worker (the elastic heuristic's bundles)."""
    size = teacher_sizes(cfg, jnp.maximum(obs["curves"], 0.0))
    level = jnp.argmax(jnp.asarray(cfg.levels, size.dtype)[None, :] == size[:, None], axis=1)
    return level * len(PS_RATIOS)


# ------------------------------------------------------------------------------------------ the network

class TargetNet(nn.Module):
    """Per-job logits over (level, PS ratio) pairs and the slot's value; each job's embedding sees the mean embedding of the
    active jobs (a permutation-equivariant set network, any number of jobs)."""

    cfg: TargetConfig

    @nn.compact
    def __call__(self, x, active):
        h = self.cfg.hidden
        m = active[:, None].astype(x.dtype)
        e = nn.relu(nn.Dense(h, name="embed")(x))
        pooled = jnp.sum(e * m, axis=0) / jnp.maximum(jnp.sum(m), 1.0)
        z = jnp.concatenate([e, jnp.broadcast_to(pooled, e.shape)], axis=1)
        z = nn.relu(nn.Dense(h, name="mix")(z))
        logits = nn.Dense(self.cfg.num_actions, name="logits")(z)
        v = nn.relu(nn.Dense(h, name="value_in")(jnp.concatenate([pooled, jnp.sum(e * m, axis=0) / 16.0])))
        return logits, nn.Dense(1, name="value")(v)[0]


def init_params(cfg: TargetConfig, key, jobs: int = 4) -> dict:
    return TargetNet(cfg).init(key, jnp.zeros((jobs, cfg.feature_dim)), jnp.ones(jobs, bool))["params"]


def apply(cfg: TargetConfig, params, x, active, allreduce):
    """(logits [J, L x R], value []) of one slot; an all-reduce job's pairs with a PS ratio other than the first
    are closed (it has no PS)."""
    logits, value = TargetNet(cfg).apply({"params": params}, x, active)
    ratio = jnp.arange(cfg.num_actions) % len(PS_RATIOS)
    return jnp.where(allreduce[:, None] & (ratio[None, :] > 0), -1e9, logits), value


def sizes(cfg: TargetConfig, action, allreduce, dtype=jnp.float32):
    """(workers target [J], PS per worker [J]) of the chosen pairs."""
    level, ratio = action // len(PS_RATIOS), action % len(PS_RATIOS)
    return (jnp.asarray(cfg.levels, dtype)[level],
            jnp.where(allreduce, 0.0, jnp.asarray(PS_RATIOS, dtype)[ratio]))


# ------------------------------------------------------------------------------------------ the fill (pure)

def fill(cfg: TargetConfig, target, ratio, active, worker_demand, ps_demand, capacity, order_key):
    """(workers [J], PS [J]) granted: jobs in ``order_key`` order (smallest first; inactive last) take their
    ``target`` workers with ``ceil(ratio x workers)`` PS (at least one for a PS job: ``ratio`` > 0), or the
    most workers that still fit the aggregate ``capacity`` [3] with their PS. Pure; never over capacity, never
    more than the target, nothing for an inactive job."""
    order = jnp.argsort(jnp.where(active, order_key, jnp.inf))
    k = jnp.arange(cfg.max_workers + 1, dtype=worker_demand.dtype)

    def body(free, j):
        ps = jnp.where(ratio[j] > 0, jnp.clip(jnp.ceil(k * ratio[j]), 1, cfg.max_ps), 0.0)
        ps = jnp.where(k > 0, ps, 0.0)
        need = k[:, None] * worker_demand[j][None, :] + ps[:, None] * ps_demand[j][None, :]
        ok = jnp.all(need <= free[None, :] + 1e-6, axis=1) & (k <= target[j]) & active[j]
        w = jnp.max(jnp.where(ok, k, 0.0))
        i = w.astype(jnp.int32)
        return free - need[i], (j, w, ps[i])

    _, (idx, w, ps) = jax.lax.scan(body, jnp.asarray(capacity, worker_demand.dtype), order)
    zero = jnp.zeros(target.shape, worker_demand.dtype)
    return zero.at[idx].set(w), zero.at[idx].set(ps)
