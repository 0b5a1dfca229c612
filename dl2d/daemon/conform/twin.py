"""The twin of a Slurm cluster: the simulated backend (dl2d.daemon.sim_backend) with Slurm's rules for where and
when a job runs, so the daemon meets in it what it meets on Slurm.

* **Requests.** A job runs in an allocation of ``N`` nodes with the same GPUs each (``--nodes=N
  --gres=gpu:G``, dl2d.daemon.slurm.mapping.allocation_for): its workers spread evenly over the fewest nodes.
  The daemon sizes jobs for it (``even_gres``); a target's nodes are no placement (``placement = "slurm"``).
* **Placement and waiting.** A size change of a job that is not elastic is a checkpoint-restart (its allocation
  released, the job queued with its new request, as a requeued Slurm job), except a shrink that fewer of its
  nodes hold exactly (``scontrol update NumNodes``: it goes on, on the first of them; the demo program reads its
  new size from its target file). The scheduler (``sched/backfill`` with ``select/cons_tres``) starts queued jobs
  in submission order on the first nodes, by name, that each have the GPUs, CPUs and memory of one node's
  share, and lets a later job start when an earlier one does not fit; a job that does not fit waits PENDING
  (Resources). It runs the scheduler after the daemon's applies and whenever a job ends within a slot, so a
  waiting job starts, as on Slurm, at the moment another one leaves room.
* **Costs** (dl2d.daemon.conform.compare.Costs, measured on the real run). A start costs ``start_s`` of
  training, a restart ``restart_s`` (checkpoint, requeue, start again), both counted from the moment in the
  slot the real daemon carried the job's start out (``applied_at``: its decision, the first slot's JIT
  compilation included, takes time the twin's does not); what a stopped or restarted job held stays held
  ``release_s`` longer (its checkpoint, Slurm's completing job and next scheduling pass).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np

from dl2d.core.placement import even_spread
from dl2d.daemon import jobmodel
from dl2d.daemon.backend import (
    FINISHED,
    HOT,
    NOOP,
    PENDING,
    RESTART,
    RUNNING,
    SHRINK,
    START,
    ApplyResult,
    JobRequest,
    JobStatus,
    Target,
)
from dl2d.daemon.conform.compare import Costs
from dl2d.daemon.sim_backend import SimBackend
from dl2d.workload.speed import epochs_trained

#: What a queued job's status says, as the Slurm backend words a PENDING Slurm job.
WAITING = "Slurm PENDING (Resources)"


class SlurmTwin(SimBackend):
    """See the module docstring. ``start_s`` / ``restart_s``: training lost to a start / a restart."""

    name = "sim"
    even_gres = True

    def __init__(self, *args, costs: Costs = Costs(),
                 applied_at: Callable[[int, str], float] | None = None,
                 curves: Mapping[str, Mapping[int, float]] | None = None,
                 job_costs: Mapping[str, Costs] | None = None, **kwargs) -> None:
        kwargs.setdefault("noise", 0.0)
        super().__init__(*args, **kwargs)
        self.costs = costs
        #: job name -> workers -> epochs/s where a job's speed is not its model's (the JAX jobs': calibrated)
        self.curves = {k: dict(v) for k, v in (curves or {}).items()}
        self.job_costs = dict(job_costs or {})  # job name -> its own costs, where they are not ``costs``
        self.applied_at = applied_at or (lambda slot, job: 0.0)
        self._queue: list[int] = []  # job ids waiting for an allocation, in submission order
        #: this slot's (seconds into it, server, GPUs/CPUs/GB) still held by jobs stopped or restarted in it
        self._leaving: list[tuple[float, int, np.ndarray]] = []

    # ------------------------------------------------------------------ requests and the scheduler

    def _per_node(self, j: dict[str, Any]) -> tuple[int, int]:
        """(nodes, workers per node) of the job's request."""
        return even_spread(j["workers"], int(self.cluster.gpus // jobmodel.gpus_per_worker(self._demand(j))))

    def _free(self, at: float) -> np.ndarray:
        """[servers, 3] GPUs, CPUs and memory not held at ``at`` (seconds into the slot) by a running job or one
        still leaving (none on a drained node)."""
        free = np.tile(self.cluster.server_capacity, (len(self._names), 1)).astype(float)
        for n in self.drained:
            free[self._index[n]] = 0.0
        for until, server, held in self._leaving:
            if until > at:
                free[server] -= held
        for j in self.jobs.values():
            if j["state"] == RUNNING:
                for n in set(j["worker_nodes"]):
                    free[self._index[n]] -= j["worker_nodes"].count(n) * np.asarray(j["worker_demand"])
        return free

    def _schedule(self, at: float) -> None:
        """Start the queued jobs that fit, in submission order; ``at``: the moment, in seconds into the slot."""
        free = self._free(at)
        for job_id in list(self._queue):
            j = self.jobs[job_id]
            nodes, per = self._per_node(j)
            share = per * np.asarray(j["worker_demand"])
            fits = [i for i in range(len(self._names)) if np.all(free[i] >= share - 1e-9)][:nodes]
            if len(fits) < nodes:
                continue
            layout = [fits[w // per] for w in range(j["workers"])]
            for i in fits:
                free[i] -= share
            # its start began when the daemon applied it; placed later, it still takes its launch
            j.update(state=RUNNING, worker_nodes=[self._names[i] for i in layout], started_in_slot=at, message="",
                     debt=max(j.get("debt", 0.0) - at, j.get("launch_s", 0.0)) if at > 0 else j.get("debt", 0.0))
            self._queue.remove(job_id)

    @contextmanager
    def batch(self):
        with super().batch():
            yield self
        self._schedule(0.0)

    def apply(self, job: JobRequest, target: Target) -> ApplyResult:
        target = Target(target.workers, target.ps)  # Slurm places the tasks
        before = self.jobs.get(job.job_id)
        was = (before["workers"], before["ps"]) if before is not None else (0, 0)
        held = list(before["worker_nodes"]) if before is not None and before["state"] == RUNNING else []
        demand = np.asarray(before["worker_demand"]) if before is not None else None
        res = super().apply(job, target)
        j = self.jobs[job.job_id]
        if res.method == NOOP:
            return res
        elastic = bool((job.spec or {}).get("elastic"))
        method = res.method
        if method in (HOT, SHRINK) and not elastic:
            kept = self._kept_nodes(held, was[0], target.workers, j)
            if kept is not None:  # scontrol update NumNodes: the job goes on, on the first of its nodes
                j.update(state=RUNNING, worker_nodes=kept)
                return ApplyResult(job.job_id, SHRINK, res.backend_ref)
            method = RESTART  # its processes cannot change count: checkpoint, requeue, start again
        if job.job_id in self._queue:
            self._queue.remove(job.job_id)
        name = str((job.spec or {}).get("name", ""))
        if name in self.curves:  # by workers from 0, as the state file keeps it
            curve = self.curves[name]
            j["curve"] = [float(curve.get(w, 0.0)) for w in range(max(curve, default=0) + 1)]
        costs = self.job_costs.get(name, self.costs)
        at = self.applied_at(self.slot, name)
        for n in set(held):  # what it held stays held while it checkpoints and Slurm releases it
            self._leaving.append((at + costs.release_s, self._index[n], held.count(n) * demand))
        if target.workers > 0:
            cost = costs.start_s if was == (0, 0) else costs.restart_s
            j["debt"] = cost + at if method in (START, RESTART) else 0.0
            j["launch_s"] = cost
            j.update(state=PENDING, worker_nodes=[], message=WAITING)
            self._queue.append(job.job_id)
            self._queue.sort()
        if not self._batch_depth:
            self._schedule(0.0)
        return ApplyResult(job.job_id, method, res.backend_ref, running=j["state"] == RUNNING)

    def _kept_nodes(self, held: list[str], workers: int, target: int, j: dict[str, Any]) -> list[str] | None:
        """The worker nodes of a job shrunk in place from ``workers`` on ``held`` to ``target``, as the Slurm
        backend decides it (dl2d.daemon.slurm.planning.plan_apply): fewer of its nodes, each keeping its GPUs,
        that hold just the GPUs the target needs; None when it is relaunched instead."""
        nodes = list(dict.fromkeys(held))
        if not nodes or not 0 < target < workers:
            return None
        per = workers // len(nodes)  # its nodes' share (Slurm's requests are even)
        fresh_nodes, fresh_per = self._per_node({**j, "workers": target})
        keep = max(math.ceil(target / per), fresh_nodes)
        if keep >= len(nodes) or keep * per != fresh_nodes * fresh_per:
            return None
        return [nodes[w // per] for w in range(target)]

    def _status(self, job_id: int, j: dict[str, Any]) -> JobStatus:
        st = super()._status(job_id, j)
        return replace(st, state=PENDING, nodes=(), message=WAITING) if job_id in self._queue else st

    # ------------------------------------------------------------------ training

    def _rate(self, j: dict[str, Any]) -> float:
        if "curve" in j:  # as measured on the real cluster, its placement's effect in it
            curve = j["curve"]
            return float(curve[min(j["workers"], len(curve) - 1)]) * j["factor"]
        if self._allreduce(j):
            return float(self._allreduce_rates([j])[0]) * j["factor"]
        return float(epochs_trained(self.table, np.array([j["type"]]), np.array([j["ps"]]), np.array([j["workers"]]),
                                    j["factor"], 1.0)[0])

    def end_slot(self, seconds: float) -> None:
        """One slot of training, ended at each finish: a job that ends frees its nodes at once, and the queue
        is scheduled there (a job started mid-slot trains the rest of it)."""
        slot_s = self.slot_seconds
        start = self.origin + self.slot * slot_s
        t = 0.0
        while True:
            running = [j for j in self.jobs.values() if j["state"] == RUNNING and j["workers"] > 0]
            for j in running:
                j.setdefault("started_in_slot", 0.0)
                j["started_in_slot"] = max(j["started_in_slot"], 0.0)
            ends = []
            for j in running:
                rate = self._rate(j)
                begin = max(t, j["started_in_slot"]) + j.get("debt", 0.0)
                left = j["true"] - j["epochs_done"]
                ends.append(begin + left / rate if rate > 0 else math.inf)
            releases = [u for u, _, _ in self._leaving if u > t]
            first = min(ends + releases, default=math.inf)
            until = min(first, slot_s)
            for j in running:
                begin = max(t, j["started_in_slot"])
                lost = min(j.get("debt", 0.0), max(until - begin, 0.0))
                j["debt"] = j.get("debt", 0.0) - lost
                train = max(until - begin - lost, 0.0)
                j["epochs_done"] = min(j["epochs_done"] + self._rate(j) * train, j["true"])
                j["started_in_slot"] = until
            t = until
            if first > slot_s:
                break
            for j, end in zip(running, ends):
                if end <= t + 1e-9:
                    j.update(epochs_done=j["true"], state=FINISHED, finished_at=start + t, workers=0, ps=0,
                             worker_nodes=[], ps_nodes=[])
            self._schedule(t)
        for j in self.jobs.values():
            j["started_in_slot"] = 0.0
        self._leaving = []
        self.slot += 1
        self._save()
