"""Jobs: submission (validated first), lookup, cancellation, and the job queries of the daemon and CLI.

Validation (`validate_submission`) is a pure function, so a malformed submission is rejected before
anything touches the database. The other functions take a Session and never commit: the caller owns the
transaction (`with session_scope(engine) as s: ...`).
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, defer

from dl2d.core.jobs import ENV_NAME_RE, LAUNCHES, RESERVED_ENV_PREFIXES, TaskDemand
from dl2d.core.limits import ALLREDUCE_MAX_WORKERS, MAX_PS, MAX_WORKERS
from dl2d.db.errors import (
    DBError,
    InvalidTransition,
    JobNotFound,
    PermissionDenied,
    SubmissionError,
)
from dl2d.db.events import record_event
from dl2d.db.intents import plan_intent
from dl2d.db.models import ACTIVE_STATES, EventKind, IntentKind, Job, JobState, utcnow
from dl2d.workload.catalog import ALLREDUCE_MODELS
from dl2d.workload.jobtypes import TYPE_NAMES

#: The 8 models of DL2's evaluation: the simulator's catalogue is the one list of PS job types.
DL2_JOB_TYPES: tuple[str, ...] = TYPE_NAMES
#: A job's architecture (``kind`` in the spec, ``dl2ctl submit --arch``): DL2's parameter-server jobs, or
#: all-reduce (DDP-style) jobs of any model. Without one, a job of a DL2 type or asking for parameter servers
#: (a non-zero [ps] table) is ``ps``, any other ``allreduce``; the stored spec always says which.
KINDS = ("ps", "allreduce")

# Sanity bounds: anything beyond is a typo, not a real demand.
MAX_GPUS_PER_WORKER = 16
MAX_CPUS_PER_TASK = 512
MAX_MEM_GB_PER_TASK = 4096.0
MAX_TASKS = 256
MAX_EPOCHS = 1_000_000.0
MAX_TIME_LIMIT_MIN = 366 * 24 * 60
MAX_BATCH_SIZE = 2 ** 24  # samples per step, all workers together
MAX_EPOCH_SECONDS = 366 * 24 * 3600.0
SYNC_MODES = ("sync", "async")

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # used with fullmatch: no trailing newline
_USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
MAX_COMMAND_CHARS = 65_536  # a training command, not a payload
#: A Slurm account, QOS or partition name (a partition may be a comma-separated list of them, as sbatch -p takes).
_SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
#: A job's declared environment (``env``): a handful of settings, not a payload.
MAX_ENV_VARS = 64
MAX_ENV_NAME_CHARS = 128
MAX_ENV_CHARS = 32_768  # names and values together


# --------------------------------------------------------------------------------------------------
# submissions


@dataclass(frozen=True)
class JobSubmission:
    """A validated submission (build it with `validate_submission`)."""

    name: str
    owner: str
    job_type: str
    total_epochs: float
    command: str
    worker: TaskDemand
    ps: TaskDemand
    max_workers: int = MAX_WORKERS
    max_ps: int = MAX_PS
    sync: str = "sync"
    time_limit_min: int | None = None
    kind: str = "ps"  # one of KINDS
    batch_size: float | None = None  # total batch of an all-reduce job
    workers: int | None = None  # workers the user asks for (Slurm as it is would give exactly these)
    min_workers: int | None = None  # the fewest workers it may run with (None: 1); below them it waits
    epoch_seconds: float | None = None  # one-GPU seconds per epoch of a model dl2d does not know (a hint)
    launch: str | None = None  # "srun" (one process per worker, by dl2d) or "once"; None: the kind's default
    label: str | None = None  # the job's class for dl2ctl calibrate (None: its model)
    account: str | None = None  # Slurm account to charge (None: the owner's default)
    qos: str | None = None  # Slurm QOS (None: the owner's default)
    partition: str | None = None  # Slurm partition(s) (None: the daemon's [slurm] partition, else Slurm's default)
    env: dict[str, str] | None = None  # what the job's environment holds beyond dl2d's base (docs/jobs.md)
    #: the job lets dl2d choose its total batch (docs/jobs.md); ``batch_size`` is then its initial one, the batch
    #: its learning rate is tuned for, and the two limits the most it accepts (None: its model's measured limits)
    adaptive_batch: bool = False
    max_batch_size: float | None = None  # the largest total batch, all workers together
    max_local_batch: int | None = None  # the most samples one GPU takes in a pass (beyond: gradient accumulation)

    def spec(self) -> dict[str, Any]:
        """The JSON stored in `jobs.spec` (the optional fields only where given)."""
        optional = {"batch_size": self.batch_size, "workers": self.workers, "min_workers": self.min_workers,
                    "epoch_seconds": self.epoch_seconds,
                    "launch": self.launch, "label": self.label, "account": self.account, "qos": self.qos,
                    "partition": self.partition, "env": dict(self.env) if self.env else None,
                    "adaptive_batch": True if self.adaptive_batch else None, "max_batch_size": self.max_batch_size,
                    "max_local_batch": self.max_local_batch}
        return {
            "kind": self.kind,
            "command": self.command,
            "worker": asdict(self.worker),
            "ps": asdict(self.ps),
            "max_workers": self.max_workers,
            "max_ps": self.max_ps,
            "sync": self.sync,
            "time_limit_min": self.time_limit_min,
            **{k: v for k, v in optional.items() if v is not None},
        }


_SUBMISSION_KEYS = {
    "name", "owner", "job_type", "total_epochs", "command", "script",
    "worker", "ps", "max_workers", "max_ps", "sync", "time_limit_min",
    "kind", "batch_size", "workers", "min_workers", "epoch_seconds", "launch", "label", "account", "qos",
    "partition", "env", "adaptive_batch", "max_batch_size", "max_local_batch",
}


def _is_number(v: Any) -> bool:
    """A finite number; an integer too large for a float (hundreds of digits) is not one."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return abs(v) < 2 ** 63 if isinstance(v, int) else math.isfinite(v)


def _number(errors: list[str], where: str, v: Any, lo: float, hi: float, *, lo_open: bool = False,
            integer: bool = False) -> Any:
    """Check `lo <= v <= hi` (or `lo < v`); record a message and return None when it is not."""
    if not _is_number(v) or (integer and float(v) != int(v)):
        errors.append(f"{where} must be {'an integer' if integer else 'a number'}, got {v!r}")
        return None
    if (v <= lo if lo_open else v < lo) or v > hi:
        low = f"> {lo:g}" if lo_open else f">= {lo:g}"
        errors.append(f"{where} must be {low} and <= {hi:g}, got {v!r}")
        return None
    return int(v) if integer else float(v)


def _demand(errors: list[str], role: str, d: Any, gpus_allowed: bool, allreduce: bool = False) -> TaskDemand | None:
    """A task's demand; an all-reduce worker drives whole GPUs, one by default."""
    if not isinstance(d, Mapping):
        errors.append(f"{role} must be a mapping with gpus/cpus/mem_gb, got {d!r}")
        return None
    unknown = sorted(set(d) - {"gpus", "cpus", "mem_gb"})
    if unknown:
        errors.append(f"{role}: unknown keys {unknown} (expected gpus, cpus, mem_gb)")
    if allreduce:
        gpus = _number(errors, f"{role}.gpus", d.get("gpus", 1), 1, MAX_GPUS_PER_WORKER, integer=True)
        if gpus is None:
            errors[-1] += " (an all-reduce worker drives whole GPUs, at least one)"
    else:
        gpus = _number(errors, f"{role}.gpus", d.get("gpus", 0), 0, MAX_GPUS_PER_WORKER if gpus_allowed else 0)
    cpus = _number(errors, f"{role}.cpus", d.get("cpus"), 0, MAX_CPUS_PER_TASK, lo_open=True)
    mem = _number(errors, f"{role}.mem_gb", d.get("mem_gb"), 0, MAX_MEM_GB_PER_TASK, lo_open=True)
    if None in (gpus, cpus, mem):
        return None
    return TaskDemand(gpus=float(gpus), cpus=cpus, mem_gb=mem)


def _kind_and_model(errors: list[str], data: Mapping[str, Any], known: tuple[str, ...]) -> tuple[str, Any]:
    """(kind, model name as stored): a PS job's model is one of ``known`` (DL2's types); an all-reduce job's any
    name, a measured model's in the catalog's spelling (lower case)."""
    job_type = data.get("job_type")
    kind = data.get("kind")
    if kind is None:  # a DL2 type, or a job asking for parameter servers, is a PS job; any other all-reduce
        asked = data.get("ps")
        wants_ps = isinstance(asked, Mapping) and any(v not in (0, 0.0) for v in asked.values())
        kind = "ps" if job_type in known or wants_ps else "allreduce"
    elif kind not in KINDS:
        errors.append(f"kind must be one of {', '.join(KINDS)} (dl2ctl submit --arch), got {kind!r}")
        return "", job_type
    if kind == "ps" or job_type is None:
        if job_type not in known:
            errors.append(f"unknown job type {job_type!r}; known types: {', '.join(known)}"
                          + (" (a PS job's model is one of DL2's types; --arch allreduce takes any model)"
                             if job_type is not None else ""))
        return kind, job_type
    if not isinstance(job_type, str) or not _NAME_RE.fullmatch(job_type):
        errors.append(f"job_type of an all-reduce job must be a model name of 1-64 letters, digits, '.', '_', '-' "
                      f"starting with a letter or digit, got {job_type!r}")
        return kind, job_type
    return kind, job_type.lower() if job_type.lower() in ALLREDUCE_MODELS else job_type


def _allreduce_fields(errors: list[str], data: Mapping[str, Any], kind: str, model: Any) -> tuple[Any, Any]:
    """(batch_size, epoch_seconds) of an all-reduce job; a PS job takes neither."""
    batch, hint = data.get("batch_size"), data.get("epoch_seconds")
    if kind != "allreduce":
        for key, value in (("batch_size", batch), ("epoch_seconds", hint)):
            if value is not None:
                errors.append(f"{key}: only an all-reduce job (kind allreduce, --arch allreduce) takes one; "
                              "a PS job trains at its DL2 type's measured batch")
        return None, None
    measured = model in ALLREDUCE_MODELS
    if batch is not None or measured:
        batch = _number(errors, "batch_size", batch, 0, MAX_BATCH_SIZE, lo_open=True)
        if batch is None and measured:
            errors[-1] += f" (the total batch of the {model} job: its measured speed depends on it)"
    if hint is not None:
        if measured:
            errors.append(f"epoch_seconds: {model}'s speed is measured (dl2d.workload.throughput); the hint is "
                          "for models dl2d does not know")
            hint = None
        else:
            hint = _number(errors, "epoch_seconds", hint, 0, MAX_EPOCH_SECONDS, lo_open=True)
    return batch, hint


def _batch_limits(errors: list[str], data: Mapping[str, Any], kind: str, model: Any, batch: Any
                  ) -> tuple[bool, Any, Any]:
    """(adaptive_batch, max_batch_size, max_local_batch). dl2d chooses the batch only of a model whose throughput
    at every local batch and gradient statistics it has measured (it needs both to weigh a batch); the limits only
    with ``adaptive_batch``, and never below the batch the job starts at."""
    adaptive, top, local = data.get("adaptive_batch", False), data.get("max_batch_size"), data.get("max_local_batch")
    if not isinstance(adaptive, bool):
        errors.append(f"adaptive_batch must be true or false, got {adaptive!r}")
        return False, None, None
    if not adaptive:
        for key, value in (("max_batch_size", top), ("max_local_batch", local)):
            if value is not None:
                errors.append(f"{key}: a limit of the batch dl2d chooses; give adaptive_batch = true "
                              "(dl2ctl submit --adaptive-batch) with it")
        return False, None, None
    if kind != "allreduce":
        errors.append("adaptive_batch: only an all-reduce job's batch can change (a PS job trains at its DL2 "
                      "type's measured batch)")
        return False, None, None
    if model not in ALLREDUCE_MODELS:
        errors.append(f"adaptive_batch: dl2d chooses the batch of a model whose throughput and gradient noise it has "
                      f"measured ({', '.join(sorted(ALLREDUCE_MODELS))}), not {model!r}; submit it at a fixed batch")
        return False, None, None
    if top is not None:
        top = _number(errors, "max_batch_size", top, 0, MAX_BATCH_SIZE, lo_open=True)
        if top is not None and batch is not None and top < batch:
            errors.append(f"max_batch_size ({top:g}) is below the job's batch_size ({batch:g}): the batch it starts "
                          "at must be one it accepts")
    if local is not None:
        local = _number(errors, "max_local_batch", local, 1, MAX_BATCH_SIZE, integer=True)
    return True, top, local


def _slurm_name(errors: list[str], key: str, value: Any, *, several: bool = False) -> str | None:
    """An account, QOS or partition (``several``: a comma-separated list, as sbatch -p) as Slurm names them."""
    if value is None:
        return None
    names = value.split(",") if isinstance(value, str) and several else [value]
    if not all(isinstance(n, str) and _SLURM_NAME_RE.fullmatch(n) for n in names):
        what = "names" if several else "a name"
        errors.append(f"{key} must be {what} of 1-64 letters, digits, '.', '_', '-' (not starting with '.' or '-')"
                      f"{', separated by commas' if several else ''}, got {value!r}")
        return None
    return value


def _environment(errors: list[str], env: Any) -> dict[str, str] | None:
    """The variables a job declares for its environment: text values under shell variable names, a bounded
    handful, none that dl2d or Slurm set for the job (DL2D_*, SLURM_*) or that sbatch reads as options
    (SBATCH_*)."""
    if env is None:
        return None
    if not isinstance(env, Mapping):
        errors.append(f"env must be a table of NAME = \"value\" (dl2ctl submit --export NAME=VALUE), "
                      f"got {type(env).__name__}")
        return None
    if len(env) > MAX_ENV_VARS:
        errors.append(f"env may declare at most {MAX_ENV_VARS} variables, got {len(env)}")
        return None
    bad = len(errors)
    total = 0
    for name, value in env.items():
        if not isinstance(name, str) or len(name) > MAX_ENV_NAME_CHARS or not ENV_NAME_RE.fullmatch(name):
            errors.append(f"env: {str(name)[:MAX_ENV_NAME_CHARS]!r} is not a variable name (letters, digits and "
                          f"'_', not starting with a digit, at most {MAX_ENV_NAME_CHARS} characters)")
        elif name.startswith(RESERVED_ENV_PREFIXES):
            errors.append(f"env.{name}: names starting with {', '.join(RESERVED_ENV_PREFIXES)} are dl2d's and "
                          "Slurm's (set for the job, or read by sbatch as its options); choose another name")
        elif not isinstance(value, str):
            errors.append(f"env.{name} must be a string (quote it: {name} = \"{value}\"), got {value!r}")
        elif "\x00" in value:
            errors.append(f"env.{name} must not contain NUL characters")
        else:
            total += len(name) + len(value)
    if total > MAX_ENV_CHARS:
        errors.append(f"env holds {total} characters; at most {MAX_ENV_CHARS}")
    return dict(env) if len(errors) == bad else None


def validate_submission(data: Any, known_types: Iterable[str] = DL2_JOB_TYPES) -> JobSubmission:
    """Check a submission (parsed JSON/YAML) and return it typed, or raise SubmissionError listing all problems.

    Keys: name, owner, job_type, total_epochs, command (alias: script), worker {gpus, cpus, mem_gb},
    ps {cpus, mem_gb}, and optionally kind ("ps"|"allreduce"), max_workers, max_ps, sync ("sync"|"async"),
    time_limit_min, workers (asked for), and for all-reduce jobs batch_size (required for a measured model),
    epoch_seconds (a hint for a model dl2d does not know) and launch ("srun": dl2d starts one process per
    worker, the default; "once": the command starts its own); label (the job's class for dl2ctl calibrate);
    account, qos, partition (Slurm's, for the owner's job) and env (a table of variables the job's environment
    holds, docs/jobs.md); adaptive_batch with max_batch_size and max_local_batch (dl2d chooses the total batch of
    an all-reduce job of a measured model). ``known_types``: the models of PS jobs.

    An all-reduce job has no parameter servers: its [ps] table, if any, must ask for nothing, and max_ps is 0.
    """
    if not isinstance(data, Mapping):
        raise SubmissionError([f"a submission must be a mapping, got {type(data).__name__}"])
    errors: list[str] = []
    unknown = sorted(set(data) - _SUBMISSION_KEYS)
    if unknown:
        errors.append(f"unknown keys {unknown}")

    name = data.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        errors.append(f"name must be 1-64 characters of letters, digits, '.', '_', '-' "
                      f"starting with a letter or digit, got {name!r}")
    owner = data.get("owner")
    if not isinstance(owner, str) or not _USER_RE.fullmatch(owner):
        errors.append(f"owner must be a unix user name, got {owner!r}")
    kind, job_type = _kind_and_model(errors, data, tuple(known_types))
    allreduce = kind == "allreduce"
    epochs = _number(errors, "total_epochs", data.get("total_epochs"), 0, MAX_EPOCHS, lo_open=True)

    if "command" in data and "script" in data:
        errors.append("give either command or script, not both")
    command = data.get("command", data.get("script"))
    if not isinstance(command, str) or not command.strip():
        errors.append("missing script: give the training command as `command` (or `script`)")
    elif "\x00" in command:
        errors.append("command must not contain NUL characters")
    elif len(command) > MAX_COMMAND_CHARS:
        errors.append(f"command must be at most {MAX_COMMAND_CHARS} characters, got {len(command)}")

    worker = _demand(errors, "worker", data.get("worker"), gpus_allowed=True, allreduce=allreduce)
    if allreduce:
        ps = TaskDemand(0.0, 0.0, 0.0)
        asked = data.get("ps")
        if asked is not None and (not isinstance(asked, Mapping) or any(v not in (0, 0.0) for v in asked.values())):
            errors.append(f"ps: an all-reduce job has no parameter servers; leave out [ps] (or give --arch ps), "
                          f"got {asked!r}")
        if data.get("max_ps") not in (None, 0):
            errors.append(f"max_ps: an all-reduce job has no parameter servers, got {data.get('max_ps')!r}")
        max_ps = 0
    else:
        ps = _demand(errors, "ps", data.get("ps"), gpus_allowed=False)
        max_ps = _number(errors, "max_ps", data.get("max_ps", MAX_PS), 1, MAX_TASKS, integer=True)
    default_max = ALLREDUCE_MAX_WORKERS if allreduce else MAX_WORKERS
    max_workers = _number(errors, "max_workers", data.get("max_workers", default_max), 1, MAX_TASKS, integer=True)
    workers = data.get("workers")
    if workers is not None:
        workers = _number(errors, "workers", workers, 1, MAX_TASKS, integer=True)
        if workers is not None and max_workers is not None and workers > max_workers:
            errors.append(f"workers ({workers}) must be <= max_workers ({max_workers})")
    min_workers = data.get("min_workers")
    if min_workers is not None:
        min_workers = _number(errors, "min_workers", min_workers, 1, MAX_TASKS, integer=True)
        for other, value in (("max_workers", max_workers), ("workers", workers)):
            if min_workers is not None and value is not None and min_workers > value:
                errors.append(f"min_workers ({min_workers}) must be <= {other} ({value})")
    batch, epoch_seconds = _allreduce_fields(errors, data, kind, job_type)
    adaptive, max_batch, max_local = _batch_limits(errors, data, kind, job_type, batch)
    launch = data.get("launch")
    if launch is not None and launch not in LAUNCHES:
        errors.append(f"launch must be one of {LAUNCHES}, got {launch!r}")
    elif launch == "srun" and not allreduce:
        errors.append("launch: a PS job's runtime (dl2-run) starts its own tasks; launch = \"srun\" is for "
                      "all-reduce jobs")
    label = data.get("label")
    if label is not None and (not isinstance(label, str) or not _NAME_RE.fullmatch(label)):
        errors.append(f"label must be 1-64 characters of letters, digits, '.', '_', '-' starting with a letter or "
                      f"digit, got {label!r}")
    sync = data.get("sync", "sync")
    if sync not in SYNC_MODES:
        errors.append(f"sync must be one of {SYNC_MODES}, got {sync!r}")
    time_limit = data.get("time_limit_min")
    if time_limit is not None:
        time_limit = _number(errors, "time_limit_min", time_limit, 0, MAX_TIME_LIMIT_MIN, lo_open=True,
                             integer=True)

    account = _slurm_name(errors, "account", data.get("account"))
    qos = _slurm_name(errors, "qos", data.get("qos"))
    partition = _slurm_name(errors, "partition", data.get("partition"), several=True)
    env = _environment(errors, data.get("env"))

    if errors:
        raise SubmissionError(errors)
    return JobSubmission(
        name=name, owner=owner, job_type=job_type, total_epochs=epochs, command=command.strip(),
        worker=worker, ps=ps, max_workers=max_workers, max_ps=max_ps, sync=sync, time_limit_min=time_limit,
        kind=kind, batch_size=batch, workers=workers, min_workers=min_workers, epoch_seconds=epoch_seconds,
        launch=launch, label=label,
        account=account, qos=qos, partition=partition, env=env or None,
        adaptive_batch=adaptive, max_batch_size=max_batch, max_local_batch=max_local,
    )


def submit_job(session: Session, submission: JobSubmission | Mapping[str, Any],
               known_types: Iterable[str] = DL2_JOB_TYPES, now: datetime | None = None) -> Job:
    """Insert a PENDING job and its `submit` event. A mapping is validated first (nothing written if bad)."""
    sub = submission if isinstance(submission, JobSubmission) else validate_submission(submission, known_types)
    now = now or utcnow()
    job = Job(
        name=sub.name, owner=sub.owner, job_type=sub.job_type, total_epochs=sub.total_epochs,
        epochs_done=0.0, state=JobState.PENDING, spec=sub.spec(), submitted_at=now, workers=0, ps=0,
    )
    session.add(job)
    session.flush()
    record_event(session, EventKind.SUBMIT, job, {"name": sub.name, "job_type": sub.job_type}, ts=now)
    return job


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts is not None else None


def job_record(job: Any, now: datetime) -> dict[str, Any]:
    """A job (ORM row or anything with the same attributes) as a JSON-ready dict."""
    return {
        "id": job.id,
        "name": job.name,
        "owner": job.owner,
        "job_type": job.job_type,
        "state": JobState(job.state).value,
        "workers": job.workers,
        "ps": job.ps,
        "epochs_done": job.epochs_done,
        "total_epochs": job.total_epochs,
        "lost_epochs": getattr(job, "lost_epochs", 0.0) or 0.0,
        "slurm_job_id": job.slurm_job_id,
        "submitted_at": _iso(job.submitted_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "age_s": round((now - job.submitted_at).total_seconds(), 3),
    }


def submission_owner_problem(owner: Any, requester: str, admin: bool) -> str | None:
    """Why ``requester`` may not submit a job owned by ``owner`` (None: they may): only root and dl2d admins
    submit on behalf of another user."""
    if owner == requester or admin or requester == "root":
        return None
    return f"owner {owner!r}: only root or a dl2d admin may submit for another user (you are {requester!r})"


def get_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise JobNotFound(f"no job with id {job_id}")
    return job


def cancel_job(session: Session, job_id: int, requester: str, now: datetime | None = None, *,
               admin: bool = False) -> Job:
    """Cancel a job on behalf of `requester`: its owner, root, or (``admin=True``) a dl2d admin, which the
    `cancel` event records as ``{"requester": ..., "as": "admin"}``.

    The job is marked CANCELLED at once; if it holds a Slurm allocation, a `cancel` intent is journalled
    for the daemon to carry out (scancel).
    """
    job = get_job(session, job_id)
    owner_or_root = requester in (job.owner, "root")
    if not (owner_or_root or admin):
        raise PermissionDenied(f"user {requester!r} may not cancel job {job_id}: it belongs to {job.owner!r} "
                               "(only the owner or root can cancel it)")
    if JobState(job.state).terminal:
        raise InvalidTransition(f"job {job_id} is already {job.state.value}")
    now = now or utcnow()
    if job.slurm_job_id is not None:
        plan_intent(session, None, job, IntentKind.CANCEL, {"slurm_job_id": job.slurm_job_id})
    job.state = JobState.CANCELLED
    job.finished_at = now
    detail = {"requester": requester} if owner_or_root else {"requester": requester, "as": "admin"}
    record_event(session, EventKind.CANCEL, job, detail, ts=now)
    return job


def cancel_jobs(engine: Any, job_ids: Iterable[int], requester: str, *, admin: bool) -> list[dict[str, Any]]:
    """Cancel each job for ``requester`` in its own transaction (one refusal does not undo the others):
    ``[{"id", "cancelled": True, "name"} | {"id", "cancelled": False, "error"}]`` in the order given, each id
    once. Used by the daemon's control socket and by dl2ctl's direct mode."""
    from dl2d.db.engine import session_scope

    results: list[dict[str, Any]] = []
    for job_id in dict.fromkeys(job_ids):
        try:
            with session_scope(engine) as s:
                job = cancel_job(s, job_id, requester, admin=admin)
                results.append({"id": job_id, "cancelled": True, "name": job.name})
        except DBError as e:
            msg = str(e)
            if isinstance(e, InvalidTransition):
                msg += "; only pending or running jobs can be cancelled"
            results.append({"id": job_id, "cancelled": False, "error": msg})
    return results


# --------------------------------------------------------------------------------------------------
# queries

_IN_CHUNK = 500  # ids per IN (...): well below every backend's bound-parameter limit


def _without_spec(q, spec: bool):
    """The daemon's hot paths leave out the spec JSON (never needed there, and the widest column)."""
    return q if spec else q.options(defer(Job.spec))


def active_jobs(session: Session, *, spec: bool = True) -> list[Job]:
    """The jobs not yet over (`ACTIVE_STATES`), by id; ``spec=False`` defers the spec column."""
    q = select(Job).where(Job.state.in_(ACTIVE_STATES)).order_by(Job.id)
    return list(session.scalars(_without_spec(q, spec)))


def active_job_ids(session: Session) -> list[int]:
    return list(session.scalars(select(Job.id).where(Job.state.in_(ACTIVE_STATES)).order_by(Job.id)))


def count_active_jobs(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(Job).where(Job.state.in_(ACTIVE_STATES))))


def user_job_counts(session: Session, owner: str) -> tuple[int, int]:
    """(jobs of ``owner`` waiting to start, jobs of theirs pending or running): what the submission limits count
    (dl2d.daemon.quota)."""
    rows = session.execute(select(Job.state, func.count()).where(Job.owner == owner, Job.state.in_(ACTIVE_STATES))
                           .group_by(Job.state)).all()
    counts = {JobState(state): int(n) for state, n in rows}
    return counts.get(JobState.PENDING, 0), sum(counts.values())


def count_jobs_by_state(session: Session) -> dict[JobState, int]:
    """Jobs per state; states without a job are absent."""
    return {JobState(st): int(n) for st, n in session.execute(select(Job.state, func.count()).group_by(Job.state))}


def jobs_by_id(session: Session, job_ids: Iterable[int], *, spec: bool = True) -> dict[int, Job]:
    """The jobs with these ids, by id (ids without a job are absent); ``spec=False`` defers the spec."""
    q = select(Job).where(Job.id.in_(set(job_ids)))
    return {j.id: j for j in session.scalars(_without_spec(q, spec))}


def job_specs(session: Session, job_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The submission spec of each job (``{}`` where it is NULL), read in chunks of ids."""
    ids = list(job_ids)
    out: dict[int, dict[str, Any]] = {}
    for i in range(0, len(ids), _IN_CHUNK):
        for job_id, spec in session.execute(select(Job.id, Job.spec).where(Job.id.in_(ids[i:i + _IN_CHUNK]))):
            out[job_id] = spec or {}
    return out


def list_jobs(session: Session, states: Iterable[JobState] = (), owners: Iterable[str] = ()) -> list[Job]:
    """Jobs by id, only those in `states` and of `owners` where given (empty: no filter): `dl2ctl queue`."""
    q = select(Job).order_by(Job.id)
    states, owners = list(states), list(owners)
    if states:
        q = q.where(Job.state.in_(states))
    if owners:
        q = q.where(Job.owner.in_(owners))
    return list(session.scalars(q))


def jobs_with_name_prefix(session: Session, prefix: str) -> list[Job]:
    """Jobs whose name starts with `prefix` (`%` and `_` in it match themselves), by id."""
    return list(session.scalars(select(Job).where(Job.name.startswith(prefix, autoescape=True)).order_by(Job.id)))


def job_names_with_prefix(session: Session, prefix: str) -> set[str]:
    return set(session.scalars(select(Job.name).where(Job.name.startswith(prefix, autoescape=True))))
