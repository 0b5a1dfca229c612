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


@functools.lru_cache(maxsize=65536)
def _seconds(model: str, placement: throughput.Placement, batch: float, off_table: str, one_gpu_accumulates: bool,
             max_local: float | None) -> tuple[float, float]:
    """dl2d.workload.batching.iteration_seconds, kept: a step's time does not depend on the epoch, and a scheduler
    asks for the same batches on the same placements epoch after epoch."""
    return batching.iteration_seconds(model, placement, batch, off_table, one_gpu_accumulates, max_local)


def _gains(model: str, trained, epoch: int, stats=None):
    """:func:`efficiency.gain` (or :func:`efficiency.gain_of` with ``stats``) at each total batch ``trained``
    during ``epoch``, element-wise over an array of batches (the same arithmetic as one at a time)."""
    r = efficiency.runs(model)
    return efficiency.gain_of(efficiency.grad_stats_at(r, trained, epoch) if stats is None else stats, trained, r.init)


def goodput(model: str, placement: throughput.Placement, batch: float, epoch: int, stats=None,
            off_table: str = "fit", one_gpu_accumulates: bool = False, max_local: float | None = None) -> float:
    """Progress per second of ``model`` at total batch ``batch`` on ``placement`` during ``epoch`` (``max_local``:
    the job's own per-GPU limit, dl2d.workload.batching.job_limits)."""
    seconds, trained = _seconds(model, placement, float(batch), off_table, one_gpu_accumulates, max_local)
    return float(_gains(model, trained, epoch, stats)) / seconds


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


@functools.lru_cache(maxsize=16384)
def _candidate_seconds(model: str, placement: throughput.Placement, max_total: float | None, off_table: str,
                       one_gpu_accumulates: bool, max_local: float | None) -> tuple[np.ndarray, ...]:
    """(candidates, seconds per iteration at each, the total batch each trains) on ``placement``."""
    cands = candidates(model, sum(placement), max_total)
    times = [_seconds(model, placement, float(m), off_table, one_gpu_accumulates, max_local) for m in cands]
    return cands, np.array([t for t, _ in times]), np.array([b for _, b in times])


@functools.lru_cache(maxsize=65536)
def best_batch(model: str, placement: throughput.Placement, epoch: int, stats=None, max_total: float | None = None,
               off_table: str = "fit", one_gpu_accumulates: bool = False, max_local: float | None = None
               ) -> tuple[float, float]:
    """(total batch, its goodput) of the best candidate on ``placement`` (the first of the best, in the candidates'
    order); (0, 0) where none fits. (``stats``, when given, a tuple: the answers are kept.)"""
    cands, seconds, trained = _candidate_seconds(model, placement, max_total, off_table, one_gpu_accumulates,
                                                 max_local)
    if not len(cands):
        return 0.0, 0.0
    g = np.asarray(_gains(model, trained, epoch, stats), float) / seconds
    k = int(np.argmax(np.where(np.isfinite(g), g, 0.0)))
    return (float(cands[k]), float(g[k])) if g[k] > 0 else (0.0, 0.0)
