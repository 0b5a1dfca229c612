"""The event log: what happened to a job or a node, appended, never updated.

Functions take a Session and never commit: the caller's transaction decides whether an event is kept with
the change it records (a `finish` event dies with the reconcile that would have marked the job finished).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from dl2d.db.models import Event, EventKind, Job, row_id, utcnow

#: The events of a job's size changing: the backend's start, in-place resize, hot scale or relaunch.
SIZE_EVENT_KINDS: tuple[EventKind, ...] = (EventKind.START, EventKind.RESIZE, EventKind.HOT_SCALE,
                                           EventKind.RELAUNCH)


def record_event(session: Session, kind: EventKind | str, job: Job | int | None = None,
                 detail: Mapping[str, Any] | None = None, ts: datetime | None = None) -> Event:
    ev = Event(job_id=row_id(job), kind=EventKind(kind), detail=dict(detail) if detail else None,
               ts=ts or utcnow())
    session.add(ev)
    return ev


def record_events(session: Session, events: Iterable[tuple[EventKind | str, Job | int | None,
                                                           Mapping[str, Any] | None, datetime | None]]) -> int:
    """Insert many (kind, job, detail, ts) events in one executemany; returns how many."""
    rows = [{"job_id": row_id(job), "kind": EventKind(kind), "detail": dict(detail) if detail else None,
             "ts": ts or utcnow()} for kind, job, detail, ts in events]
    if rows:
        session.execute(insert(Event), rows)
    return len(rows)


def job_events(session: Session, job_id: int) -> list[Event]:
    """A job's events in time order (ties: in the order they were written): `dl2ctl show`'s timeline."""
    return list(session.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.ts, Event.id)))


def count_events(session: Session, kinds: Sequence[EventKind | str]) -> int:
    """How many events of these kinds the log holds (all jobs and nodes)."""
    return int(session.scalar(select(func.count()).select_from(Event)
                              .where(Event.kind.in_([EventKind(k) for k in kinds]))))


def last_event(session: Session, kind: EventKind | str) -> Event | None:
    """The latest event of a kind (ties: the last written)."""
    return session.scalars(select(Event).where(Event.kind == EventKind(kind))
                           .order_by(Event.ts.desc(), Event.id.desc()).limit(1)).first()
