"""The repository layer the daemon and `dl2ctl` call. Functions take a Session and never commit: the caller
owns the transaction (`with session_scope(engine) as s: ...`).

Validation (`validate_submission`) is a pure function, so a malformed submission is rejected before
anything touches the database.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dl2d.db.models import (
    Allocation,
    Decision,
    DecisionSource,
    Event,
    EventKind,
    Intent,
    JobSlotStat,
    IntentKind,
    IntentState,
    Job,
    JobState,
    NodeSample,
    Slot,
    utcnow,
)
from dl2d.sim.jobtypes import TYPE_NAMES

#: The 8 models of DL2's evaluation: the simulator's catalogue is the one list of job types.
DL2_JOB_TYPES: tuple[str, ...] = TYPE_NAMES

# Sanity bounds: anything beyond is a typo, not a real demand.
MAX_GPUS_PER_WORKER = 16
MAX_CPUS_PER_TASK = 512
MAX_MEM_GB_PER_TASK = 4096.0
MAX_TASKS = 256
MAX_EPOCHS = 1_000_000.0
MAX_TIME_LIMIT_MIN = 366 * 24 * 60
SYNC_MODES = ("sync", "async")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


class StoreError(Exception):
    """Base class of the errors this module raises on purpose."""


class SubmissionError(StoreError, ValueError):
    """A malformed job submission; `errors` lists every problem found."""

    def __init__(self, errors: Sequence[str]):
        self.errors = list(errors)
        super().__init__("invalid job submission: " + "; ".join(self.errors))


class JobNotFound(StoreError, LookupError):
    pass


class PermissionDenied(StoreError, PermissionError):
    pass


class InvalidTransition(StoreError):
    pass


# --------------------------------------------------------------------------------------------------
# submissions


@dataclass(frozen=True)
class Demand:
    gpus: float
    cpus: float
    mem_gb: float


@dataclass(frozen=True)
class JobSubmission:
    """A validated submission (build it with `validate_submission`)."""

    name: str
    owner: str
    job_type: str
    total_epochs: float
    command: str
    worker: Demand
    ps: Demand
    max_workers: int = 16
    max_ps: int = 16
    sync: str = "sync"
    time_limit_min: int | None = None

    def spec(self) -> dict[str, Any]:
        """The JSON stored in `jobs.spec`."""
        return {
            "command": self.command,
            "worker": asdict(self.worker),
            "ps": asdict(self.ps),
            "max_workers": self.max_workers,
            "max_ps": self.max_ps,
            "sync": self.sync,
            "time_limit_min": self.time_limit_min,
        }


_SUBMISSION_KEYS = {
    "name", "owner", "job_type", "total_epochs", "command", "script",
    "worker", "ps", "max_workers", "max_ps", "sync", "time_limit_min",
}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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


def _demand(errors: list[str], role: str, d: Any, gpus_allowed: bool) -> Demand | None:
    if not isinstance(d, Mapping):
        errors.append(f"{role} must be a mapping with gpus/cpus/mem_gb, got {d!r}")
        return None
    unknown = sorted(set(d) - {"gpus", "cpus", "mem_gb"})
    if unknown:
        errors.append(f"{role}: unknown keys {unknown} (expected gpus, cpus, mem_gb)")
    gpus = _number(errors, f"{role}.gpus", d.get("gpus", 0), 0, MAX_GPUS_PER_WORKER if gpus_allowed else 0)
    cpus = _number(errors, f"{role}.cpus", d.get("cpus"), 0, MAX_CPUS_PER_TASK, lo_open=True)
    mem = _number(errors, f"{role}.mem_gb", d.get("mem_gb"), 0, MAX_MEM_GB_PER_TASK, lo_open=True)
    if None in (gpus, cpus, mem):
        return None
    return Demand(gpus=gpus, cpus=cpus, mem_gb=mem)


def validate_submission(data: Any, known_types: Iterable[str] = DL2_JOB_TYPES) -> JobSubmission:
    """Check a submission (parsed JSON/YAML) and return it typed, or raise SubmissionError listing all problems.

    Keys: name, owner, job_type, total_epochs, command (alias: script), worker {gpus, cpus, mem_gb},
    ps {cpus, mem_gb}, and optionally max_workers, max_ps, sync ("sync"|"async"), time_limit_min.
    """
    if not isinstance(data, Mapping):
        raise SubmissionError([f"a submission must be a mapping, got {type(data).__name__}"])
    errors: list[str] = []
    unknown = sorted(set(data) - _SUBMISSION_KEYS)
    if unknown:
        errors.append(f"unknown keys {unknown}")

    name = data.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        errors.append(f"name must be 1-64 characters of letters, digits, '.', '_', '-' "
                      f"starting with a letter or digit, got {name!r}")
    owner = data.get("owner")
    if not isinstance(owner, str) or not _USER_RE.match(owner):
        errors.append(f"owner must be a unix user name, got {owner!r}")
    known = tuple(known_types)
    job_type = data.get("job_type")
    if job_type not in known:
        errors.append(f"unknown job type {job_type!r}; known types: {', '.join(known)}")
    epochs = _number(errors, "total_epochs", data.get("total_epochs"), 0, MAX_EPOCHS, lo_open=True)

    if "command" in data and "script" in data:
        errors.append("give either command or script, not both")
    command = data.get("command", data.get("script"))
    if not isinstance(command, str) or not command.strip():
        errors.append("missing script: give the training command as `command` (or `script`)")
    elif "\x00" in command:
        errors.append("command must not contain NUL characters")

    worker = _demand(errors, "worker", data.get("worker"), gpus_allowed=True)
    ps = _demand(errors, "ps", data.get("ps"), gpus_allowed=False)
    max_workers = _number(errors, "max_workers", data.get("max_workers", 16), 1, MAX_TASKS, integer=True)
    max_ps = _number(errors, "max_ps", data.get("max_ps", 16), 1, MAX_TASKS, integer=True)
    sync = data.get("sync", "sync")
    if sync not in SYNC_MODES:
        errors.append(f"sync must be one of {SYNC_MODES}, got {sync!r}")
    time_limit = data.get("time_limit_min")
    if time_limit is not None:
        time_limit = _number(errors, "time_limit_min", time_limit, 0, MAX_TIME_LIMIT_MIN, lo_open=True,
                             integer=True)

    if errors:
        raise SubmissionError(errors)
    return JobSubmission(
        name=name, owner=owner, job_type=job_type, total_epochs=epochs, command=command.strip(),
        worker=worker, ps=ps, max_workers=max_workers, max_ps=max_ps, sync=sync, time_limit_min=time_limit,
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


def get_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise JobNotFound(f"no job with id {job_id}")
    return job


def cancel_job(session: Session, job_id: int, requester: str, now: datetime | None = None) -> Job:
    """Cancel a job on behalf of `requester` (its owner or root).

    The job is marked CANCELLED at once; if it holds a Slurm allocation, a `cancel` intent is journalled
    for the daemon to carry out (scancel).
    """
    job = get_job(session, job_id)
    if requester not in (job.owner, "root"):
        raise PermissionDenied(f"user {requester!r} may not cancel job {job_id}: it belongs to {job.owner!r} "
                               "(only the owner or root can cancel it)")
    if JobState(job.state).terminal:
        raise InvalidTransition(f"job {job_id} is already {job.state.value}")
    now = now or utcnow()
    if job.slurm_job_id is not None:
        plan_intent(session, None, job, IntentKind.CANCEL, {"slurm_job_id": job.slurm_job_id})
    job.state = JobState.CANCELLED
    job.finished_at = now
    record_event(session, EventKind.CANCEL, job, {"requester": requester}, ts=now)
    return job


# --------------------------------------------------------------------------------------------------
# events, slots, decisions


def _id(obj: Any) -> int | None:
    return obj if obj is None or isinstance(obj, int) else obj.id


def record_events(session: Session, events: Iterable[tuple[EventKind | str, Job | int | None,
                                                           Mapping[str, Any] | None, datetime | None]]) -> int:
    """Insert many (kind, job, detail, ts) events in one executemany; returns how many."""
    rows = [{"job_id": _id(job), "kind": EventKind(kind), "detail": dict(detail) if detail else None,
             "ts": ts or utcnow()} for kind, job, detail, ts in events]
    if rows:
        session.execute(insert(Event), rows)
    return len(rows)


def record_event(session: Session, kind: EventKind | str, job: Job | int | None = None,
                 detail: Mapping[str, Any] | None = None, ts: datetime | None = None) -> Event:
    ev = Event(job_id=_id(job), kind=EventKind(kind), detail=dict(detail) if detail else None, ts=ts or utcnow())
    session.add(ev)
    return ev


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def state_digest(state: Any) -> str:
    """sha256 hex of the policy input (bytes as is, anything else as canonical JSON)."""
    data = state if isinstance(state, bytes) else canonical_json(state).encode()
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class AllocationRecord:
    job_id: int
    workers: int
    ps: int
    prev_workers: int = 0
    prev_ps: int = 0


@dataclass(frozen=True)
class DecisionRecord:
    state_digest: str
    actions: list[Any]
    source: DecisionSource | str = DecisionSource.POLICY
    fallback_reason: str | None = None
    policy_version: int | None = None
    latency_ms: float | None = None
    created_at: datetime | None = None
    job_flags: dict[str, list[str]] | None = None  # jobs flagged from their measured stats (dl2d.daemon.jobstats)


def record_slot(
    session: Session,
    number: int,
    started_at: datetime,
    allocations: Sequence[AllocationRecord] = (),
    decision: DecisionRecord | None = None,
    *,
    ended_at: datetime | None = None,
    reward: float | None = None,
    policy_version: int | None = None,
    duration_ms: float | None = None,
) -> Slot:
    """Record a slot with its allocations and decision, all or nothing (a SAVEPOINT inside the caller's
    transaction: on any error nothing of the slot remains and the exception propagates)."""
    with session.begin_nested():
        slot = Slot(
            number=number, started_at=started_at, ended_at=ended_at, reward=reward,
            policy_version=policy_version, n_jobs=len(allocations), duration_ms=duration_ms,
        )
        if decision is not None:
            d = asdict(decision)
            d["source"] = DecisionSource(d["source"])
            d["created_at"] = d["created_at"] or started_at
            slot.decision = Decision(**d)
        session.add(slot)
        session.flush()
        if allocations:  # one executemany instead of an ORM object per job
            session.execute(insert(Allocation), [{"slot_id": slot.id, "job_id": a.job_id, "workers": a.workers,
                                                  "ps": a.ps, "prev_workers": a.prev_workers, "prev_ps": a.prev_ps}
                                                 for a in allocations])
            session.expire(slot, ["allocations"])  # loaded from the rows on first access
    return slot


def finish_slot(session: Session, slot: Slot | int, ended_at: datetime, reward: float,
                duration_ms: float | None = None) -> Slot:
    """Store the reward observed at the end of a slot."""
    s = slot if isinstance(slot, Slot) else session.get_one(Slot, slot)
    s.ended_at, s.reward = ended_at, reward
    if duration_ms is not None:
        s.duration_ms = duration_ms
    return s


def record_job_slot_stats(session: Session, slot: Slot | int, rows: Iterable[Mapping[str, Any]]) -> int:
    """One ``job_slot_stats`` row per mapping (the keys of ``JobSlotStats.row()``), in one executemany."""
    slot_id = _id(slot)
    rows = [{**r, "slot_id": slot_id} for r in rows]
    if rows:
        session.execute(insert(JobSlotStat), rows)
    return len(rows)


def recent_job_slot_stats(session: Session, job_ids: Iterable[int], per_job: int) -> dict[int, list[dict[str, Any]]]:
    """Each job's last ``per_job`` ``job_slot_stats`` rows (oldest first), as column -> value dicts."""
    ids = list(job_ids)
    if not ids or per_job <= 0:
        return {}
    cols = [c for c in JobSlotStat.__table__.columns if c.name not in ("id",)]
    rank = func.row_number().over(partition_by=JobSlotStat.job_id, order_by=JobSlotStat.slot_id.desc())
    inner = select(*cols, rank.label("rank")).where(JobSlotStat.job_id.in_(ids)).subquery()
    out: dict[int, list[dict[str, Any]]] = {}
    q = select(*[inner.c[c.name] for c in cols]).where(inner.c.rank <= per_job).order_by(inner.c.job_id,
                                                                                        inner.c.slot_id)
    for r in session.execute(q).mappings():
        out.setdefault(r["job_id"], []).append(dict(r))
    return out


# --------------------------------------------------------------------------------------------------
# the intent journal (see docs/database.md)

_TRANSITIONS: dict[IntentState, tuple[IntentState, ...]] = {
    IntentState.PLANNED: (IntentState.ISSUED, IntentState.FAILED),
    IntentState.ISSUED: (IntentState.DONE, IntentState.FAILED),
    IntentState.DONE: (),
    IntentState.FAILED: (),
}


def idempotency_key(slot_id: int | None, job_id: int, kind: IntentKind | str, target: Mapping[str, Any]) -> str:
    """sha256 of (slot, job, kind, target): the same plan for the same slot always gets the same key."""
    return state_digest({"slot": slot_id, "job": job_id, "kind": IntentKind(kind).value, "target": target})


def plan_intent(session: Session, slot: Slot | int | None, job: Job | int, kind: IntentKind | str,
                target: Mapping[str, Any]) -> Intent:
    """Journal an action before it is issued. Planning the same (slot, job, kind, target) again, e.g. after
    a crash, returns the existing intent instead of a duplicate."""
    slot_id, job_id, kind = _id(slot), _id(job), IntentKind(kind)
    target = json.loads(canonical_json(target))  # what the JSON column will hold
    key = idempotency_key(slot_id, job_id, kind, target)
    existing = session.scalar(select(Intent).where(Intent.idempotency_key == key))
    if existing is not None:
        return existing
    intent = Intent(slot_id=slot_id, job_id=job_id, kind=kind, target=target, idempotency_key=key,
                    state=IntentState.PLANNED)
    try:
        with session.begin_nested():  # another process may have planned it concurrently
            session.add(intent)
            session.flush()
    except IntegrityError:
        return session.scalars(select(Intent).where(Intent.idempotency_key == key)).one()
    return intent


def plan_intents(session: Session, slot: Slot | int | None,
                 items: Sequence[tuple[Job | int, IntentKind | str, Mapping[str, Any]]]) -> list[Intent]:
    """:func:`plan_intent` for many (job, kind, target) at once, in order: one query for the keys already
    journalled and one flush for the new intents."""
    slot_id = _id(slot)
    rows = []
    for job, kind, target in items:
        kind = IntentKind(kind)
        target = json.loads(canonical_json(target))
        rows.append((_id(job), kind, target, idempotency_key(slot_id, _id(job), kind, target)))
    existing: dict[str, Intent] = {}
    keys = [r[3] for r in rows]
    for i in range(0, len(keys), 500):
        existing.update((it.idempotency_key, it) for it in
                        session.scalars(select(Intent).where(Intent.idempotency_key.in_(keys[i:i + 500]))))
    out, new = [], []
    for job_id, kind, target, key in rows:
        it = existing.get(key)
        if it is None:
            it = existing[key] = Intent(slot_id=slot_id, job_id=job_id, kind=kind, target=target,
                                        idempotency_key=key, state=IntentState.PLANNED)
            new.append(it)
        out.append(it)
    if new:
        with session.begin_nested():
            session.add_all(new)
            session.flush()
    return out


def transition_intents(session: Session, intent_ids: Sequence[int], to: IntentState,
                       error: str | None = None) -> int:
    """:func:`_transition` for many intents in one UPDATE (those already in ``to`` are left as they are);
    raises InvalidTransition, changing nothing, if any of them may not move to ``to``. Returns the rows changed."""
    ids = list(dict.fromkeys(intent_ids))
    states: dict[int, IntentState] = {}
    for i in range(0, len(ids), 500):
        states.update(session.execute(select(Intent.id, Intent.state).where(Intent.id.in_(ids[i:i + 500]))).all())
    missing = [i for i in ids if i not in states]
    if missing:
        raise InvalidTransition(f"no intent with id {missing[0]}")
    bad = [(i, st) for i, st in states.items() if st != to and to not in _TRANSITIONS[IntentState(st)]]
    if bad:
        i, st = bad[0]
        raise InvalidTransition(f"intent {i}: {IntentState(st).value} -> {to.value} is not allowed")
    move = [i for i, st in states.items() if st != to]
    values: dict[str, Any] = {"state": to, "updated_at": utcnow()}
    if error is not None:
        values["error"] = error
    for i in range(0, len(move), 500):
        session.execute(update(Intent).where(Intent.id.in_(move[i:i + 500])).values(**values))
    return len(move)


def _transition(session: Session, intent: Intent | int, to: IntentState, error: str | None = None) -> Intent:
    it = intent if isinstance(intent, Intent) else session.get_one(Intent, intent)
    current = IntentState(it.state)
    if current == to:  # replaying a step that was already recorded is a no-op
        return it
    if to not in _TRANSITIONS[current]:
        raise InvalidTransition(f"intent {it.id}: {current.value} -> {to.value} is not allowed")
    it.state, it.updated_at = to, utcnow()
    if error is not None:
        it.error = error
    session.flush()
    return it


def mark_issued(session: Session, intent: Intent | int) -> Intent:
    """Call (and commit) right before sending the action to Slurm."""
    return _transition(session, intent, IntentState.ISSUED)


def mark_done(session: Session, intent: Intent | int) -> Intent:
    return _transition(session, intent, IntentState.DONE)


def mark_failed(session: Session, intent: Intent | int, error: str) -> Intent:
    return _transition(session, intent, IntentState.FAILED, error)


def pending_intents(session: Session) -> list[Intent]:
    """PLANNED or ISSUED intents, oldest first: what a restarting daemon must replay or reconcile."""
    q = (select(Intent).where(Intent.state.in_([IntentState.PLANNED, IntentState.ISSUED]))
         .order_by(Intent.id))
    return list(session.scalars(q))


# --------------------------------------------------------------------------------------------------
# node samples and retention

_SAMPLE_COLUMNS = frozenset(c.name for c in NodeSample.__table__.columns) - {"id", "payload"}


def _to_db(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of `sample_to_row`/`downsample` (ts in epoch seconds or datetime) -> node_samples values."""
    out: dict[str, Any] = dict.fromkeys(_SAMPLE_COLUMNS)  # executemany needs the same keys in every row
    out.update(resolution_s=0, n=1, gpu_count=0)
    extras = dict(row.get("payload") or {})
    for k, v in row.items():
        if k in _SAMPLE_COLUMNS:
            if v is not None:
                out[k] = v
        elif k != "payload":
            extras[k] = v
    out["payload"] = extras or None
    if isinstance(out["ts"], (int, float)):
        out["ts"] = datetime.fromtimestamp(out["ts"], timezone.utc)
    out["resolution_s"] = int(out["resolution_s"])
    return out


def _from_db(sample: NodeSample) -> dict[str, Any]:
    """The inverse of `_to_db` (payload keys flattened back into the row)."""
    row = dict(sample.payload or {})
    row.update({c: getattr(sample, c) for c in _SAMPLE_COLUMNS})
    row["ts"] = sample.ts.timestamp()
    row["resolution_s"] = float(sample.resolution_s)
    return row


def insert_node_samples(session: Session, rows: Iterable[Mapping[str, Any]]) -> int:
    """Bulk-insert node-sample rows as made by `dl2d.agents.retention.sample_to_row` (keys without a column
    go to `payload`). Returns the number of rows."""
    values = [_to_db(r) for r in rows]
    if values:
        session.execute(NodeSample.__table__.insert(), values)
    return len(values)


@dataclass
class RetentionResult:
    loaded: int = 0  # rows read and handed to downsample()
    removed: int = 0  # rows deleted (merged or expired)
    added: int = 0  # merged rows inserted


def apply_retention(session: Session, now: datetime | None = None,
                    tiers: Sequence[tuple[float, float]] | None = None) -> RetentionResult:
    """Apply the retention tiers of `dl2d.agents.retention` (raw 1 h, 1-minute means 24 h, 10-minute means
    30 days, then deleted) to the node_samples table.

    Only the rows that must change are read: rows older than the last tier are deleted in SQL; rows that
    aged into a coarser tier, together with the coarse rows of the buckets they fall into (merged again,
    weighted by `n`), go through the pure `downsample()`. Rows it returns unchanged stay as they are.
    """
    from dl2d.agents.retention import DEFAULT_TIERS, downsample

    tiers = tuple(tiers or DEFAULT_TIERS)
    now = now or utcnow()
    result = RetentionResult()
    expired = NodeSample.ts <= now - timedelta(seconds=tiers[-1][0])
    result.removed += session.execute(delete(NodeSample).where(expired)).rowcount

    loaded: dict[int, tuple[int, dict[str, Any]]] = {}  # id(row dict) -> (db id, row)
    seen: set[int] = set()

    def load(where) -> None:
        for sample in session.scalars(select(NodeSample).where(where & ~expired)):
            if sample.id not in seen:
                seen.add(sample.id)
                row = _from_db(sample)
                loaded[id(row)] = (sample.id, row)

    for (prev_age, _), (_, res) in zip(tiers, tiers[1:]):
        aged = NodeSample.ts <= now - timedelta(seconds=prev_age)
        before = len(loaded)
        load(aged & (NodeSample.resolution_s < res))
        if len(loaded) > before:  # coarse rows these may merge into: first bucket start .. tier's end
            first = min(r["ts"] for _, r in list(loaded.values())[before:])
            start = datetime.fromtimestamp(first - first % res, timezone.utc)
            load(aged & (NodeSample.resolution_s == int(res)) & (NodeSample.ts >= start))

    kept = downsample([row for _, row in loaded.values()], now.timestamp(), tiers)
    unchanged = {id(r) for r in kept if id(r) in loaded}
    gone = [db_id for key, (db_id, _) in loaded.items() if key not in unchanged]
    new = [_to_db(r) for r in kept if id(r) not in loaded]
    for i in range(0, len(gone), 1000):
        session.execute(delete(NodeSample).where(NodeSample.id.in_(gone[i:i + 1000])))
    if new:
        session.execute(NodeSample.__table__.insert(), new)
    result.loaded, result.removed, result.added = len(loaded), result.removed + len(gone), len(new)
    return result
