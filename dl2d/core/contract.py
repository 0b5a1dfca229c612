"""What a policy sees at the start of a slot and what it returns: the contract between the simulator, the
policies and the daemon.

A :class:`SlotView` lists the jobs that wait or run (row j = the j-th job, in arrival order), each with its
own kind and per-task demand (dl2d.core.jobs), and the cluster's servers (row s = server s, named in
``node_names`` where the cluster has names). An :class:`Allocation` gives every job of the view its workers
and PS for the next slot, decided from scratch (DL2), and optionally the server of every task.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np


class CapacityError(RuntimeError):
    """An allocation asked for more than the cluster has: a scheduler bug, never silently accepted."""


#: Where an all-reduce job's new workers are placed (SlotView.allreduce_placement, SimConfig's too).
ALLREDUCE_PLACEMENTS = ("spread", "pack")
#: a view's ``job_speed_factor`` is the mean of the job's last this many measured slots (the daemon's
#: dl2d.daemon.jobstats and the simulator's engine measure alike)
SPEED_FACTOR_SLOTS = 3


def check_allreduce_placement(value: str) -> None:
    """ValueError naming the choices unless ``value`` is one of :data:`ALLREDUCE_PLACEMENTS`."""
    if value not in ALLREDUCE_PLACEMENTS:
        raise ValueError(f"allreduce_placement must be one of {', '.join(ALLREDUCE_PLACEMENTS)}, got {value!r}")


@dataclass(frozen=True)
class SlotView:
    """What a scheduler knows at the start of a slot (row j = the j-th job by arrival).

    ``job_ids`` are opaque identifiers of the jobs (the simulator's trace index, the daemon's database id):
    a policy may key state on them across slots, never index arrays with them. ``type_idx`` is the job's
    model class in the speed model (dl2d.workload.jobtypes); what the job asks for per task is
    ``worker_demand`` / ``ps_demand``, from its own spec."""

    slot: int
    job_ids: np.ndarray  # [jobs] opaque job identifiers
    type_idx: np.ndarray  # [jobs] model class (dl2d.workload.jobtypes index)
    arrival_slot: np.ndarray
    slots_run: np.ndarray
    epochs_done: np.ndarray
    est_epochs: np.ndarray
    prev_workers: np.ndarray
    prev_ps: np.ndarray
    free: np.ndarray  # [servers, 3] free at the start of the slot
    capacity: np.ndarray  # [servers, 3]
    max_workers: int
    max_ps: int
    server_speed: np.ndarray | None = None  # [servers] speeds observed last slot (heterogeneous runs only)
    # the daemon's measurements (dl2d.daemon.jobstats), optional; no policy needs them, the baselines ignore them:
    job_speed_factor: np.ndarray | None = None  # [jobs] measured / predicted speed, recent slots; NaN: not measured
    # (the predicted: a PS job's speed table, an all-reduce job's est_speed; SPEED_FACTOR_SLOTS full slots)
    job_shared_gpu: np.ndarray | None = None  # [jobs] a GPU of the job also ran another job's processes
    # every job's own per-task demand (GPUs, CPU cores, memory GB) and kind (dl2d.core.jobs.JobKind values)
    worker_demand: np.ndarray = field(kw_only=True)  # [jobs, 3]
    ps_demand: np.ndarray = field(kw_only=True)  # [jobs, 3]
    kind: tuple[str, ...] = field(kw_only=True)  # [jobs]
    node_names: tuple[str, ...] = field(default=(), kw_only=True)  # [servers] where the cluster names them
    # what the scheduler believes of each job's speed: epochs per second with (PS, workers), the site's speed
    # model without what only the cluster knows (interference, noise); all-reduce jobs have speed at PS = 0 only
    est_speed: np.ndarray = field(kw_only=True)  # [jobs, max_ps + 1, max_workers + 1]
    slot_seconds: float = field(default=1200.0, kw_only=True)  # length of the slot being decided
    requested_workers: np.ndarray | None = field(default=None, kw_only=True)  # [jobs] workers asked for; None: 1
    #: [jobs] the total batch each all-reduce job trains at (last slot's; its submitted one before it ran); None:
    #: unknown
    batch_size: np.ndarray | None = field(default=None, kw_only=True)
    #: [jobs] True where the job lets the scheduler choose its total batch (Allocation.batch_size); None: none does
    adaptive: np.ndarray | None = field(default=None, kw_only=True)
    #: [jobs] the batch each job was submitted at, the one ``est_speed`` is of (where it differs from ``batch_size``:
    #: an adaptive job that took another); None: ``batch_size``
    submitted_batch: np.ndarray | None = field(default=None, kw_only=True)
    #: [jobs, 2] an adaptive job's own limits (the largest total batch, the most samples a GPU takes in a pass;
    #: NaN: its model's measured ones); None: no job has its own
    batch_limits: np.ndarray | None = field(default=None, kw_only=True)
    #: [jobs, 2] the gradient statistics (|G|^2, the variance at its model's initial batch) the scheduler believes
    #: of each adaptive job now, fitted from the job's own reports (NaN: its model's measured ones); None: none
    grad_stats: np.ndarray | None = field(default=None, kw_only=True)
    # the servers each job's tasks ran on last slot, where known (moving an all-reduce job restarts it)
    prev_worker_servers: tuple[tuple[int, ...], ...] | None = field(default=None, kw_only=True)
    prev_ps_servers: tuple[tuple[int, ...], ...] | None = field(default=None, kw_only=True)
    #: where an all-reduce job's new workers go (dl2d.core.placement): "pack" (the default), the best fit for the
    #: workers the job still wants (the fewest servers, as Slurm places a job), a job moved to fewer servers
    #: when it restarts anyway or when a move buys that; or "spread", the least loaded server (DL2's rule for
    #: every task, which PS jobs always follow)
    allreduce_placement: str = field(default="pack", kw_only=True)

    def __post_init__(self):
        n = len(self.job_ids)
        if np.shape(self.worker_demand) != (n, 3) or np.shape(self.ps_demand) != (n, 3) or len(self.kind) != n:
            raise ValueError(f"a view of {n} jobs needs worker/PS demands of shape ({n}, 3) and {n} kinds, got "
                             f"{np.shape(self.worker_demand)}, {np.shape(self.ps_demand)}, {len(self.kind)}")
        if self.node_names and len(self.node_names) != len(self.free):
            raise ValueError(f"{len(self.node_names)} node names for {len(self.free)} servers")
        if np.shape(self.est_speed) != (n, self.max_ps + 1, self.max_workers + 1):
            raise ValueError(f"a view of {n} jobs needs est_speed of shape ({n}, {self.max_ps + 1}, "
                             f"{self.max_workers + 1}), got {np.shape(self.est_speed)}")
        if self.requested_workers is not None and np.shape(self.requested_workers) != (n,):
            raise ValueError(f"requested_workers has shape {np.shape(self.requested_workers)}, expected ({n},)")
        for name in ("batch_size", "adaptive", "submitted_batch"):
            if getattr(self, name) is not None and np.shape(getattr(self, name)) != (n,):
                raise ValueError(f"{name} has shape {np.shape(getattr(self, name))}, expected ({n},)")
        for name in ("batch_limits", "grad_stats"):
            if getattr(self, name) is not None and np.shape(getattr(self, name)) != (n, 2):
                raise ValueError(f"{name} has shape {np.shape(getattr(self, name))}, expected ({n}, 2)")
        check_allreduce_placement(self.allreduce_placement)
        for name in ("prev_worker_servers", "prev_ps_servers"):
            servers = getattr(self, name)
            if servers is not None and len(servers) != n:
                raise ValueError(f"{name} lists {len(servers)} jobs, the view has {n}")

    def __len__(self) -> int:
        return len(self.job_ids)

    def subset(self, rows) -> "SlotView":
        """The view of only these jobs (row indices, in the order given); the cluster stays as it is."""
        rows = np.asarray(rows, int)
        pick = lambda a: None if a is None else np.asarray(a)[rows]  # noqa: E731
        pick_tuple = lambda t: None if t is None else tuple(t[i] for i in rows)  # noqa: E731
        return replace(
            self, job_ids=pick(self.job_ids), type_idx=pick(self.type_idx), arrival_slot=pick(self.arrival_slot),
            slots_run=pick(self.slots_run), epochs_done=pick(self.epochs_done), est_epochs=pick(self.est_epochs),
            prev_workers=pick(self.prev_workers), prev_ps=pick(self.prev_ps),
            job_speed_factor=pick(self.job_speed_factor), job_shared_gpu=pick(self.job_shared_gpu),
            worker_demand=pick(self.worker_demand).reshape(-1, 3), ps_demand=pick(self.ps_demand).reshape(-1, 3),
            kind=pick_tuple(self.kind), est_speed=pick(self.est_speed), requested_workers=pick(self.requested_workers),
            batch_size=pick(self.batch_size), adaptive=pick(self.adaptive), submitted_batch=pick(self.submitted_batch),
            batch_limits=None if self.batch_limits is None else pick(self.batch_limits).reshape(-1, 2),
            grad_stats=None if self.grad_stats is None else pick(self.grad_stats).reshape(-1, 2),
            prev_worker_servers=pick_tuple(self.prev_worker_servers), prev_ps_servers=pick_tuple(self.prev_ps_servers))

    @property
    def allreduce(self) -> np.ndarray:
        """[jobs] True for all-reduce jobs (no parameter servers)."""
        return np.array([k == "allreduce" for k in self.kind], bool)

    @property
    def requested(self) -> np.ndarray:
        """[jobs] the workers each job asked for (1 where it did not say)."""
        if self.requested_workers is None:
            return np.ones(len(self), int)
        return np.asarray(self.requested_workers, int)

    @property
    def remaining_epochs(self) -> np.ndarray:
        return np.maximum(self.est_epochs - self.epochs_done, 0.0)

    @property
    def total_capacity(self) -> np.ndarray:
        return self.capacity.sum(axis=0)


@dataclass(frozen=True)
class Allocation:
    """Workers and PS per job of the view; optionally the server of every task (else the engine places)."""

    workers: np.ndarray
    ps: np.ndarray
    worker_servers: tuple[tuple[int, ...], ...] | None = None
    ps_servers: tuple[tuple[int, ...], ...] | None = None
    #: [jobs] the total batch each job trains at from this slot (only a job the view marks adaptive may change
    #: it); None, or 0 for a job: it keeps the view's batch_size
    batch_size: np.ndarray | None = None

    @staticmethod
    def empty(n: int) -> "Allocation":
        """Nothing for any of n jobs, with (empty) placements."""
        z = np.zeros(n, int)
        return Allocation(z, z.copy(), tuple(() for _ in range(n)), tuple(() for _ in range(n)))

    @staticmethod
    def from_servers(worker_servers, ps_servers) -> "Allocation":
        """The allocation of exactly these tasks: counts are the lengths of the per-job server lists."""
        ws = tuple(tuple(int(s) for s in x) for x in worker_servers)
        ps = tuple(tuple(int(s) for s in x) for x in ps_servers)
        return Allocation(np.array([len(s) for s in ws], int), np.array([len(s) for s in ps], int), ws, ps)


class Scheduler(Protocol):
    """Anything that turns a view into an allocation: a heuristic function, a learned policy, a wrapper.
    The simulator runs any of them; the daemon runs the richer dl2d.policy.registry.Policy."""

    name: str

    def __call__(self, view: SlotView) -> Allocation: ...


def validate(view: SlotView, alloc: Allocation) -> None:
    """ValueError unless the allocation has one count per job, within the view's limits."""
    w, p = np.asarray(alloc.workers), np.asarray(alloc.ps)
    if w.shape != (len(view),) or p.shape != (len(view),):
        raise ValueError(f"allocation for {w.shape}/{p.shape} jobs, the view has {len(view)}")
    if np.any(w < 0) or np.any(p < 0) or np.any(w > view.max_workers) or np.any(p > view.max_ps):
        raise ValueError("allocation outside [0, max_workers] / [0, max_ps]")
    if np.any(p[view.allreduce] > 0):
        raise ValueError("allocation gives parameter servers to an all-reduce job")
    if alloc.batch_size is not None:
        b = np.asarray(alloc.batch_size, float)
        if b.shape != (len(view),) or not np.all(np.isfinite(b)) or np.any(b < 0):
            raise ValueError(f"allocation's batch_size must be {len(view)} finite numbers >= 0 (0: keep the batch)")
        adaptive = np.zeros(len(view), bool) if view.adaptive is None else np.asarray(view.adaptive, bool)
        current = np.zeros(len(view)) if view.batch_size is None else np.asarray(view.batch_size, float)
        fixed = np.flatnonzero((b > 0) & ~adaptive & (b != current))
        if len(fixed):
            raise ValueError(f"allocation changes the batch of job {view.job_ids[fixed[0]]}, which does not allow it")
