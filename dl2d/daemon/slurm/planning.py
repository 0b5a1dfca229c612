"""How to take a job from what Slurm reports to its target, and what to report of it. Pure.

:func:`plan_apply` picks the method (start / hot / restart / shrink / stop / noop, docs/slurm.md) from
facts the backend gathered (:class:`Current`, and :func:`~dl2d.daemon.slurm.mapping.nodes_to_host`'s
answer); :func:`runtime_scales_hot` says from the job's own files whether its runtime can be resized
hot now; :func:`status_from` turns the backend's record, the Slurm job and the job's progress into a
:class:`~dl2d.daemon.backend.JobStatus`.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Mapping

from dl2d.daemon.backend import (
    FAILED,
    FINISHED,
    HOT,
    NOOP,
    PENDING,
    RESTART,
    RUNNING,
    SHRINK,
    START,
    STOP,
    JobStatus,
    Target,
)
from dl2d.daemon.slurm.jobreport import TIME_RANGE
from dl2d.daemon.slurm.mapping import SlurmAllocation
from dl2d.slurm.driver import SlurmJob


def is_elastic(spec: Mapping[str, Any]) -> bool:
    """Is the job's runtime one that supports hot scaling? ``elastic = true/false`` in the spec decides;
    without it, jobs whose command runs ``dl2-run`` (or ``-m dl2d.elastic.launcher``) are."""
    if "elastic" in spec:
        return bool(spec["elastic"])
    command = str(spec.get("command") or "")
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return any(w == "dl2-run" or w.endswith("/dl2-run") or w == "dl2d.elastic.launcher"
               for w in words)


def time_limit(spec: Mapping[str, Any], default: int | None) -> int | None:
    """The Slurm time limit (minutes) of a job: its spec's ``time_limit_min``, the backend's default
    (``[slurm] time_limit_min``) where the spec has none — also where it holds an explicit null, as a
    stored submission without ``-t`` does; None: neither, the partition's limit applies."""
    limit = spec.get("time_limit_min")
    if limit is None:
        limit = default
    return int(limit) if limit is not None else None


def finish_time(record: Mapping[str, Any], slurm: SlurmJob | None, progress: Mapping[str, Any] | None,
                progress_mtime: float | None, now: float | None = None) -> float | None:
    """When a finished or failed job ended (unix seconds), from the most exact fact there is:

    1. the time the backend recorded when it first saw the end (``record["finished_at"]``), so the
       answer stays the same after Slurm has forgotten the job;
    2. Slurm's EndTime of its latest Slurm job, once that job has ended (an active job's EndTime is only
       its start plus its time limit);
    3. the job's own last progress record: its ``time`` field (dl2-run, the demo job), else when the
       progress file was last written — a moment before its Slurm job ends (the program said ``done``
       and is exiting), or after Slurm forgot the job (``MinJobAge``);
    4. None: nothing is known (the daemon then uses the time it observed the end).

    The job's own word (3) is its owner's: it is believed only between its Slurm job's start and ``now``
    (when given), so a job cannot date its end before it ran or in the future.
    """
    recorded = record.get("finished_at")
    if isinstance(recorded, (int, float)) and math.isfinite(recorded):
        return float(recorded)
    if slurm is not None and not slurm.active and slurm.end_time:
        return float(slurm.end_time)
    low = float(slurm.start_time) if slurm is not None and slurm.start_time else TIME_RANGE[0]
    high = min(TIME_RANGE[1], now) if now is not None else TIME_RANGE[1]
    for said in ((progress or {}).get("time"), progress_mtime):
        if isinstance(said, (int, float)) and not isinstance(said, bool) and math.isfinite(said) \
                and low <= said <= high:
            return float(said)
    return None


def progress_state(progress: Mapping[str, Any] | None) -> str:
    """The job's own word on its state (``status`` of the demo job, ``state`` of dl2-run)."""
    if not progress:
        return ""
    return str(progress.get("state") or progress.get("status") or "")


#: dl2-run's progress states (dl2d/elastic/progress.py) in which its coordinator cannot take a resize:
#: not up yet, busy with one, checkpointing, or gone.
RUNTIME_BUSY_STATES = frozenset({"starting", "scaling", "checkpointing", "checkpointed", "done", "failed"})


def runtime_scales_hot(elastic: bool, coordinator: Mapping[str, Any] | None,
                       coordinator_written: float | None, slurm_started: float | None,
                       progress: Mapping[str, Any] | None) -> bool:
    """Can the job's runtime be resized in place now? From what the runtime itself reports:

    * its kind supports it (``elastic``: :func:`is_elastic` of the spec);
    * the run Slurm runs now published its coordinator (``checkpoint/coordinator.json``, written by
      dl2-run when it starts): a file older than the Slurm job's start (``coordinator_written`` <
      ``slurm_started``, unix seconds) was left by an earlier run, whose coordinator is gone;
    * its progress does not say it is busy (:data:`RUNTIME_BUSY_STATES`).

    A hot resize that fails anyway (coordinator unreachable, timeout) still falls back to a restart;
    these facts only spare the attempt where it cannot succeed."""
    if not elastic or not coordinator or not coordinator.get("address"):
        return False
    if slurm_started is not None and coordinator_written is not None and coordinator_written < slurm_started:
        return False
    return progress_state(progress) not in RUNTIME_BUSY_STATES


@dataclass(frozen=True)
class Current:
    """What is true of a job now, as far as :func:`plan_apply` needs to know."""

    slurm_state: str | None  # Slurm base state of its live Slurm job; None: no active job
    allocation: SlurmAllocation | None  # of the live Slurm job (None when not running)
    applied: tuple[int, int]  # (workers, ps) last carried out, from the record
    finished: bool = False  # the job's progress says it is done
    elastic: bool = False  # its runtime is of a kind that scales hot (is_elastic)
    hot_scaling: bool = False  # its running runtime can be resized in place now (runtime_scales_hot)
    fixed_size: bool = False  # dl2d started one process per worker: another size is another run
    new_batch: bool = False  # the target gives an adaptive job a total batch other than the one it runs at


@dataclass(frozen=True)
class Plan:
    """A method and the allocation it carries out: for START and RESTART the one to submit (or requeue
    at), for SHRINK the nodes to keep; None for HOT, NOOP and STOP (the allocation stays or goes)."""

    method: str
    allocation: SlurmAllocation | None = None
    #: NOOP only: False when the job keeps the size it has instead of the target (a job that is not elastic
    #: keeps its PS on the nodes it holds: the size it is recorded at is what Slurm holds for it)
    reached: bool = True


def plan_apply(cur: Current, target: Target, needed: SlurmAllocation | None,
               hosting_nodes: int | None) -> Plan:
    """The method that takes a job from ``cur`` to ``target``. ``needed``: the target's allocation
    (None when the target is 0/0); ``hosting_nodes``: the fewest of the running job's nodes that host
    the target's tasks (:func:`~dl2d.daemon.slurm.mapping.nodes_to_host`), None when they cannot or
    nothing runs. The rules:

    * target 0/0: STOP when a Slurm job is active, else NOOP;
    * finished: NOOP;
    * no active Slurm job: START (resumes from the job's checkpoint, if any);
    * pending in Slurm: NOOP when its allocation is ``needed`` (the new (W, P) and batch are written to the
      target file it reads when it starts), else START (cancel + submit at the new size);
    * running, and the target gives it a new total batch (``cur.new_batch``): RESTART (a job reads its batch
      when it starts, as its size);
    * running with one process per worker started by dl2d (``cur.fixed_size``: ``launch = "srun"``): NOOP
      at its size, else RESTART (checkpoint, then requeue or resubmit: its processes cannot change count,
      and releasing a node in place would kill some of them);
    * running, its nodes cannot host the target: RESTART (checkpoint, then requeue or resubmit) —
      Slurm adds neither nodes nor GPUs to a running allocation;
    * running, fewer of its nodes host the target (and no fewer than ``needed`` has, so a placed
      target keeps its spread): SHRINK (``scontrol update NumNodes``) when the nodes kept hold just the
      GPUs the target needs (each keeps its GPUs: 9 workers on 3 nodes of 3 shrink in place to 6, not to 4,
      which would keep 6 GPUs for 4 workers), else RESTART; an elastic job is scaled down hot first, so one
      whose runtime cannot be resized now is restarted instead;
    * running, its nodes host the target: NOOP when (W, P) is what was applied. A job that is not elastic
      took its size when its processes started, and Slurm takes nothing from a node in place: recording a
      new size on the allocation it keeps would count resources free that Slurm holds. So it is RESTARTed
      at the target when its workers change or it gains PS, and keeps its size (NOOP, ``reached=False``)
      when it would only lose PS (a relaunch for a server's cores is not worth its restart). An elastic
      job: HOT when its runtime can be resized now (``cur.hot_scaling``, and the elastic runtime needs
      >= 1 worker and >= 1 PS on both sides), else RESTART.
    """
    want = (target.workers, target.ps)
    if want == (0, 0):
        return Plan(STOP if cur.slurm_state is not None else NOOP)
    if needed is None:
        raise ValueError("plan_apply needs the allocation of a non-zero target")
    if cur.finished:
        return Plan(NOOP)
    if cur.slurm_state is None:
        return Plan(START, needed)
    if cur.slurm_state != "RUNNING" or cur.allocation is None:
        return Plan(NOOP) if cur.allocation in (None, needed) else Plan(START, needed)
    if cur.new_batch:
        return Plan(RESTART, needed)
    if cur.fixed_size:
        return Plan(NOOP) if want == cur.applied else Plan(RESTART, needed)
    if hosting_nodes is None:
        return Plan(RESTART, needed)
    hot = cur.hot_scaling and min(want) >= 1 and min(cur.applied) >= 1
    keep = max(hosting_nodes, needed.nodes)
    if keep < cur.allocation.nodes:
        if cur.elastic and not hot:
            return Plan(RESTART, needed)
        if keep * cur.allocation.gpus_per_node != needed.nodes * needed.gpus_per_node:
            return Plan(RESTART, needed)  # the nodes kept would hold GPUs the new size does not use
        return Plan(SHRINK, replace(cur.allocation, nodes=keep))
    if want == cur.applied:
        return Plan(NOOP)
    if not cur.elastic:
        if target.workers == cur.applied[0] and target.ps < cur.applied[1]:
            return Plan(NOOP, reached=False)
        return Plan(RESTART, needed)
    return Plan(HOT) if hot else Plan(RESTART, needed)


def epochs_from_progress(progress: Mapping[str, Any] | None) -> float:
    """Cumulative epochs from a job's progress file: ``dl2-run``'s (``step``/``total_steps``/
    ``epochs``: fractional) or the demo job's / any program's (``epoch``)."""
    if not progress:
        return 0.0
    try:
        step, total, epochs = progress.get("step"), progress.get("total_steps"), progress.get("epochs")
        if isinstance(step, (int, float)) and isinstance(total, (int, float)) and total > 0 \
                and isinstance(epochs, (int, float)) and epochs > 0:
            return float(step) / (float(total) / float(epochs))
        return float(progress.get("epoch", 0) or 0)
    except (TypeError, ValueError):
        return 0.0


def lost_epochs_from_progress(progress: Mapping[str, Any] | None) -> float:
    """The epochs a job reports lost to restarts (``lost_steps`` of ``total_steps`` making ``epochs``,
    docs/jobs.md); 0 when it reports none."""
    if not progress:
        return 0.0
    lost, total, epochs = progress.get("lost_steps"), progress.get("total_steps"), progress.get("epochs")
    numbers = [v for v in (lost, total, epochs) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) < 3 or not total > 0 or not lost > 0 or not math.isfinite(lost / total * epochs):
        return 0.0
    return float(lost) / float(total) * float(epochs)


def batch_from_progress(progress: Mapping[str, Any] | None) -> dict[str, Any]:
    """JobStatus's ``batch_size``, ``grad_noise`` and ``report_error`` from a checked progress report."""
    if not progress:
        return {}
    out: dict[str, Any] = {}
    if "batch_size" in progress:
        out["batch_size"] = float(progress["batch_size"])
    if "grad_sqr" in progress:
        out["grad_noise"] = (float(progress["grad_sqr"]), float(progress["grad_var"]))
    if progress.get("report_error"):
        out["report_error"] = str(progress["report_error"])
    return out


def status_from(job_id: int, record: Mapping[str, Any], slurm: SlurmJob | None,
                progress: Mapping[str, Any] | None, progress_mtime: float | None = None,
                now: float | None = None) -> JobStatus:
    """A :class:`JobStatus` from the job's record, its (latest) Slurm job and its progress (checked:
    :func:`~dl2d.daemon.slurm.jobreport.checked_progress`).

    FINISHED when the job says it is done and Slurm runs nothing of it any more; RUNNING / PENDING while its
    Slurm job is active — also when the job says done but runs on, which holds its GPUs (the backend ends it
    after ``done_grace_s``); after that PENDING when dl2d stopped it or it checkpointed (it waits to be started
    again), FAILED when it was cancelled or its Slurm job ended any other way (exit code != 0, timeout, node
    failure, or exit 0 without saying "done"). ``hot_scaling`` is the job's kind (:func:`is_elastic`, kept in
    the record), known before its runtime starts. A finished or failed job's ``finished_at`` is
    :func:`finish_time` (``progress_mtime``: when its progress file was last written)."""
    applied = record.get("applied") or {}
    w, p = int(applied.get("workers", 0)), int(applied.get("ps", 0))
    epochs = epochs_from_progress(progress)
    ref = str(record.get("slurm_job_id") or (slurm.job_id if slurm else ""))
    elastic = bool(record.get("elastic", False))
    said = progress_state(progress)
    base = dict(job_id=job_id, epochs_done=epochs, backend_ref=ref, hot_scaling=elastic,
                lost_epochs=lost_epochs_from_progress(progress), **batch_from_progress(progress))
    ended = finish_time(record, slurm, progress, progress_mtime, now)
    final = dict(base, finished_at=datetime.fromtimestamp(ended, timezone.utc) if ended else None)
    active = slurm is not None and slurm.active
    if record.get("final") == FINISHED or said == "done" and not active:
        return JobStatus(state=FINISHED, workers=0, ps=0, message="done", **final)
    if record.get("cancelled"):
        return JobStatus(state=FAILED, workers=0, ps=0, message="cancelled by dl2d", **final)
    if record.get("final") == FAILED:
        return JobStatus(state=FAILED, workers=0, ps=0,
                         message=str(record.get("message") or "failed"), **final)
    if active:
        assert slurm is not None
        if said == "done":
            return JobStatus(state=RUNNING if slurm.state == "RUNNING" else PENDING, workers=w, ps=p,
                             nodes=slurm.nodes, message=f"says done; its Slurm job {slurm.job_id} is still "
                                                        f"{slurm.state}", **base)
        if slurm.state == "RUNNING":
            began = slurm.start_time if slurm.start_time and TIME_RANGE[0] <= slurm.start_time <= TIME_RANGE[1] \
                else None
            return JobStatus(state=RUNNING, workers=w, ps=p, nodes=slurm.nodes,
                             started_at=datetime.fromtimestamp(began, timezone.utc) if began else None, **base)
        return JobStatus(state=PENDING, workers=w, ps=p,
                         message=f"Slurm {slurm.state} ({slurm.reason or 'no reason'})", **base)
    if record.get("stopped"):
        return JobStatus(state=PENDING, workers=0, ps=0, message="stopped by dl2d", **base)
    if said == "checkpointed":
        return JobStatus(state=PENDING, workers=0, ps=0,
                         message="checkpointed; waiting to be started", **base)
    if slurm is None:
        if not record.get("slurm_job_id"):
            return JobStatus(state=PENDING, workers=0, ps=0, message="not submitted", **base)
        return JobStatus(state=PENDING, workers=0, ps=0,
                         message=f"Slurm job {ref} is gone; waiting to be started", **base)
    return JobStatus(state=FAILED, workers=0, ps=0,
                     message=f"Slurm job {slurm.job_id} ended {slurm.state}"
                             + (f" ({slurm.reason})" if slurm.reason and slurm.reason != "None"
                                else ""), **final)
