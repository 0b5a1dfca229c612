"""Teaching the target-size network a planner it cannot run: the bound's program on the speeds the simulator
trains with (dl2d.policy.planning.lp_plan on measured speeds, or its lookahead, dl2d.policy.planning.lp_lookahead), distilled by
supervised learning on the slots it and the network visit in the NumPy simulator (DAgger: the network drives,
the planner labels).

Why: the greedy heuristics the JAX teachers are (dl2d.policy.target.teachers) leave 8-12 % between themselves and the
LP bound in the DL2 world, and the planner on the measured speeds comes within 2-4 % of it; reinforcement
learning from the greedy teachers never found that room (docs/BENCHMARKS.md). The planner reads what no
scheduler has (the measured table the simulator trains with), so it is a teacher, never a policy; the network
sees only its own features (the believed speed curves, remaining work, ...), and what it learns of the true
speeds it learns from the planner's choices. A linear program is no JAX function, so this teacher labels slots
here, outside the jitted training loop: one program a slot, 0.1-0.3 s at 40 jobs.

A label is the pair the planner's allocation grants each job (its workers and PS rounded down to the levels;
a job it leaves waiting: no workers). The loss is the cross-entropy of the network's pair logits on the active
jobs, the same as the JAX warm-up's (dl2d.policy.target.ppo.sl_loss).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dl2d.policy.target import policy as T
from dl2d.policy.target import view as TV
from dl2d.policy.planning.lp_plan import on_measured_speeds
from dl2d.sim import engine as E


@dataclass
class Samples:
    """Slots seen, each padded to ``rows`` jobs: features ``x`` [S, rows, F], ``active``/``allreduce`` [S, rows],
    the planner's pair ``label`` [S, rows] (0 for an inactive row)."""

    x: np.ndarray
    active: np.ndarray
    allreduce: np.ndarray
    label: np.ndarray

    def __len__(self) -> int:
        return len(self.x)

    @staticmethod
    def stack(slots: list[tuple]) -> "Samples":
        """Slots recorded one by one, each (x [J, F], active, allreduce, label [J]), padded to the most rows any
        has (inactive rows)."""
        rows = max(p[0].shape[0] for p in slots)
        pad = lambda a: np.concatenate([a, np.zeros((rows - a.shape[0], *a.shape[1:]), a.dtype)])
        return Samples(*(np.stack([pad(p[i]) for p in slots]) for i in range(4)))

    @staticmethod
    def concat(parts: list["Samples"]) -> "Samples":
        """The slots of ``parts`` together, each part's rows widened to the most any has (inactive rows)."""
        rows = max(p.x.shape[1] for p in parts)
        widen = lambda a: np.concatenate([a, np.zeros((a.shape[0], rows - a.shape[1], *a.shape[2:]), a.dtype)], 1)
        return Samples(*(np.concatenate([widen(getattr(p, f)) for p in parts]) for f in ("x", "active",
                                                                                       "allreduce", "label")))


def pair_labels(tcfg: T.TargetConfig, workers, ps, allreduce) -> np.ndarray:
    """[J] the pair index of each job's granted (workers, PS), each rounded down to a level."""
    w = np.asarray(T.level_index(tcfg.levels, np.minimum(workers, tcfg.max_workers)))
    p = np.asarray(T.level_index(tcfg.ps_levels, np.minimum(ps, tcfg.max_ps)))
    return (w * len(tcfg.ps_levels) + np.where(allreduce, 0, p)).astype(np.int32)


@functools.lru_cache(maxsize=8)
def _jitted_features(tcfg: T.TargetConfig) -> Callable:
    return jax.jit(lambda o: T.job_features(tcfg, T.with_optimus(o)))


def slot_sample(tcfg: T.TargetConfig, obs: dict, view, alloc) -> tuple:
    """One slot of :class:`Samples` (x, active, allreduce, label), for :meth:`Samples.stack`: the features of
    ``obs`` (``view``'s observation, padded here as the network's decision pads it) and ``alloc``'s pairs as the
    labels (0 on the padding). The recorders' one step (this module's and dl2d.policy.planning.plan_net's)."""
    padded = TV.padded(obs, len(view))
    label = np.zeros(len(padded["active"]), np.int32)
    label[:len(view)] = pair_labels(tcfg, alloc.workers, alloc.ps, view.allreduce)
    return (np.asarray(_jitted_features(tcfg)(padded), np.float32), padded["active"].copy(),
            np.asarray(padded["allreduce"], bool), label)


class Recorder:
    """A Policy for one simulator run: records every slot's features and the planner's pairs, and carries out
    the network's choice (``params``) or, without params, the planner's own."""

    def __init__(self, tcfg: T.TargetConfig, planner: Callable, params=None):
        self.tcfg, self.planner, self.params = tcfg, planner, params
        self.net = TV.TargetPolicy(tcfg, params) if params is not None else None
        self.parts: list[tuple] = []
        self.name = "plan-recorder"

    def __call__(self, view):
        plan = self.planner(view)
        if not len(view):
            return plan
        self.parts.append(slot_sample(self.tcfg, TV.view_obs(self.tcfg, view), view, plan))
        return plan if self.net is None else self.net(view)

    def applied(self, view, allocation, overridden: bool) -> None:
        pass

    def observe(self, reward: float) -> None:
        pass

    def samples(self) -> Samples:
        return Samples.stack(self.parts)


def collect(tcfg: T.TargetConfig, cfg: E.SimConfig, traces: list, seeds: list[int], params=None,
            on_trace: Callable[[int, float], None] | None = None, view_factor: bool = False,
            teacher: Callable[[int], Callable] | None = None) -> Samples:
    """The slots of one simulator run per trace, labelled by the teacher, driven by the network (``params``) or
    the teacher. The teacher: ``teacher(seed)``, a policy for the trace of that seed (the lookahead,
    dl2d.policy.planning.lp_lookahead, draws its roundings from it), or by default the planner on the measured speeds
    (times each job's measured speed, the view's ``job_speed_factor``, with ``view_factor``)."""
    parts = []
    for trace, seed in zip(traces, seeds):
        t0 = time.perf_counter()
        planner = teacher(seed) if teacher is not None else on_measured_speeds(cfg, view_factor=view_factor)
        rec = Recorder(tcfg, planner, params)
        res = E.run(trace, rec, cfg, seed=seed)
        parts.append(rec.samples())
        if on_trace is not None:
            on_trace(seed, float(res.jct_slots.mean()), time.perf_counter() - t0)
    return Samples.concat(parts)


def widen(tcfg: T.TargetConfig, params, **changes) -> tuple[T.TargetConfig, dict]:
    """The network ``params`` of ``tcfg`` under ``tcfg`` with ``changes`` that only add to it
    (``every_count=True``: every whole count a level; ``speed_factor=True``: the measured-speed column), choosing
    as before: each new pair's logit is the one of the pair the old levels round it down to, and every new feature
    column (a new level's, the measured speed) enters with zero weight, so the logits of the old pairs are what the
    old network gives the same features. A warm start for learning the planner, whose PS counts the base levels
    do not hold and which reads each job's measured speed."""
    for name, value in changes.items():
        if name not in ("every_count", "speed_factor") or value is not True:
            raise ValueError(f"widen only turns on every_count or speed_factor, got {name}={value!r}")
    new = dataclasses.replace(tcfg, **changes)
    new_l, new_p = np.asarray(new.levels), np.asarray(new.ps_levels)
    pair = (np.asarray(T.level_index(tcfg.levels, new_l))[:, None] * len(tcfg.ps_levels)
            + np.asarray(T.level_index(tcfg.ps_levels, new_p))[None, :]).ravel()
    out = jax.tree_util.tree_map(np.asarray, params)
    for net in ("actor", "critic"):
        out[net]["embed"]["kernel"] = embed_columns(tcfg, new, out[net]["embed"]["kernel"])
    out["logits"]["kernel"] = out["logits"]["kernel"][:, pair]
    out["logits"]["bias"] = out["logits"]["bias"][pair]
    return new, out


def embed_columns(old: T.TargetConfig, new: T.TargetConfig, kernel) -> np.ndarray:
    """The embedding ``kernel`` [old features, hidden] of a network of ``old`` on ``new``'s feature columns: each
    column's row where ``old`` has that column (dl2d.policy.target.policy.feature_columns), 0 for a new one."""
    old_at = {c: i for i, c in enumerate(T.feature_columns(old))}
    rows = np.array([old_at.get(c, -1) for c in T.feature_columns(new)])  # -1: a new column
    k = np.asarray(kernel)
    return np.where(rows[:, None] >= 0, k[np.maximum(rows, 0)], 0.0).astype(k.dtype)


def loss_fn(tcfg: T.TargetConfig, params, x, active, allreduce, label, departure_weight: float = 1.0):
    """Mean cross-entropy of the network's pair on the active rows of a batch of slots; a row whose label is not
    the teacher's pair in its features (a departure: dl2d.policy.planning.plan_net learns them) weighs
    ``departure_weight``, the others 1."""
    logits, _ = T.apply(tcfg, params, x, active, allreduce)
    nll = -T.chosen(jax.nn.log_softmax(logits), label)
    m = active.astype(nll.dtype)
    if departure_weight != 1.0:
        m = m * jnp.where(label != T.features_teacher(tcfg, x), departure_weight, 1.0)
    return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)


@functools.lru_cache(maxsize=8)
def fit_step(tcfg: T.TargetConfig, lr: float, departure_weight: float = 1.0):
    """The optimiser and its jitted step for ``tcfg``, ``lr`` and ``departure_weight`` (:func:`loss_fn`), built
    once: every round of a training (and every test) that fits the same network shape reuses the compiled step
    instead of compiling it again."""
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr))

    @jax.jit
    def step(params, state, x, a, ar, y):
        loss, grad = jax.value_and_grad(lambda p: loss_fn(tcfg, p, x, a, ar, y, departure_weight))(params)
        upd, state = opt.update(grad, state, params)
        return optax.apply_updates(params, upd), state, loss

    return opt, step


def fit(tcfg: T.TargetConfig, params, data: Samples, iters: int, lr: float = 1e-3, batch: int = 256,
        seed: int = 0, on_iter: Callable[[int, float], None] | None = None, departure_weight: float = 1.0):
    """``iters`` Adam steps on minibatches of ``batch`` slots drawn from ``data`` (:func:`loss_fn`); the params and
    the last loss."""
    # fit_step(tcfg, lr) when unweighted: the same cache entry as a caller's that names no weight
    opt, step = fit_step(tcfg, lr) if departure_weight == 1.0 else fit_step(tcfg, lr, float(departure_weight))
    state = opt.init(params)
    rng = np.random.default_rng(seed)
    loss = float("nan")
    for i in range(iters):
        idx = rng.integers(0, len(data), size=min(batch, len(data)))
        params, state, loss = step(params, state, data.x[idx], data.active[idx], data.allreduce[idx],
                                   data.label[idx])
        if on_iter is not None:
            on_iter(i, float(loss))
    return params, float(loss)


def agreement(tcfg: T.TargetConfig, params, data: Samples) -> float:
    """Share of the active rows whose greedy pair is the planner's."""
    logits, _ = jax.jit(lambda p, x, a, ar: T.apply(tcfg, p, x, a, ar))(params, data.x, data.active,
                                                                          data.allreduce)
    pick = np.asarray(jnp.argmax(logits, axis=-1))
    return float(np.sum((pick == data.label) & data.active) / max(np.sum(data.active), 1))
