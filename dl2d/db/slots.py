"""Slots: each scheduling interval with its allocations, decision, reward and per-job measurements.

A slot is written whole at its start (`record_slot`: slot, allocations, decision in one SAVEPOINT) and
closed at its end (`finish_slot`, `record_job_slot_stats`). Functions take a Session and never commit.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, func, insert, select
from sqlalchemy.orm import Session

from dl2d.db.models import (
    Allocation,
    Decision,
    DecisionSource,
    Job,
    JobSlotStat,
    Slot,
    row_id,
)


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
    advice: dict[str, Any] | None = None  # advise mode: what the configured policy would have done (models.Decision)
    policy: str | None = None  # the name of the policy in charge (a reload changes it); None: not said


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
    slot_id = row_id(slot)
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


def speed_samples(session: Session) -> list[dict[str, Any]]:
    """Every ``job_slot_stats`` row with its slot's number and its job's type and spec (``job_id``, ``number``,
    ``workers``, ``epochs_per_s``, ``ended``, ``nodes``, ``job_type``, ``spec``, ``total_epochs``), job by
    job in slot order: what ``dl2ctl calibrate`` fits speed curves to."""
    q = (select(JobSlotStat.job_id, Slot.number, JobSlotStat.workers, JobSlotStat.epochs_per_s, JobSlotStat.ended,
                JobSlotStat.nodes, Job.job_type, Job.spec, Job.total_epochs)
         .join(Slot, Slot.id == JobSlotStat.slot_id).join(Job, Job.id == JobSlotStat.job_id)
         .order_by(JobSlotStat.job_id, Slot.number))
    return [dict(r) for r in session.execute(q).mappings()]


def next_slot_number(session: Session) -> int:
    """The number the next slot gets: one more than the highest recorded, 0 for the first."""
    last = session.scalar(select(func.max(Slot.number)))
    return 0 if last is None else last + 1


def open_slot_ids(session: Session) -> list[int]:
    """Slots that were started but never closed (a daemon stopped or killed mid-slot), in slot order."""
    return list(session.scalars(select(Slot.id).where(Slot.ended_at.is_(None)).order_by(Slot.number)))


def last_slot(session: Session) -> Slot | None:
    """The slot with the highest number, or None before the first."""
    return session.scalars(select(Slot).order_by(Slot.number.desc()).limit(1)).first()


def pending_reasons(session: Session) -> dict[int, str]:
    """Why each job the last slot left without a worker waits (the daemon's ``pending: ...`` job flag, e.g.
    ``Resources: no node has ...``), by job id."""
    last = last_slot(session)
    flags = (last.decision.job_flags if last is not None and last.decision is not None else None) or {}
    out: dict[int, str] = {}
    for job_id, entries in flags.items():
        for f in entries or []:
            if isinstance(f, str) and f.startswith("pending: "):
                out[int(job_id)] = f[len("pending: "):]
    return out


def count_slots(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(Slot)))


def count_decisions(session: Session, source: DecisionSource | str) -> int:
    """How many slots were decided by `source` (the policy, or the fallback heuristic)."""
    return int(session.scalar(select(func.count()).select_from(Decision)
                              .where(Decision.source == DecisionSource(source))))


def allocation_counts(session: Session, job_ids: Sequence[int]) -> dict[int, int]:
    """Per job, the slots it has an allocation row in (how long it has been in the system); jobs without
    any are absent."""
    if not job_ids:
        return {}
    q = (select(Allocation.job_id, func.count()).where(Allocation.job_id.in_(job_ids))
         .group_by(Allocation.job_id))
    return dict(session.execute(q).all())


def job_allocation_history(session: Session, job_id: int) -> list[Row[tuple[int, datetime, int, int, int, int]]]:
    """A job's allocation in every slot it was in, in slot order: (slot number, slot start, prev_workers,
    prev_ps, workers, ps), what `dl2ctl show` derives the resizes from."""
    q = (select(Slot.number, Slot.started_at, Allocation.prev_workers, Allocation.prev_ps, Allocation.workers,
                Allocation.ps)
         .join(Slot, Allocation.slot_id == Slot.id).where(Allocation.job_id == job_id).order_by(Slot.number))
    return list(session.execute(q).all())


def last_size_changes(session: Session, job_ids: Sequence[int]) -> dict[int, int]:
    """The slot number of each job's last size change (its allocation differed from the slot before), for the
    jobs that had one: what the daemon's resize hysteresis counts from after a restart."""
    if not job_ids:
        return {}
    changed = (Allocation.workers != Allocation.prev_workers) | (Allocation.ps != Allocation.prev_ps)
    q = (select(Allocation.job_id, func.max(Slot.number)).join(Slot, Allocation.slot_id == Slot.id)
         .where(Allocation.job_id.in_(list(job_ids)), changed).group_by(Allocation.job_id))
    return {int(j): int(n) for j, n in session.execute(q).all()}
