"""The intent journal: every action for the backend, written (PLANNED) before it is issued.

docs/database.md has the protocol: plan (committed before anything is sent), issue, done or failed; a
restarting daemon replays what is still PLANNED or ISSUED. Functions take a Session and never commit: the
caller's commits are the journal's crash-safety boundaries.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dl2d.db.digest import canonical_json, state_digest
from dl2d.db.errors import InvalidTransition
from dl2d.db.models import Intent, IntentKind, IntentState, Job, Slot, row_id, utcnow

#: What a restarting daemon must replay or reconcile.
PENDING_STATES: tuple[IntentState, ...] = (IntentState.PLANNED, IntentState.ISSUED)

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
    slot_id, job_id, kind = row_id(slot), row_id(job), IntentKind(kind)
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
    slot_id = row_id(slot)
    rows = []
    for job, kind, target in items:
        kind = IntentKind(kind)
        target = json.loads(canonical_json(target))
        rows.append((row_id(job), kind, target, idempotency_key(slot_id, row_id(job), kind, target)))
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
    q = select(Intent).where(Intent.state.in_(PENDING_STATES)).order_by(Intent.id)
    return list(session.scalars(q))


def intents_by_id(session: Session, intent_ids: Sequence[int]) -> dict[int, Intent]:
    """The intents with these ids, by id (ids without an intent are absent)."""
    return {it.id: it for it in session.scalars(select(Intent).where(Intent.id.in_(intent_ids)))}


def count_pending_intents(session: Session) -> int:
    """How many intents are PLANNED or ISSUED (`dl2ctl daemon status`: work a crash left behind)."""
    return int(session.scalar(select(func.count()).select_from(Intent).where(Intent.state.in_(PENDING_STATES))))
