"""The heuristics the target-size policy (dl2d.policy.target.policy) learns from in its supervised warm-up, as pure JAX
functions of its observation (dl2d.policy.target.ppo.env_obs; dl2d.policy.target.view.view_obs on a SlotView): each gives
every job's action, a (workers, PS) pair index on the policy's levels, which the fill then grants in shortest-
remaining-work order as it grants the policy's own.

- ``optimus``: what Optimus (dl2d.policy.target.marginal) gives each job this slot (DL2's own teacher).
- ``optimus-relative``: Optimus's rule valuing a task by the share of a job's remaining time it cuts
  (dl2d.policy.baselines.optimus.RelativeOptimus; ``relative`` in dl2d.policy.target.marginal): in the DL2 world's contended
  presets the best heuristic.
- ``elastic``: dl2d.policy.elastic.srtf's rule on the levels: every job its efficient size, a running job its size
  when the efficient one would save it too little to pay the restart, then the GPUs left over, one level step
  at a time, to the steps that save the most remaining time per GPU, never past a job's fastest level. In
  today's world this is the best heuristic (docs/BENCHMARKS.md), so the one to start from.

Elastic's spare-GPU loop is a heap in dl2d.policy.elastic.srtf; here it is a sort: every job's level steps above
what the fill granted, ranked by their saving per GPU (made non-increasing along a job's steps, so a job's steps
are taken in order), taken while their GPUs add up to what is free. Counting GPUs only (not cores or memory),
and in level steps (above 8 workers the levels go by 2), it is the heap's rule, not its every grant.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from dl2d.policy.target import policy as T
from dl2d.policy.elastic.srtf import KEEP_GAIN


def optimus(cfg: T.TargetConfig, obs: dict) -> jnp.ndarray:
    """[J] Optimus's pair for each job, rounded down to the levels (dl2d.policy.target.policy.teacher_actions)."""
    return T.teacher_actions(cfg, obs)


def optimus_relative(cfg: T.TargetConfig, obs: dict) -> jnp.ndarray:
    """[J] the relative Optimus's pair for each job, rounded down to the levels as :func:`optimus`'s."""
    from dl2d.policy.target.marginal import optimus_counts

    w, p = optimus_counts(jnp.asarray(obs["speed"]), jnp.asarray(obs["remaining_epochs"]),
                          jnp.asarray(obs["worker_demand"]), jnp.asarray(obs["ps_demand"]),
                          jnp.asarray(obs["allreduce"]), jnp.asarray(obs["active"]),
                          jnp.asarray(obs["arrival_slot"]), jnp.asarray(obs["capacity"]), relative=True)
    return T.teacher_actions(cfg, {**obs, "optimus_workers": w, "optimus_ps": p})


def _pairs(cfg: T.TargetConfig, level_idx, allreduce) -> jnp.ndarray:
    """[J] the action of each job's worker level with as many PS as workers (up to the PS levels; none for an
    all-reduce job), as elastic sizes a PS job."""
    lv = jnp.asarray(cfg.levels, jnp.float32)
    ps = T.level_index(cfg.ps_levels, jnp.minimum(lv[level_idx], cfg.max_ps))
    return level_idx * len(cfg.ps_levels) + jnp.where(allreduce, 0, ps)


def elastic(cfg: T.TargetConfig, obs: dict) -> jnp.ndarray:
    """[J] elastic's pair for each job (the module docstring)."""
    act, rem, c = obs["active"], obs["remaining_epochs"], jnp.maximum(obs["curves"], 0.0)
    rows = jnp.arange(c.shape[0])
    lv = jnp.asarray(cfg.levels, c.dtype)
    want = T.level_index(cfg.levels, T.elastic_sizes(cfg, c))
    prev = T.level_index(cfg.levels, jnp.minimum(obs["prev_workers"], cfg.max_workers))
    t = jnp.where(c > 0, rem[:, None] / jnp.maximum(c, 1e-12), jnp.inf)  # [J, L] remaining time at each level

    keep = (obs["prev_workers"] > 0) & (t[rows, prev] <= t[rows, want] * (1 + KEEP_GAIN))
    base = jnp.where(keep, prev, want)
    target_w = lv[base]
    target_p = jnp.where(obs["allreduce"], 0.0, jnp.minimum(target_w, cfg.max_ps))
    one = jnp.maximum(c[:, 1], 1e-12)
    w, p = T.fill(cfg, target_w, target_p, act, obs["worker_demand"], obs["ps_demand"], obs["capacity"], rem / one)
    granted = T.level_index(cfg.levels, w)
    spare = obs["capacity"][0] - jnp.sum(w * obs["worker_demand"][:, 0] + p * obs["ps_demand"][:, 0])

    # every job's steps granted -> granted + 1 -> ... up to its fastest level, ranked by saving per GPU
    fastest = jnp.argmax(c, axis=1)
    step = jnp.arange(len(cfg.levels) - 1)  # step i: level i -> i + 1
    gpus = (lv[1:] - lv[:-1])[None, :] * (obs["worker_demand"][:, 0] + jnp.where(
        obs["allreduce"], 0.0, obs["ps_demand"][:, 0]))[:, None]
    saving = jnp.where(jnp.isfinite(t[:, :-1]), t[:, :-1] - t[:, 1:], 0.0) / jnp.maximum(gpus, 1e-12)
    ok = (act & ~keep & (w > 0) & (granted == base))[:, None] & (step[None, :] >= granted[:, None]) \
        & (step[None, :] < fastest[:, None])
    saving = jnp.where(ok & (saving > 0), saving, -jnp.inf)
    # a step is never ranked above the one before it (so a job's steps are taken in order)
    saving = jnp.where(step[None, :] >= granted[:, None], saving, jnp.inf)
    saving = jax.lax.cummin(saving, axis=1)
    valid = jnp.isfinite(saving) & ok
    flat_key = jnp.where(valid, saving, -jnp.inf).reshape(-1)
    order = jnp.argsort(-flat_key, stable=True)  # job-major, step order within a job on ties
    cost = jnp.where(valid, gpus, 0.0).reshape(-1)[order]
    taken_sorted = valid.reshape(-1)[order] & (jnp.cumsum(cost) <= spare + 1e-6)
    taken = jnp.zeros_like(taken_sorted).at[order].set(taken_sorted).reshape(valid.shape)
    final = jnp.where(act, granted + jnp.sum(taken, axis=1), 0)
    return _pairs(cfg, final, obs["allreduce"])


TEACHERS: dict[str, Callable] = {"optimus": optimus, "optimus-relative": optimus_relative, "elastic": elastic}  # keys: T.TargetConfig.TEACHERS but lp-plan


def teacher(name: str) -> Callable:
    """The teacher named ``name`` (:data:`TEACHERS`); a ValueError naming the choices otherwise."""
    try:
        return TEACHERS[name]
    except KeyError:
        raise ValueError(f"unknown teacher {name!r}; choices: {', '.join(TEACHERS)}") from None
