"""Tiresias (Gu et al., NSDI'19): discretised two-dimensional least-attained-service, without knowing job
lengths.

A job's attained service is the GPU time it has had (GPUs held x time: the "two dimensions"). Jobs sit in
queues by attained service (below 1 GPU-hour, below 10, above: :data:`THRESHOLDS_GPU_S`); every slot the
queues are served in order, first come first served inside each, and each job gets exactly the workers it
asked for, all or nothing. A job that falls to a lower queue, or behind jobs that fit before it, is
preempted (its checkpoint-restart is the simulator's resize cost). A job that has waited longer than
:data:`STARVATION_FACTOR` times the service it has had goes back to the first queue (Tiresias's guard
against starvation). Nothing here reads epochs or speeds: Tiresias needs no job lengths.

Attained service is counted by the policy itself from each slot's view (what every job held last slot x the
slot's length), keyed by job id: a daemon restart starts the count again.

:data:`REFERENCE` is the Tiresias of the Pollux artifact's simulator: two queues split at 16 GPU-hours, no
starvation guard, a queue served in the order jobs entered it (a job demoted later behind one demoted earlier),
and the jobs that keep running placed first, where they were, before any job starts (none is moved to make room).
"""
from __future__ import annotations

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.baselines.heuristics import AllocationBuilder
from dl2d.policy.registry import IgnoresFeedback, PolicyOptions
from dl2d.policy.baselines.slurm_fifo import asked

THRESHOLDS_GPU_S = (3600.0, 36000.0)
STARVATION_FACTOR = 8.0
#: the Pollux artifact's Tiresias (module docstring)
REFERENCE = {"thresholds": (16 * 3600.0,), "starvation_factor": 0.0, "queue_order": "entered", "keep_running": True}


class Tiresias(IgnoresFeedback):
    name = "tiresias"

    def __init__(self, thresholds=THRESHOLDS_GPU_S, starvation_factor: float = STARVATION_FACTOR,
                 queue_order: str = "arrival", keep_running: bool = False):
        """``starvation_factor`` 0: no guard. ``queue_order``: a queue's jobs by "arrival" or by when they
        "entered" it. ``keep_running``: jobs that keep running are placed first, where they were."""
        if queue_order not in ("arrival", "entered"):
            raise ValueError(f"queue_order must be arrival or entered, got {queue_order!r}")
        self.thresholds = np.asarray(thresholds, float)
        self.starvation_factor = starvation_factor
        self.queue_order = queue_order
        self.keep_running = keep_running
        self.attained: dict[int, float] = {}  # job id -> GPU seconds
        self.waited: dict[int, float] = {}  # job id -> seconds without workers since it last ran
        self.entered: dict[int, tuple[int, int]] = {}  # job id -> (queue, slot it entered that queue)
        self._last_slot: int | None = None

    def _account(self, view: SlotView) -> None:
        if self._last_slot == view.slot:  # the same slot decided again: count it once
            return
        self._last_slot = view.slot
        gpus = view.prev_workers * view.worker_demand[:, 0] + view.prev_ps * view.ps_demand[:, 0]
        live = set()
        for j, job in enumerate(view.job_ids.tolist()):
            live.add(job)
            if view.slots_run[j] == 0:  # arrived this slot: nothing held yet
                continue
            self.attained[job] = self.attained.get(job, 0.0) + float(gpus[j]) * view.slot_seconds
            self.waited[job] = 0.0 if view.prev_workers[j] > 0 else self.waited.get(job, 0.0) + view.slot_seconds
        for gone in set(self.attained) - live:
            self.attained.pop(gone, None)
            self.waited.pop(gone, None)
            self.entered.pop(gone, None)

    def queues(self, view: SlotView) -> np.ndarray:
        """[jobs] the queue of each job (0 = the first served)."""
        service = np.array([self.attained.get(j, 0.0) for j in view.job_ids.tolist()])
        waited = np.array([self.waited.get(j, 0.0) for j in view.job_ids.tolist()])
        queue = np.searchsorted(self.thresholds, service, side="right")
        if self.starvation_factor <= 0:
            return queue
        starving = (service > 0) & (waited > self.starvation_factor * service / np.maximum(
            view.worker_demand[:, 0] * np.maximum(view.requested, 1), 1.0))
        return np.where(starving, 0, queue)

    def order(self, view: SlotView) -> np.ndarray:
        """[jobs] view indices in the order they are served: by queue, then by arrival or by entering it."""
        queue = self.queues(view)
        since = view.arrival_slot
        if self.queue_order == "entered":
            for j, job in enumerate(view.job_ids.tolist()):
                q, _ = self.entered.get(job, (-1, 0))
                if q != queue[j]:
                    self.entered[job] = (int(queue[j]), int(view.slot) if q >= 0 else int(view.arrival_slot[j]))
            since = np.array([self.entered[job][1] for job in view.job_ids.tolist()])
        return np.lexsort((view.arrival_slot, since, queue))

    def __call__(self, view: SlotView) -> Allocation:
        self._account(view)
        b = AllocationBuilder(view)
        workers, ps = asked(view)
        order = self.order(view)
        if self.keep_running:  # who runs, by GPUs in order; then those that ran last slot, where they were
            gpus = workers * view.worker_demand[:, 0] + ps * view.ps_demand[:, 0]
            left, runs = float(view.free[:, 0].sum()), []
            for j in order.tolist():
                if gpus[j] <= left + 1e-9:
                    runs.append(j)
                    left -= gpus[j]
            kept = [j for j in runs if view.prev_workers[j] == workers[j] and view.prev_ps[j] == ps[j]]
            for j in kept:
                b.add_gang(j, int(workers[j]), int(ps[j]), stay=True)
            order = np.array([j for j in runs if j not in kept], int)
        for j in order:
            b.add_gang(int(j), int(workers[j]), int(ps[j]))
        return b.allocation()


def build(options: PolicyOptions) -> Tiresias:
    return Tiresias(**REFERENCE) if options.baseline_rules == "reference" else Tiresias()
