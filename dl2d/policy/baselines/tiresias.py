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
"""
from __future__ import annotations

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.baselines.heuristics import AllocationBuilder
from dl2d.policy.registry import IgnoresFeedback, PolicyOptions
from dl2d.policy.baselines.slurm_fifo import asked

THRESHOLDS_GPU_S = (3600.0, 36000.0)
STARVATION_FACTOR = 8.0


class Tiresias(IgnoresFeedback):
    name = "tiresias"

    def __init__(self, thresholds=THRESHOLDS_GPU_S, starvation_factor: float = STARVATION_FACTOR):
        self.thresholds = np.asarray(thresholds, float)
        self.starvation_factor = starvation_factor
        self.attained: dict[int, float] = {}  # job id -> GPU seconds
        self.waited: dict[int, float] = {}  # job id -> seconds without workers since it last ran
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

    def queues(self, view: SlotView) -> np.ndarray:
        """[jobs] the queue of each job (0 = the first served)."""
        service = np.array([self.attained.get(j, 0.0) for j in view.job_ids.tolist()])
        waited = np.array([self.waited.get(j, 0.0) for j in view.job_ids.tolist()])
        queue = np.searchsorted(self.thresholds, service, side="right")
        starving = (service > 0) & (waited > self.starvation_factor * service / np.maximum(
            view.worker_demand[:, 0] * np.maximum(view.requested, 1), 1.0))
        return np.where(starving, 0, queue)

    def __call__(self, view: SlotView) -> Allocation:
        self._account(view)
        b = AllocationBuilder(view)
        workers, ps = asked(view)
        for j in np.lexsort((view.arrival_slot, self.queues(view))):
            b.add_gang(int(j), int(workers[j]), int(ps[j]))
        return b.allocation()


def build(options: PolicyOptions) -> Tiresias:
    return Tiresias()
