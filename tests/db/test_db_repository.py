from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy.exc import IntegrityError
from testkit.db import count, submission

from dl2d.db.digest import state_digest
from dl2d.db.engine import session_scope
from dl2d.db.errors import (
    InvalidTransition,
    JobNotFound,
    PermissionDenied,
    SubmissionError,
)
from dl2d.db.events import record_event
from dl2d.db.intents import (
    idempotency_key,
    mark_done,
    mark_failed,
    mark_issued,
    pending_intents,
    plan_intent,
)
from dl2d.db.jobs import cancel_job, submit_job, validate_submission
from dl2d.db.models import (
    Allocation,
    Decision,
    Event,
    EventKind,
    Intent,
    IntentKind,
    IntentState,
    Job,
    JobState,
    Slot,
)
from dl2d.db.slots import AllocationRecord, DecisionRecord, finish_slot, record_slot

T0 = datetime(2024, 5, 1, 8, 0, tzinfo=timezone.utc)

# (submission, part of the expected message)
MALFORMED = [
    (submission(job_type="gpt-17"), "unknown job type 'gpt-17'"),
    (submission(total_epochs=0), "total_epochs must be > 0"),
    (submission(total_epochs=-3), "total_epochs must be > 0"),
    (submission(total_epochs="ten"), "total_epochs must be a number"),
    (submission(total_epochs=float("nan")), "total_epochs must be a number"),
    (submission(worker={"gpus": -1, "cpus": 2, "mem_gb": 8}), "worker.gpus must be >= 0"),
    (submission(worker={"gpus": 1, "cpus": 2, "mem_gb": 10**7}), "worker.mem_gb must be > 0 and <= 4096"),
    (submission(worker={"gpus": 1000, "cpus": 2, "mem_gb": 8}), "worker.gpus must be >= 0 and <= 16"),
    (submission(ps={"gpus": 1, "cpus": 2, "mem_gb": 4}), "ps.gpus must be >= 0 and <= 0"),
    (submission(ps={"cpus": 0, "mem_gb": 4}), "ps.cpus must be > 0"),
    (submission(worker="lots"), "worker must be a mapping"),
    (submission(command=...), "missing script"),
    (submission(command="   "), "missing script"),
    (submission(name="bad name; rm -rf /"), "name must be"),
    (submission(name=""), "name must be"),
    (submission(owner="Not A User"), "owner must be a unix user name"),
    (submission(max_workers=0), "max_workers must be >= 1"),
    (submission(max_ps=2.5), "max_ps must be an integer"),
    (submission(sync="sometimes"), "sync must be one of"),
    (submission(epochs=3), "unknown keys ['epochs']"),
    (submission(max_workers=True), "max_workers must be an integer"),
    ([1, 2, 3], "a submission must be a mapping"),
    (submission(account="a,b"), "account must be a name of 1-64"),
    (submission(qos=""), "qos must be a name of 1-64"),
    (submission(partition=["gpu"]), "partition must be names of 1-64"),
    (submission(env="A=1"), "env must be a table of NAME = \"value\""),
    (submission(env={"DL2D_DB_URL": "x"}), "env.DL2D_DB_URL: names starting with DL2D_, SLURM_, SBATCH_"),
    (submission(env={"A": 1}), 'env.A must be a string (quote it: A = "1"), got 1'),
    (submission(env={"A B": "1"}), "env: 'A B' is not a variable name"),
    (submission(env={"X" * 129: "1"}), "is not a variable name (letters, digits and '_', not starting with a digit, "
                                       "at most 128 characters)"),
    (submission(env={"A": "a\x00b"}), "env.A must not contain NUL characters"),
    (submission(env={f"V{i}": "1" for i in range(65)}), "env may declare at most 64 variables, got 65"),
    (submission(env={"BIG": "x" * 40_000}), "env holds 40003 characters; at most 32768"),
]


def test_validate_accepts_valid_submission():
    sub = validate_submission(submission(script="run.sh", command=..., time_limit_min=600, sync="async"))
    assert sub.command == "run.sh" and sub.worker.gpus == 1.0 and sub.ps.gpus == 0.0
    assert sub.spec()["max_workers"] == 8 and sub.spec()["time_limit_min"] == 600


@pytest.mark.parametrize("data,message", MALFORMED, ids=[m for _, m in MALFORMED])
def test_validate_rejects_with_clear_message(data, message):
    with pytest.raises(SubmissionError) as e:
        validate_submission(data)
    assert any(message in err for err in e.value.errors), e.value.errors


def test_validate_keeps_the_slurm_names_and_environment_the_job_declares():
    sub = validate_submission(submission(account="proj-a", qos="high", partition="gpu,cpu",
                                         env={"WANDB_PROJECT": "x", "PATH": "/opt/venv/bin:/usr/bin", "E": ""}))
    spec = sub.spec()
    assert (spec["account"], spec["qos"], spec["partition"]) == ("proj-a", "high", "gpu,cpu")
    assert spec["env"] == {"WANDB_PROJECT": "x", "PATH": "/opt/venv/bin:/usr/bin", "E": ""}
    assert not {"account", "qos", "partition", "env"} & set(validate_submission(submission(env={})).spec())


def test_validate_collects_all_errors_and_custom_types():
    with pytest.raises(SubmissionError) as e:
        validate_submission(submission(total_epochs=-1, job_type="bert", command=...))
    assert len(e.value.errors) == 3
    assert validate_submission(submission(job_type="bert"), known_types=["bert"]).job_type == "bert"


def test_submit_valid_job(engine):
    with session_scope(engine) as s:
        job_id = submit_job(s, submission(), now=T0).id
    with session_scope(engine) as s:
        job = s.get(Job, job_id)
        assert (job.name, job.owner, job.job_type, job.total_epochs) == ("resnet-a", "alice", "resnet-50", 30.0)
        assert job.state is JobState.PENDING and job.workers == 0 and job.epochs_done == 0.0
        assert job.spec["worker"] == {"gpus": 1.0, "cpus": 2.0, "mem_gb": 8.0}
        assert job.submitted_at == T0 and job.submitted_at.tzinfo is not None
        [ev] = s.query(Event).all()
        assert ev.kind is EventKind.SUBMIT and ev.job_id == job_id and ev.ts == T0


def test_malformed_submissions_write_nothing(engine):
    for data, _ in MALFORMED:
        with pytest.raises(SubmissionError), session_scope(engine) as s:
            submit_job(s, data)
    with session_scope(engine) as s:
        assert count(s, Job) == 0 and count(s, Event) == 0


def _job(engine, **changes) -> int:
    with session_scope(engine) as s:
        job = submit_job(s, submission(**changes), now=T0)
        return job.id


def test_intent_idempotency_and_replay(engine):
    job_id = _job(engine)
    with session_scope(engine) as s:
        slot_id = record_slot(s, 1, T0).id
        a = plan_intent(s, slot_id, job_id, "resize", {"workers": 2, "ps": 1, "nodes": ["n1", "n2"]})
        b = plan_intent(s, slot_id, job_id, IntentKind.RESIZE, {"nodes": ["n1", "n2"], "ps": 1, "workers": 2})
        assert a.id == b.id and a.state is IntentState.PLANNED
        other = plan_intent(s, slot_id, job_id, "resize", {"workers": 3, "ps": 1, "nodes": ["n1", "n2"]})
        assert other.id != a.id
        mark_issued(s, a)
        ids = (a.id, other.id)
    # "crash": a new process re-plans the same slot and gets the same rows back, then replays them
    with session_scope(engine) as s:
        again = plan_intent(s, slot_id, job_id, "resize", {"workers": 2, "ps": 1, "nodes": ["n1", "n2"]})
        assert again.id == ids[0] and again.state is IntentState.ISSUED
        assert again.idempotency_key == idempotency_key(slot_id, job_id, "resize", again.target)
        pending = pending_intents(s)
        assert [(i.id, i.state) for i in pending] == [(ids[0], IntentState.ISSUED), (ids[1], IntentState.PLANNED)]
        mark_issued(s, again)  # replaying a recorded step is a no-op
        mark_done(s, again)
        with pytest.raises(InvalidTransition):
            mark_done(s, ids[1])  # PLANNED -> DONE skips ISSUED
        mark_failed(s, ids[1], "sbatch: error: invalid partition")
    with session_scope(engine) as s:
        assert pending_intents(s) == [] and count(s, Intent) == 2
        assert s.get(Intent, ids[1]).error.startswith("sbatch")
        with pytest.raises(InvalidTransition):
            mark_issued(s, ids[0])


def test_cancel_permissions(engine):
    job_id = _job(engine)
    with pytest.raises(PermissionDenied, match="only the owner or root"), session_scope(engine) as s:
        cancel_job(s, job_id, "mallory")
    with pytest.raises(JobNotFound), session_scope(engine) as s:
        cancel_job(s, 999, "root")
    with session_scope(engine) as s:
        assert s.get(Job, job_id).state is JobState.PENDING
        job = cancel_job(s, job_id, "alice")
        assert job.state is JobState.CANCELLED and job.finished_at is not None
        assert count(s, Intent) == 0  # nothing in Slurm yet: nothing to scancel
    with pytest.raises(InvalidTransition, match="already CANCELLED"), session_scope(engine) as s:
        cancel_job(s, job_id, "alice")
    # root may cancel anyone's running job; the scancel is journalled for the daemon
    job2 = _job(engine, owner="bob")
    with session_scope(engine) as s:
        j = s.get(Job, job2)
        j.state, j.slurm_job_id = JobState.RUNNING, "4242"
    with session_scope(engine) as s:
        cancel_job(s, job2, "root")
        [intent] = pending_intents(s)
        assert intent.kind is IntentKind.CANCEL and intent.target == {"slurm_job_id": "4242"}
        assert [e.kind for e in s.query(Event).filter_by(job_id=job2).order_by(Event.id)] == [
            EventKind.SUBMIT, EventKind.CANCEL]


def _decision(**kw) -> DecisionRecord:
    return DecisionRecord(state_digest=state_digest({"jobs": [1]}), actions=[[0, 1], [0, 2]], **kw)


def test_record_slot_and_finish(engine):
    job_id = _job(engine)
    with session_scope(engine) as s:
        slot = record_slot(s, 7, T0, [AllocationRecord(job_id, workers=2, ps=1)],
                           _decision(policy_version=3, latency_ms=12.5), policy_version=3)
        slot_id = slot.id
    with session_scope(engine) as s:
        finish_slot(s, slot_id, T0 + timedelta(minutes=20), reward=0.25)
    with session_scope(engine) as s:
        slot = s.get(Slot, slot_id)
        assert slot.reward == 0.25 and slot.n_jobs == 1 and slot.ended_at == T0 + timedelta(minutes=20)
        assert [(a.job_id, a.workers, a.ps) for a in slot.allocations] == [(job_id, 2, 1)]
        assert slot.decision.actions == [[0, 1], [0, 2]] and len(slot.decision.state_digest) == 64


def test_record_slot_is_atomic(engine):
    job_id = _job(engine)
    with session_scope(engine) as s:
        record_event(s, "resize", job_id)
        # the second allocation names a job that does not exist: the FK fails after the slot was flushed
        with pytest.raises(IntegrityError):
            record_slot(s, 1, T0, [AllocationRecord(job_id, 1, 1), AllocationRecord(12345, 1, 1)], _decision())
        assert count(s, Slot) == 0 and count(s, Allocation) == 0 and count(s, Decision) == 0
        record_slot(s, 1, T0, [AllocationRecord(job_id, 1, 1)], _decision(source="fallback", fallback_reason="x"))
    with session_scope(engine) as s:  # the rest of the caller's transaction survived
        assert count(s, Event) == 2 and count(s, Slot) == 1 and count(s, Allocation) == 1
        with pytest.raises(IntegrityError):
            record_slot(s, 1, T0)  # slot numbers are unique
        assert count(s, Slot) == 1
