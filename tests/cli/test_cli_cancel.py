"""`dl2ctl cancel JOB...`: owner, other users, admins, finished jobs, the cancel intent."""
from __future__ import annotations

import json

from sqlalchemy import select

from dl2d.db.engine import session_scope
from dl2d.db.models import Event, EventKind, Intent, IntentKind, Job, JobState


def state_and_events(engine, jid):
    with session_scope(engine) as s:
        job = s.get(Job, jid)
        evs = [(e.kind.value, e.detail) for e in s.scalars(select(Event).where(Event.job_id == jid).order_by(Event.id))]
        return job.state.value, job.finished_at is not None, evs


def test_owner_cancels_then_second_cancel_is_refused(dl2ctl, seed, engine):
    jid = seed("alice")
    r = dl2ctl("cancel", str(jid))
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"Cancelled job {jid} (resnet-a)"
    state, finished, evs = state_and_events(engine, jid)
    assert state == "CANCELLED" and finished
    assert evs[-1] == ("cancel", {"requester": "alice"})

    r = dl2ctl("cancel", str(jid))
    assert r.exit_code == 1
    assert r.output.strip() == (f"Error: cannot cancel job {jid}: job {jid} is already CANCELLED; "
                                "only pending or running jobs can be cancelled")
    assert len(state_and_events(engine, jid)[2]) == len(evs)  # nothing recorded the second time


def test_other_user_is_refused(dl2ctl, seed, engine, as_user):
    jid = seed("bob", state=JobState.RUNNING)
    r = dl2ctl("cancel", str(jid))
    assert r.exit_code == 1
    assert (f"cannot cancel job {jid}: user 'alice' may not cancel job {jid}: it belongs to 'bob' "
            "(only the owner or root can cancel it)") in r.output
    state, finished, evs = state_and_events(engine, jid)
    assert state == "RUNNING" and not finished and [k for k, _ in evs] == ["submit"]


def test_finished_job_is_refused(dl2ctl, seed, engine):
    jid = seed("alice", state=JobState.COMPLETED)
    r = dl2ctl("cancel", str(jid))
    assert r.exit_code == 1
    assert f"job {jid} is already COMPLETED; only pending or running jobs can be cancelled" in r.output
    assert state_and_events(engine, jid)[0] == "COMPLETED"


def test_admin_and_root_cancel_any_job(dl2ctl, seed, engine, as_user):
    j1, j2 = seed("bob"), seed("bob")
    as_user("carol", admin=True)
    r = dl2ctl("cancel", str(j1))
    assert r.exit_code == 0, r.output
    assert state_and_events(engine, j1)[2][-1] == ("cancel", {"requester": "carol", "as": "admin"})
    as_user("root")
    r = dl2ctl("cancel", str(j2))
    assert r.exit_code == 0, r.output
    assert state_and_events(engine, j2)[2][-1] == ("cancel", {"requester": "root"})


def test_running_slurm_job_gets_a_cancel_intent(dl2ctl, seed, engine):
    jid = seed("alice", state=JobState.RUNNING)
    with session_scope(engine) as s:
        s.get(Job, jid).slurm_job_id = "4242"
    assert dl2ctl("cancel", str(jid)).exit_code == 0
    with session_scope(engine) as s:
        [intent] = s.scalars(select(Intent).where(Intent.job_id == jid))
        assert intent.kind == IntentKind.CANCEL and intent.target == {"slurm_job_id": "4242"}
        assert intent.state.value == "PLANNED"


def test_several_jobs_each_on_its_own(dl2ctl, seed, engine):
    mine, theirs = seed("alice"), seed("bob")
    r = dl2ctl("cancel", str(mine), str(theirs), "404", "--json")
    assert r.exit_code == 1
    res = json.loads(r.stdout)
    assert [(x["id"], x["cancelled"]) for x in res] == [(mine, True), (theirs, False), (404, False)]
    assert "belongs to 'bob'" in res[1]["error"] and res[2]["error"] == "no job with id 404"
    assert state_and_events(engine, mine)[0] == "CANCELLED"  # the refusals did not undo it
    assert state_and_events(engine, theirs)[0] == "PENDING"
    with session_scope(engine) as s:
        assert s.scalar(select(Event).where(Event.kind == EventKind.CANCEL, Event.job_id == theirs)) is None


def test_cancel_needs_a_job(dl2ctl):
    r = dl2ctl("cancel")
    assert r.exit_code == 2 and "Missing argument 'JOB...'" in r.output
