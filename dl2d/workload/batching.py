"""A model's batch limits and a total batch's step time on some GPUs.

A GPU holds at most ``max_local`` samples in a pass (the largest local batch measured for the model in
``data/pollux/<model>/placements.csv``; YOLOv3's 8, as the Pollux artifact sets it, where its table goes to 16).
The split of a total batch into per-GPU passes with gradient accumulation beyond that is the one rule every side
speaks (dl2d.core.batch); an iteration takes ``step + accum x (step - sync)`` seconds of the measured step at
the atomic batch. These are the limits a batch-adapting scheduler keeps to as well: ``init`` (the smallest
measured total batch, the one a job's progress is counted in, dl2d.workload.efficiency) and ``max_total`` (the
largest measured).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from dl2d.core.batch import split as core_split
from dl2d.workload import throughput, workloads

#: Largest local batch per GPU where the Pollux artifact sets one below its measured table's largest.
MAX_LOCAL_OVERRIDE = {"yolov3": 8}


@dataclass(frozen=True)
class BatchLimits:
    """One model's batch limits, in samples."""

    init: int  # the smallest measured total batch: a job's progress is counted in its iterations
    max_total: int  # the largest measured total batch
    min_local: float  # the smallest measured local batch per GPU
    max_local: float  # the most one GPU holds in one pass

    def __post_init__(self):
        if not 0 < self.min_local <= self.max_local or not 0 < self.init <= self.max_total:
            raise ValueError(f"batch limits out of order: {self}")


@functools.cache
def limits(model: str) -> BatchLimits:
    """The packaged measurements' batch limits of ``model``."""
    m = throughput.measurements(model)
    batches = [b for b, _ in workloads.convergence_runs(model)]
    top = float(MAX_LOCAL_OVERRIDE.get(model, np.max(m.local_bsz)))
    return BatchLimits(int(min(batches)), int(max(batches)), float(np.min(m.local_bsz)), top)


def split(batch: float, gpus: int, lim: BatchLimits, one_gpu_accumulates: bool = False) -> tuple[int, int]:
    """(atomic batch per GPU per pass, accumulation steps beyond the first pass) of total batch ``batch`` on
    ``gpus`` GPUs within ``lim`` (dl2d.core.batch.split, the rule every side speaks); the atomic batch never makes
    the total exceed ``lim.max_total``."""
    return core_split(batch, gpus, lim.max_local, lim.max_total, lim.init, one_gpu_accumulates)


def job_limits(model: str, max_total: float | None = None, max_local: float | None = None) -> BatchLimits:
    """``model``'s limits within a job's own (None: the model's): its largest total batch, and the most samples a
    GPU takes in a pass, never below the smallest measured local batch (the step times are measured from there)."""
    lim = limits(model)
    top = lim.max_total if max_total is None else max(min(int(max_total), lim.max_total), lim.init)
    local = lim.max_local if max_local is None else min(max(float(max_local), lim.min_local), lim.max_local)
    return replace(lim, max_total=top, max_local=local)


def iteration_seconds(model: str, placement: throughput.Placement, batch: float, off_table: str = "fit",
                      one_gpu_accumulates: bool = False, max_local: float | None = None) -> tuple[float, float]:
    """(seconds per iteration, the total batch it trains) of ``model`` at total batch ``batch`` on ``placement``,
    split by :func:`split` (``max_local``: the job's own limit, :func:`job_limits`): the measured step of the atomic
    batch plus an accumulation pass's compute for each accumulation step."""
    gpus = sum(placement)
    lim = limits(model) if max_local is None else job_limits(model, max_local=max_local)
    atomic, accum = split(batch, gpus, lim, one_gpu_accumulates)
    step, sync = throughput.throughput_model(model).times(placement, float(atomic), off_table)
    return step + accum * (step - sync), float(gpus * atomic * (accum + 1))
