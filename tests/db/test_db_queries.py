"""The read queries of dl2d.db that the daemon and dl2ctl call instead of writing their own SQL: which rows,
in which order, on SQLite and PostgreSQL."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import inspect
from testkit.db import submission

from dl2d.db.engine import session_scope
from dl2d.db.errors import PermissionDenied
from dl2d.db.events import SIZE_EVENT_KINDS, count_events, job_events, record_event
from dl2d.db.intents import (
    count_pending_intents,
    intents_by_id,
    mark_done,
    mark_failed,
    mark_issued,
    plan_intents,
)
from dl2d.db.jobs import (
    active_job_ids,
    active_jobs,
    cancel_job,
    count_active_jobs,
    count_jobs_by_state,
    get_job,
    job_names_with_prefix,
    job_specs,
    jobs_by_id,
    jobs_with_name_prefix,
    list_jobs,
    submit_job,
)
from dl2d.db.models import (
    ACTIVE_STATES,
    DecisionSource,
    EventKind,
    IntentState,
    JobState,
)
from dl2d.db.slots import (
    AllocationRecord,
    DecisionRecord,
    allocation_counts,
    count_decisions,
    count_slots,
    finish_slot,
    job_allocation_history,
    last_slot,
    next_slot_number,
    open_slot_ids,
    record_slot,
)

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc)
M20 = timedelta(minutes=20)
STATES = [JobState.PENDING, JobState.RUNNING, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED]


def _jobs(engine, states=STATES, **fields) -> list[int]:
    """One job per state, owned alternately by bob and alice (bob first), submitted a minute apart."""
    with session_scope(engine) as s:
        ids = []
        for i, st in enumerate(states):
            job = submit_job(s, submission(name=f"j{i}", owner="alice" if i % 2 else "bob", **fields),
                             now=T0 + timedelta(minutes=i))
            job.state = st
            ids.append(job.id)
        return ids


def test_active_states_are_the_non_terminal_ones():
    assert ACTIVE_STATES == (JobState.PENDING, JobState.RUNNING)
    assert all(not s.terminal for s in ACTIVE_STATES) and {s for s in JobState if not s.terminal} == set(ACTIVE_STATES)


def test_job_queries_by_state_and_owner(engine):
    ids = _jobs(engine)
    with session_scope(engine) as s:
        assert [j.id for j in active_jobs(s)] == ids[:2] == active_job_ids(s)
        assert count_active_jobs(s) == 2
        assert count_jobs_by_state(s) == dict.fromkeys(STATES, 1)
        assert [j.id for j in list_jobs(s)] == ids
        assert [j.id for j in list_jobs(s, [JobState.FAILED, JobState.RUNNING])] == [ids[1], ids[3]]
        assert [j.id for j in list_jobs(s, owners=["bob"])] == [ids[0], ids[2], ids[4]]
        assert [j.id for j in list_jobs(s, ACTIVE_STATES, ["alice"])] == [ids[1]]
        assert list_jobs(s, [JobState.PENDING], ["alice"]) == []
    with session_scope(engine) as s:
        get_job(s, ids[0]).state = JobState.COMPLETED
    with session_scope(engine) as s:
        assert active_job_ids(s) == [ids[1]] and count_active_jobs(s) == 1
        assert count_jobs_by_state(s) == {JobState.RUNNING: 1, JobState.COMPLETED: 2, JobState.FAILED: 1,
                                          JobState.CANCELLED: 1}  # no PENDING key: no such job


def test_spec_is_left_out_only_when_asked(engine):
    ids = _jobs(engine, [JobState.PENDING, JobState.RUNNING])
    with session_scope(engine) as s:
        lean = active_jobs(s, spec=False)
        assert [j.id for j in lean] == ids and all("spec" in inspect(j).unloaded for j in lean)
    with session_scope(engine) as s:
        lean = jobs_by_id(s, ids, spec=False)
        assert sorted(lean) == ids and all("spec" in inspect(j).unloaded for j in lean.values())
    with session_scope(engine) as s:
        assert all("spec" not in inspect(j).unloaded for j in active_jobs(s))
    with session_scope(engine) as s:
        full = jobs_by_id(s, [ids[1], ids[1], 10_000])  # duplicates and unknown ids are fine
        assert list(full) == [ids[1]] and "spec" not in inspect(full[ids[1]]).unloaded


def test_job_specs_in_chunks(engine):
    ids = _jobs(engine, [JobState.PENDING] * 3, max_workers=3, max_ps=2)
    with session_scope(engine) as s:
        wanted = [*range(10_000, 11_200), *ids]  # three chunks of ids, the real ones in the last
        specs = job_specs(s, wanted)
        assert sorted(specs) == ids
        assert all((sp["max_workers"], sp["max_ps"], sp["command"]) == (3, 2, "python train.py --model resnet50")
                   for sp in specs.values())
        assert job_specs(s, []) == {}


def test_name_prefix_is_literal(engine):
    with session_scope(engine) as s:
        for name in ("demo-0001", "demo_1", "demoX1", "xdemo-1", "demo-0002"):
            submit_job(s, submission(name=name), now=T0)
    with session_scope(engine) as s:
        assert job_names_with_prefix(s, "demo-") == {"demo-0001", "demo-0002"}
        assert job_names_with_prefix(s, "demo_") == {"demo_1"}  # `_` is not LIKE's any-character here
        assert [j.name for j in jobs_with_name_prefix(s, "demo-")] == ["demo-0001", "demo-0002"]
        assert jobs_with_name_prefix(s, "nope") == []


def test_cancel_by_admin_is_recorded_as_such(engine):
    (jid,) = _jobs(engine, [JobState.RUNNING])  # bob's
    with pytest.raises(PermissionDenied), session_scope(engine) as s:
        cancel_job(s, jid, "carol")
    with session_scope(engine) as s:
        cancel_job(s, jid, "carol", admin=True, now=T0 + M20)
    with session_scope(engine) as s:
        assert get_job(s, jid).state == JobState.CANCELLED
        assert [(e.kind, e.detail) for e in job_events(s, jid)] == [
            (EventKind.SUBMIT, {"name": "j0", "job_type": "resnet-50"}),
            (EventKind.CANCEL, {"requester": "carol", "as": "admin"})]


def test_slot_queries(engine):
    a, b = _jobs(engine, [JobState.RUNNING, JobState.RUNNING])
    with session_scope(engine) as s:
        assert (next_slot_number(s), last_slot(s), count_slots(s), open_slot_ids(s)) == (0, None, 0, [])
        assert count_decisions(s, DecisionSource.FALLBACK) == 0 and allocation_counts(s, [a, b]) == {}
    with session_scope(engine) as s:  # written out of number order: the queries order by number
        s2 = record_slot(s, 2, T0 + 2 * M20, [AllocationRecord(a, 2, 1, 2, 1)],
                         DecisionRecord("c" * 64, [], source="fallback", fallback_reason="x"))
        s0 = record_slot(s, 0, T0, [AllocationRecord(a, 1, 1)], DecisionRecord("a" * 64, []))
        s1 = record_slot(s, 1, T0 + M20, [AllocationRecord(a, 2, 1, 1, 1), AllocationRecord(b, 1, 1)],
                         DecisionRecord("b" * 64, [], source=DecisionSource.FALLBACK))
        finish_slot(s, s0, T0 + M20, 0.5)
        ids = (s0.id, s1.id, s2.id)
    with session_scope(engine) as s:
        assert next_slot_number(s) == 3 and count_slots(s) == 3
        assert open_slot_ids(s) == [ids[1], ids[2]]
        assert (last_slot(s).id, last_slot(s).decision.fallback_reason) == (ids[2], "x")
        assert count_decisions(s, "fallback") == 2 and count_decisions(s, DecisionSource.POLICY) == 1
        assert allocation_counts(s, [a, b, 10_000]) == {a: 3, b: 1}
        assert allocation_counts(s, []) == {}
        assert [tuple(r) for r in job_allocation_history(s, a)] == [
            (0, T0, 0, 0, 1, 1), (1, T0 + M20, 1, 1, 2, 1), (2, T0 + 2 * M20, 2, 1, 2, 1)]
        assert [tuple(r) for r in job_allocation_history(s, b)] == [(1, T0 + M20, 0, 0, 1, 1)]
        assert job_allocation_history(s, 10_000) == []


def test_intent_queries(engine):
    jobs = _jobs(engine, [JobState.RUNNING] * 4)
    with session_scope(engine) as s:
        its = [it.id for it in plan_intents(s, None, [(j, "resize", {"workers": 2, "ps": 1}) for j in jobs])]
    with session_scope(engine) as s:
        assert count_pending_intents(s) == 4
        mark_issued(s, its[0])
        mark_done(s, its[0])
        mark_failed(s, its[1], "no")
        mark_issued(s, its[2])  # ISSUED is still pending: it may or may not have reached the backend
    with session_scope(engine) as s:
        assert count_pending_intents(s) == 2
        got = intents_by_id(s, [its[2], its[0], 10_000])
        assert sorted(got) == sorted([its[0], its[2]])
        assert (got[its[0]].state, got[its[2]].state, got[its[2]].job_id) == (IntentState.DONE, IntentState.ISSUED,
                                                                               jobs[2])
        assert intents_by_id(s, []) == {}


def test_event_queries(engine):
    a, b = _jobs(engine, [JobState.RUNNING, JobState.RUNNING])
    with session_scope(engine) as s:
        record_event(s, EventKind.RESIZE, a, {"n": 2}, ts=T0 + 2 * M20)
        record_event(s, EventKind.START, a, {"n": 1}, ts=T0 + M20)
        record_event(s, EventKind.HOT_SCALE, a, {"n": 3}, ts=T0 + 2 * M20)  # same time: written order
        record_event(s, EventKind.RELAUNCH, b, None, ts=T0 + M20)
        record_event(s, EventKind.FINISH, a, None, ts=T0 + 3 * M20)
        record_event(s, EventKind.NODE_STALE, None, {"node": "n1"}, ts=T0)
    with session_scope(engine) as s:
        assert [(e.kind, e.detail) for e in job_events(s, a)] == [
            (EventKind.SUBMIT, {"name": "j0", "job_type": "resnet-50"}), (EventKind.START, {"n": 1}),
            (EventKind.RESIZE, {"n": 2}), (EventKind.HOT_SCALE, {"n": 3}), (EventKind.FINISH, None)]
        assert count_events(s, SIZE_EVENT_KINDS) == 4
        assert count_events(s, ["submit"]) == 2 and count_events(s, [EventKind.FAIL]) == 0
