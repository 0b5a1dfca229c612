"""Goodput: a job's training progress per second at a placement and total batch, throughput times statistical
efficiency (Pollux, OSDI'21, section 3), and the total batch that maximises it for an allocation.

Progress is counted in iterations at the model's initial batch (dl2d.workload.efficiency): one iteration at total
batch M makes ``gain(M, epoch)`` of them and takes the measured seconds of M split over the GPUs
(dl2d.workload.batching: the per-GPU cap, gradient accumulation beyond it). So goodput = gain / seconds per
iteration. The best batch is searched as Pollux searches it: 50 totals spaced geometrically from the larger of the
initial batch and the smallest local batch on every GPU, to the largest measured batch (or the job's own limit).

``stats`` (grad_sqr, grad_var) are the gradient statistics a scheduler knows of the job (measured by the job, as
AdaptDL measures them); without them, the model's measured ones at the job's epoch (what the simulator trains by).
"""
from __future__ import annotations

import functools

import numpy as np

from dl2d.workload import batching, efficiency, throughput

#: total batches tried for an allocation (the Pollux artifact's 50)
CANDIDATES = 50


def goodput(model: str, placement: throughput.Placement, batch: float, epoch: int, stats=None,
            off_table: str = "fit", one_gpu_accumulates: bool = False, max_local: float | None = None) -> float:
    """Progress per second of ``model`` at total batch ``batch`` on ``placement`` during ``epoch`` (``max_local``:
    the job's own per-GPU limit, dl2d.workload.batching.job_limits)."""
    seconds, trained = batching.iteration_seconds(model, placement, batch, off_table, one_gpu_accumulates, max_local)
    r = efficiency.runs(model)
    g = efficiency.gain(r, trained, epoch) if stats is None else efficiency.gain_of(stats, trained, r.init)
    return g / seconds


def relative_goodput(model: str, placement: throughput.Placement, batch: float, base: float, epoch: int,
                     stats=None, max_local: float | None = None) -> float | None:
    """How many times the goodput at ``base`` the goodput at ``batch`` is on ``placement`` (None where the base
    makes no progress)."""
    now, then = (goodput(model, placement, b, epoch, stats, max_local=max_local) for b in (batch, base))
    return float(now / then) if then > 0 else None


def candidates(model: str, gpus: int, max_total: float | None = None) -> np.ndarray:
    """The total batches tried on ``gpus`` GPUs (module docstring); empty when none fits the limits."""
    lim = batching.limits(model)
    top = float(lim.max_total if max_total is None else min(max_total, lim.max_total))
    low = max(float(lim.init), lim.min_local * gpus)
    if low > top:
        return np.zeros(0)
    return np.geomspace(low, top, CANDIDATES)


@functools.lru_cache(maxsize=65536)
def best_batch(model: str, placement: throughput.Placement, epoch: int, stats=None, max_total: float | None = None,
               off_table: str = "fit", one_gpu_accumulates: bool = False, max_local: float | None = None
               ) -> tuple[float, float]:
    """(total batch, its goodput) of the best candidate on ``placement``; (0, 0) where none fits. (``stats``, when
    given, a tuple: the answers are kept.)"""
    best = (0.0, 0.0)
    for m in candidates(model, sum(placement), max_total):
        g = goodput(model, placement, float(m), epoch, stats, off_table, one_gpu_accumulates, max_local)
        if g > best[1]:
            best = (float(m), g)
    return best
