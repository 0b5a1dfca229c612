""""Slurm as it is": what the cluster does without dl2d, the baseline every dl2d figure is read against.

Each job gets exactly the workers it asked for (``view.requested``, capped at the per-job maximum; a PS job as
many PS as workers), all at once or not at all, and keeps them on the same servers until it ends: never
resized, never moved, never preempted. Pending jobs start in submission order with EASY backfill, Slurm's
``sched/backfill`` in its simplest form: the first pending job that does not fit gets a reservation at the
time enough GPUs will have freed up (the running jobs' expected ends); a later job may start now if it fits
and either ends before that time or leaves enough GPUs for the reservation.

Expected ends stand for the time limits users give Slurm: the remaining epochs over the job's estimated speed
at its size (``view.est_speed``), with no padding; real users pad their limits, which makes real backfill
start fewer jobs than this. The reservation counts GPUs, not which node they are on.
"""
from __future__ import annotations

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.baselines.heuristics import AllocationBuilder
from dl2d.policy.registry import PolicyOptions, StatelessPolicy


def asked(view: SlotView) -> tuple[np.ndarray, np.ndarray]:
    """(workers, PS) each job asked for, within the view's limits."""
    workers = np.minimum(np.maximum(view.requested, 1), view.max_workers)
    ps = np.where(view.allreduce, 0, np.minimum(workers, view.max_ps))
    return workers, ps


def expected_seconds(view: SlotView, workers, ps) -> np.ndarray:
    """Seconds each job still needs at (ps, workers) by its estimated speed (inf where it would not train)."""
    speed = view.est_speed[np.arange(len(view)), np.asarray(ps, int), np.asarray(workers, int)]
    with np.errstate(divide="ignore"):
        return np.where(speed > 0, view.remaining_epochs / np.where(speed > 0, speed, 1.0), np.inf)


def slurm_fifo(view: SlotView) -> Allocation:
    b = AllocationBuilder(view)
    workers, ps = asked(view)
    gpus = workers * view.worker_demand[:, 0] + ps * view.ps_demand[:, 0]
    left = expected_seconds(view, workers, ps)
    order = np.argsort(view.arrival_slot, kind="stable")
    running = [int(j) for j in order if view.prev_workers[j] > 0]
    for j in running:  # running jobs keep what they have, where they have it
        b.add_gang(j, int(view.prev_workers[j]), int(view.prev_ps[j]), stay=True)
    free_gpus = float(b.placer.free[:, 0].sum())
    ends = sorted((left[j], gpus[j]) for j in running)
    shadow, spare = None, None  # the reservation of the first job that does not fit: its start, GPUs to spare
    for j in (int(j) for j in order if view.prev_workers[j] == 0):
        if shadow is None:
            if b.add_gang(j, int(workers[j]), int(ps[j])):
                free_gpus -= gpus[j]
                ends = sorted(ends + [(left[j], gpus[j])])
                continue
            shadow, freed = np.inf, free_gpus
            for end, g in ends:
                freed += g
                if freed >= gpus[j] - 1e-9:
                    shadow = end
                    break
            spare = freed - gpus[j]
            continue
        ends_in_time = left[j] <= shadow
        if (ends_in_time or gpus[j] <= spare + 1e-9) and b.add_gang(j, int(workers[j]), int(ps[j])):
            if not ends_in_time:
                spare -= gpus[j]
    return b.allocation()


def build(options: PolicyOptions) -> StatelessPolicy:
    return StatelessPolicy(slurm_fifo, "slurm")
