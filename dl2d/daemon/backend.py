"""The cluster backend interface the daemon drives, and the types it speaks.

The daemon is level-triggered: every slot it asks the backend what is true now
(:meth:`ClusterBackend.observe`), compares it with what the policy wants, and
asks for the difference (:meth:`ClusterBackend.apply`).  Backends never decide
anything themselves; they carry out one job's target size and report.

Two implementations:

* ``dl2d.daemon.sim_backend.SimBackend`` — the embedded default: the simulator
  runs the jobs, time advances one slot per :meth:`ClusterBackend.end_slot`.
* ``dl2d.daemon.slurm.backend.SlurmBackend`` — one Slurm batch job per dl2d job
  (see docs/slurm.md); time passes for real, progress comes from the jobs'
  progress files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping, Protocol

#: Job states a backend reports.
PENDING, RUNNING, FINISHED, FAILED = "pending", "running", "finished", "failed"
#: How a resize was carried out (recorded in the DB with the event).
HOT, RESTART, SHRINK, START, STOP, NOOP = "hot", "restart", "shrink", "start", "stop", "noop"


class BackendError(RuntimeError):
    """The backend could not carry out a request; ``retryable`` says whether trying again later may help."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class NodeInfo:
    name: str
    gpus: int
    cpus: int
    mem_gb: float
    usable: bool = True  # False when down or drained: place no new work there
    reason: str = ""
    #: GPUs of the node that work outside dl2d holds (another user's Slurm job): not dl2d's to give
    gpus_other: int = 0


@dataclass(frozen=True)
class JobRequest:
    """What the daemon knows of a dl2d job when it asks the backend to run it."""

    job_id: int
    job_type: str  # one of dl2d.workload.jobtypes.TYPE_NAMES
    total_epochs: float
    spec: Mapping[str, Any] = field(default_factory=dict)  # the submitted spec (command, demands, ...)


@dataclass(frozen=True)
class Target:
    """The size the policy wants a job to have for the next slot (0/0: not running this slot)."""

    workers: int
    ps: int
    worker_nodes: tuple[str, ...] = ()  # optional placement, one entry per task
    ps_nodes: tuple[str, ...] = ()
    batch_size: float = 0.0  # an adaptive job's total batch from this start on (0: the one it has)


@dataclass(frozen=True)
class JobStatus:
    job_id: int
    state: str  # PENDING | RUNNING | FINISHED | FAILED
    workers: int
    ps: int
    epochs_done: float  # cumulative, from the job's own progress reports
    nodes: tuple[str, ...] = ()
    backend_ref: str = ""  # e.g. the Slurm job id
    hot_scaling: bool = False  # the job's runtime can be resized without a restart
    message: str = ""
    finished_at: datetime | None = None  # when it finished or failed, if the backend knows (else: observed)
    lost_epochs: float = 0.0  # cumulative: trained, then redone after a restart that found no checkpoint of it
    started_at: datetime | None = None  # when its current run began, if the backend knows (Slurm's StartTime)
    # an adaptive job's own report (docs/jobs.md): the total batch it trains at, and its gradient noise
    # (|G|^2, the variance at its submitted batch) where it measured it; ``report_error`` what was refused of them
    batch_size: float | None = None
    grad_noise: tuple[float, float] | None = None
    report_error: str = ""


@dataclass(frozen=True)
class ApplyResult:
    job_id: int
    method: str  # HOT | RESTART | SHRINK | START | STOP | NOOP
    backend_ref: str = ""
    #: the job runs at its target now; False: the backend (Slurm) still has to start it (it may hold it pending),
    #: so the daemon records it pending until the backend reports it running
    running: bool = True
    #: the size the job has after the apply when it is not the target's (the backend kept it as it was); None:
    #: the target's
    held: tuple[int, int] | None = None


class ClusterBackend(Protocol):
    name: str
    #: called by the backend while it waits inside ``apply`` (a checkpoint, a retry): the daemon sets it to its
    #: watchdog ping, so a long wait never looks like a hung daemon to systemd
    heartbeat: Callable[[], object]

    def nodes(self) -> list[NodeInfo]:
        """All compute nodes with their capacity; unusable ones flagged."""

    def observe(self) -> dict[int, JobStatus]:
        """The current state of every job this backend runs or ran, by dl2d job id."""

    def apply(self, job: JobRequest, target: Target) -> ApplyResult:
        """Make ``job`` run at ``target`` (start, grow, shrink, stop). Idempotent: applying the
        size a job already has is a NOOP, so a daemon replaying its journal after a crash never
        resizes twice."""

    def cancel(self, job_id: int) -> None:
        """Stop a job for good (user cancel). Unknown ids are ignored."""

    def drain(self, node: str, reason: str) -> None:
        """Place no new work on ``node`` (the slot loop never does: a silent agent only marks its node stale)."""

    def resume(self, node: str) -> None:
        """Undo :meth:`drain`."""

    def end_slot(self, seconds: float) -> None:
        """The slot is over. The simulated backend runs the slot here; real backends return at once."""
