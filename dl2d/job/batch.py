"""A job's side of an adaptive batch: the total batch dl2d gives it split over its workers, the learning-rate
scale for it, and the gradient noise the job measures and reports (which dl2d needs to choose the next batch).

    plan = dl2d.job.batch.plan(total_batch, world_size, max_local_batch)  # plan.per_worker, plan.accumulation_steps
    noise = dl2d.job.batch.GradientNoise(init_batch=initial_total_batch)
    ...  # each step, with the squared norms of each pass's gradient and of their mean:
    noise.update(pass_sqr_norms, mean_sqr_norm, plan.per_worker)
    lr = base_lr * lr_scale(plan.total, initial_total_batch, noise, rule="adascale")

The noise estimate is AdaptDL's: n gradients of b samples each (every worker's, every accumulation pass) and
their mean of n b samples estimate, without bias, the true gradient's squared norm |G|^2 and the per-sample
variance tr(S): E|g_i|^2 = |G|^2 + tr(S) / b and E|mean|^2 = |G|^2 + tr(S) / (n b). It reports them as Pollux
reads them: ``sqr`` = |G|^2 and ``var`` = tr(S) / M0, the variance of a gradient at the initial batch M0, both
smoothed over steps. A larger batch M = s M0 is then worth ``gain = (var + sqr) / (var / s + sqr)`` steps at M0.

Pure Python (floats in, floats out): the norms come from whatever framework the job trains with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from dl2d.core.batch import split

LR_RULES = ("adascale", "linear", "sqrt", "none")


@dataclass(frozen=True)
class BatchPlan:
    """What each worker does with a total batch: ``per_worker`` samples a pass, ``accumulation_steps`` passes more
    before synchronising; ``total`` what all of them train in one step."""

    per_worker: int
    accumulation_steps: int
    world_size: int

    @property
    def total(self) -> int:
        return self.per_worker * (self.accumulation_steps + 1) * self.world_size


def plan(total_batch: float, world_size: int, max_local_batch: float, max_total: float | None = None) -> BatchPlan:
    """The split of ``total_batch`` over ``world_size`` workers of at most ``max_local_batch`` samples a pass."""
    atomic, accum = split(total_batch, world_size, max_local_batch, max_total)
    return BatchPlan(atomic, accum, int(world_size))


class GradientNoise:
    """Smoothed estimates of |G|^2 and the gradient variance at the initial batch (module docstring)."""

    def __init__(self, init_batch: float, smoothing: float = 0.9):
        if not init_batch > 0 or not 0 <= smoothing < 1:
            raise ValueError("GradientNoise needs init_batch > 0 and smoothing in [0, 1)")
        self.init_batch = float(init_batch)
        self.smoothing = smoothing
        self._sqr = self._var = None  # the running means, before bias correction

    def update(self, pass_sqr_norms, mean_sqr_norm: float, pass_batch: float) -> None:
        """One step's estimate: the squared norm of each of its n >= 2 pass gradients (each of ``pass_batch``
        samples) and of their mean. A step of one pass on one worker says nothing of the noise: ValueError."""
        norms = [float(x) for x in pass_sqr_norms]
        n = len(norms)
        if n < 2:
            raise ValueError("the gradient noise needs at least two gradients a step (workers or passes)")
        if not all(math.isfinite(x) and x >= 0 for x in norms + [float(mean_sqr_norm)]) or not pass_batch > 0:
            raise ValueError("squared norms must be finite and >= 0, and the pass batch > 0")
        b = float(pass_batch)
        trace = (sum(norms) / n - mean_sqr_norm) / (1 / b - 1 / (n * b))
        sqr = mean_sqr_norm - trace / (n * b)
        var = trace / self.init_batch
        m = self.smoothing
        self._sqr = sqr if self._sqr is None else m * self._sqr + (1 - m) * sqr
        self._var = var if self._var is None else m * self._var + (1 - m) * var

    @property
    def known(self) -> bool:
        return self._sqr is not None

    @property
    def sqr(self) -> float:
        """|G|^2 (at least a tiny positive number: an estimate may dip below 0 on a noisy step)."""
        return max(self._sqr, 1e-12) if self._sqr is not None else math.nan

    @property
    def var(self) -> float:
        return max(self._var, 0.0) if self._var is not None else math.nan

    def gain(self, total_batch: float) -> float:
        """Steps at the initial batch one step at ``total_batch`` is worth (1 until the noise is known)."""
        if not self.known:
            return 1.0
        scale = float(total_batch) / self.init_batch
        return (self.var + self.sqr) / (self.var / scale + self.sqr)


def lr_scale(total_batch: float, init_batch: float, noise: GradientNoise | None = None, rule: str = "adascale"
             ) -> float:
    """The factor on the learning rate tuned for ``init_batch`` at ``total_batch``: AdaScale's gain (Pollux's
    rule; 1 until the noise is known), linear in the batch, its square root, or none."""
    if rule not in LR_RULES:
        raise ValueError(f"rule must be one of {', '.join(LR_RULES)}, got {rule!r}")
    scale = float(total_batch) / float(init_batch)
    if rule == "adascale":
        return noise.gain(total_batch) if noise is not None else 1.0
    return {"linear": scale, "sqrt": math.sqrt(scale), "none": 1.0}[rule]
