"""The bulk journal and row functions the daemon's tick uses: plan_intents, transition_intents,
record_events, and record_slot's bulk allocation rows (SQLite and PostgreSQL)."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select

from dl2d.db.engine import session_scope
from dl2d.db.errors import InvalidTransition
from dl2d.db.events import record_events
from dl2d.db.intents import plan_intent, plan_intents, transition_intents
from dl2d.db.jobs import submit_job
from dl2d.db.models import Event, EventKind, Intent, IntentKind, IntentState
from dl2d.db.slots import AllocationRecord, record_slot

T0 = datetime(2024, 5, 1, 8, tzinfo=timezone.utc)


def _jobs(engine, n):
    with session_scope(engine) as s:
        return [submit_job(s, {"name": f"j{i}", "owner": "alice", "job_type": "resnet-50", "total_epochs": 10,
                               "command": "x", "worker": {"gpus": 1, "cpus": 2, "mem_gb": 4},
                               "ps": {"cpus": 1, "mem_gb": 2}}, now=T0).id for i in range(n)]


def test_plan_intents_in_order_and_idempotent_with_plan_intent(engine):
    jobs = _jobs(engine, 3)
    with session_scope(engine) as s:
        slot_id = record_slot(s, 1, T0).id
        first = plan_intent(s, slot_id, jobs[1], "resize", {"workers": 2, "ps": 1})
        items = [(jobs[0], IntentKind.SUBMIT, {"workers": 1, "ps": 1}), (jobs[1], "resize", {"ps": 1, "workers": 2}),
                 (jobs[2], "submit", {"workers": 3, "ps": 2})]
        got = plan_intents(s, slot_id, items)
        assert [i.job_id for i in got] == jobs and got[1].id == first.id  # same key: the existing row
        assert all(i.state is IntentState.PLANNED and i.id is not None for i in got)
        ids = [i.id for i in got]
    with session_scope(engine) as s:  # re-planning after a "crash" adds nothing
        assert [i.id for i in plan_intents(s, slot_id, items)] == ids
        assert s.scalar(select(func.count()).select_from(Intent)) == 3


def test_transition_intents_all_or_nothing(engine):
    jobs = _jobs(engine, 3)
    with session_scope(engine) as s:
        ids = [i.id for i in plan_intents(s, None, [(j, "submit", {"workers": 1, "ps": 1}) for j in jobs])]
    with session_scope(engine) as s:
        assert transition_intents(s, ids, IntentState.ISSUED) == 3
        assert transition_intents(s, ids, IntentState.ISSUED) == 0  # replaying a recorded step is a no-op
        assert transition_intents(s, ids[:1], IntentState.DONE) == 1
    with pytest.raises(InvalidTransition):  # DONE -> FAILED is not allowed: nothing of the batch changes
        with session_scope(engine) as s:
            transition_intents(s, ids, IntentState.FAILED, "boom")
    with pytest.raises(InvalidTransition):
        with session_scope(engine) as s:
            transition_intents(s, [ids[1], 10_000], IntentState.DONE)
    with session_scope(engine) as s:
        states = dict(s.execute(select(Intent.id, Intent.state)).all())
        assert [states[i] for i in ids] == [IntentState.DONE, IntentState.ISSUED, IntentState.ISSUED]
        transition_intents(s, ids[1:], IntentState.FAILED, "backend said no")
    with session_scope(engine) as s:
        rows = s.execute(select(Intent.state, Intent.error).where(Intent.id.in_(ids[1:]))).all()
        assert rows == [(IntentState.FAILED, "backend said no")] * 2


def test_record_events_and_bulk_allocations(engine):
    jobs = _jobs(engine, 2)
    with session_scope(engine) as s:
        n = record_events(s, [(EventKind.START, jobs[0], {"workers": 1}, T0), ("hot_scale", jobs[1], None, T0)])
        slot = record_slot(s, 4, T0, [AllocationRecord(jobs[0], 2, 1, 1, 1), AllocationRecord(jobs[1], 0, 0)])
        assert n == 2
        assert sorted((a.job_id, a.workers, a.ps, a.prev_workers) for a in slot.allocations) == \
            [(jobs[0], 2, 1, 1), (jobs[1], 0, 0, 0)]
    with session_scope(engine) as s:
        evs = s.execute(select(Event.job_id, Event.kind, Event.detail).where(Event.kind != EventKind.SUBMIT)
                        .order_by(Event.id)).all()
        assert evs == [(jobs[0], EventKind.START, {"workers": 1}), (jobs[1], EventKind.HOT_SCALE, None)]
