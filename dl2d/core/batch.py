"""How a total batch is split over a job's GPUs: the one rule the daemon, the job and the twin speak.

A total batch B on R GPUs asks ``ceil(B / R)`` samples of each. Beyond what one GPU holds in a pass
(``max_local``) each GPU accumulates gradients over ``accum + 1`` passes of ``ceil(local / (accum + 1))`` samples
(its *atomic* batch) before one synchronisation. ``max_total``: the atomic batch is cut so that the total
trained never exceeds it. ``one_gpu_accumulates`` (with ``init``): a job on one GPU whose batch exceeds ``init``
accumulates over at least two passes, as the Pollux artifact's simulator has it (AdaptDL measures the gradient
noise between passes there, having no second worker to compare with).

Pure Python: the job-side helper (dl2d.job) imports it.
"""
from __future__ import annotations

import math


def split(batch: float, gpus: int, max_local: float, max_total: float | None = None, init: float | None = None,
          one_gpu_accumulates: bool = False) -> tuple[int, int]:
    """(atomic batch per GPU per pass, accumulation steps beyond the first pass) of total batch ``batch`` on
    ``gpus`` GPUs (module docstring)."""
    if not math.isfinite(batch) or batch <= 0 or int(gpus) != gpus or gpus < 1:
        raise ValueError(f"a split needs a total batch > 0 and a whole number of GPUs >= 1, got {batch!r} on {gpus!r}")
    if not max_local > 0:
        raise ValueError(f"max_local must be > 0, got {max_local!r}")
    local = math.ceil(batch / gpus - 1e-8)
    accum = math.ceil(local / max_local - 1e-8) - 1
    if one_gpu_accumulates and gpus == 1 and init is not None and batch > init:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    if max_total is not None:
        atomic = min(atomic, int(max_total / (gpus * (accum + 1))))
    return max(atomic, 1), accum
