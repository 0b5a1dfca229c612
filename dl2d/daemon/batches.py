"""Adaptive batches in the daemon: what it learns of a job's gradient noise from the job's reports, and the batch
each adaptive job starts at. Pure functions; the slot loop stores what they return.

A job submitted with ``adaptive_batch`` (docs/jobs.md) lets dl2d choose its total batch. The daemon gives it, at
every (re)start, the batch of the highest goodput on the GPUs it gets (dl2d.policy.elastic.goodput; a policy that
chooses batches itself, its own), within the job's limits; the job reads it from ``DL2D_BATCH_SIZE``. The job's
reports of its gradient noise (``grad_sqr``, ``grad_var`` at its submitted batch, as dl2d.job.batch measures
them) are fitted against its model's measured statistics (dl2d.workload.efficiency.NoiseFit), one report a slot
in which it trained; before it has reported, its model's measured ones stand.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.registry import BATCH_RULES
from dl2d.workload import batching, efficiency, throughput
from dl2d.workload.catalog import MODEL_NAMES


def learned_noise(spec: Mapping[str, Any], model: str, batch: float, epochs_done: float,
                  stored: Mapping[str, Any] | None, reported: tuple[float, float] | None) -> dict[str, Any] | None:
    """The job's noise fit after its latest report, as stored (JSON), or None when it does not change: a job that
    is not adaptive, no report, or none since the last counted (the job has not trained since). ``reported`` is the
    job's own (|G|^2, the variance at its submitted batch); the fit is at its model's initial batch."""
    if reported is None or not spec.get("adaptive_batch") or model not in efficiency.MODELS:
        return None
    fit = efficiency.NoiseFit.from_json(stored)
    if epochs_done <= fit.epochs:
        return None
    init = batching.limits(model).init
    submitted = float(spec.get("batch_size") or init)
    sqr, var = reported
    at_init = (sqr, var * submitted / init)  # tr(S) / M0 of the model's M0
    prior = efficiency.job_prior(model, batch, epochs_done)
    return efficiency.fit_noise(fit, at_init, prior, epochs_done).to_json()


def believed_view(view: SlotView, rule: str = "goodput") -> SlotView:
    """The view the policy decides on: under ``rule`` "goodput" each adaptive job's believed speed at every size is
    that of its best batch there (dl2d.policy.elastic.goodput.goodput_speeds), so any policy sizes it knowing its
    batch grows with its GPUs."""
    if rule == "fixed" or view.adaptive is None or not np.any(view.adaptive):
        return view
    from dl2d.policy.elastic.goodput import goodput_speeds

    return goodput_speeds(view)


def with_batches(view: SlotView, alloc: Allocation, rule: str = "goodput") -> Allocation:
    """``alloc`` with each adaptive job's batch for its (re)start: the policy's own where it chose them, else by
    ``rule``, as the whole number of samples it trains split over its GPUs (dl2d.core.batch)."""
    if rule not in BATCH_RULES:
        raise ValueError(f"batch rule must be one of {', '.join(BATCH_RULES)}, got {rule!r}")
    if rule == "fixed" or alloc.batch_size is not None or view.adaptive is None or not np.any(view.adaptive):
        return alloc
    from dl2d.policy.elastic.goodput import goodput_batches, job_batch_knowledge

    chosen = goodput_batches(view, alloc)
    for j in np.flatnonzero(chosen > 0):  # a whole batch, as the job trains it (its split over its GPUs)
        _, top, local = job_batch_knowledge(view, j)
        gpus = int(alloc.workers[j]) * max(int(round(view.worker_demand[j, 0])), 1)
        lim = batching.job_limits(MODEL_NAMES[int(view.type_idx[j])], top, local)
        atomic, accum = batching.split(float(chosen[j]), gpus, lim)
        chosen[j] = float(atomic * gpus * (accum + 1))
    return replace(alloc, batch_size=chosen)


def batch_detail(spec: Mapping[str, Any], model: str, batch: float | None, noise: Mapping[str, Any] | None,
                 epochs_done: float, gpus: int, nodes: int | None) -> dict[str, Any] | None:
    """What ``dl2ctl show`` says of an adaptive job's batch (None for a job that is not one): its batch now and
    its submitted one, its limits, what dl2d knows of its gradient noise, its statistical efficiency at its batch
    (progress per sample against its submitted batch's, Pollux's E) and its goodput on its GPUs (``gpus`` over
    ``nodes``, evenly; one node where not known) against the submitted batch's there."""
    if not spec.get("adaptive_batch") or model not in efficiency.MODELS:
        return None
    submitted = float(spec.get("batch_size") or batching.limits(model).init)
    now = float(batch or submitted)
    lim = batching.job_limits(model, spec.get("max_batch_size"), spec.get("max_local_batch"))
    fit = efficiency.NoiseFit.from_json(noise)
    stats = efficiency.job_stats(model, now, epochs_done, fit)
    init = batching.limits(model).init
    gain_now, gain_submitted = (float(efficiency.gain_of(stats, b, init)) for b in (now, submitted))
    out: dict[str, Any] = {
        "batch_size": now, "submitted_batch_size": submitted, "max_batch_size": float(lim.max_total),
        "max_local_batch": float(lim.max_local), "noise_reports": fit.reports,
        "noise_scale_vs_model": fit.ratio(), "last_grad_sqr": fit.sqr if fit.reports else None,
        "last_grad_var": fit.var if fit.reports else None,
        "efficiency": (gain_now / gain_submitted) / (now / submitted),
    }
    if gpus > 0:
        from dl2d.workload.goodput import relative_goodput

        placement = throughput.even_spread(gpus, max(1, min(int(nodes or 1), gpus)))
        out["goodput_vs_submitted"] = relative_goodput(model, placement, now, submitted, int(epochs_done), stats,
                                                       lim.max_local)
    return out
