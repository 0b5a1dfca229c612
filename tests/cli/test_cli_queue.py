"""`dl2ctl queue`: default active jobs, filters, JSON and the table."""
from __future__ import annotations

import json

from dl2d.db.engine import session_scope
from dl2d.db.models import Job, JobState


def test_queue_filters_and_json(dl2ctl, seed, engine):
    a = seed("alice")
    b = seed("bob", state=JobState.RUNNING, job_type="vgg-16")
    c = seed("alice", state=JobState.COMPLETED)
    d = seed("carol", state=JobState.CANCELLED)

    def ids(*args):
        r = dl2ctl("queue", "--json", *args)
        assert r.exit_code == 0, r.output
        return [j["id"] for j in json.loads(r.output)]

    assert ids() == [a, b]  # finished jobs hidden by default
    assert ids("--all") == [a, b, c, d]
    assert ids("--state", "running") == [b]
    assert ids("--state", "COMPLETED,cancelled") == [c, d]
    assert ids("-s", "pending", "-s", "completed") == [a, c]
    assert ids("--state", "active") == [a, b]
    assert ids("--user", "alice") == [a]
    assert ids("--user", "alice", "--all") == [a, c]
    assert ids("-u", "alice,carol", "--all") == [a, c, d]
    assert ids("--me", "--all") == [a, c]  # the caller is alice (conftest)
    assert ids("--user", "nobody") == []

    [job] = json.loads(dl2ctl("queue", "--json", "--state", "running").output)
    assert set(job) == {"id", "name", "owner", "job_type", "state", "workers", "ps", "epochs_done", "lost_epochs",
                        "total_epochs", "slurm_job_id", "submitted_at", "started_at", "finished_at", "age_s", "reason"}
    assert job["reason"] is None  # only a pending job has one
    assert (job["owner"], job["job_type"], job["state"], job["total_epochs"]) == ("bob", "vgg-16", "RUNNING", 30.0)
    assert 0 <= job["age_s"] < 60


def test_queue_table_shows_allocation_and_progress(dl2ctl, seed, engine):
    jid = seed("bob", name="wide-job", state=JobState.RUNNING)
    with session_scope(engine) as s:
        job = s.get(Job, jid)
        job.workers, job.ps, job.epochs_done, job.slurm_job_id = 3, 2, 12.5, "4711"
    r = dl2ctl("queue")
    assert r.exit_code == 0, r.output
    header, row = r.output.splitlines()[:2]
    assert header.split() == ["ID", "NAME", "OWNER", "TYPE", "ST", "WORKERS", "PS", "EPOCHS", "AGE", "SLURM", "REASON"]
    fields = row.split()
    assert fields[:8] == [str(jid), "wide-job", "bob", "resnet-50", "R", "3", "2", "12.5/30"]
    assert fields[8].endswith("s") and fields[9] == "4711"


def test_queue_empty_and_bad_state(dl2ctl, db_url, tmp_path):
    r = dl2ctl("queue")
    assert r.exit_code == 0 and "no jobs (active; --all includes finished jobs)" in r.output
    assert (tmp_path / "dl2d.sqlite").exists()  # a new database is created with its schema
    r = dl2ctl("queue", "--state", "runing")
    assert r.exit_code == 2
    assert ("unknown state 'runing'; known: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED (or PD, R, CD, F, CA), "
            "active") in r.output


def test_schema_older_than_dl2ctl_is_a_clear_error(dl2ctl, engine):
    from sqlalchemy import text

    with engine.begin() as conn:  # as if an old daemon's schema lacked a column dl2ctl reads
        conn.execute(text("ALTER TABLE jobs DROP COLUMN slurm_job_id"))
    r = dl2ctl("queue")
    assert r.exit_code == 1
    assert "database error on sqlite:///" in r.output and "no such column: jobs.slurm_job_id" in r.output
    assert "start the daemon, which migrates it" in r.output


def test_slurm_state_codes_format_noheader_and_pending_reasons(dl2ctl, seed, engine):
    """What admins expect from squeue: -s PD,R, --noheader, --format, a REASON for every pending job, and long
    names neither cut nor wrapped in a pipe (no terminal: 80 columns is what rich would assume)."""
    from datetime import datetime, timezone

    from dl2d.db.slots import DecisionRecord, record_slot

    a = seed("alice", name="a-rather-long-name-squeue-would-cut-at-eight-chars")
    b = seed("bob", state=JobState.RUNNING)
    c = seed("carol")
    d = seed("carol", state=JobState.COMPLETED)
    with session_scope(engine) as s:  # the daemon's last slot: a waits for room, c behind others
        record_slot(s, 1, datetime.now(timezone.utc), decision=DecisionRecord(
            "x", [], job_flags={str(a): ["pending: Resources: no node has a worker's 4 GPU, 8 CPU, 32 GB free (2 "
                                         "GPUs free in all)"], str(b): ["slow"]}))
    r = dl2ctl("queue", "-s", "PD,r")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert [ln.split()[0] for ln in lines[1:]] == [str(a), str(b), str(c)]
    assert lines[1].split()[4] == "PD" and lines[1].split()[-1] == "Resources"
    assert "a-rather-long-name-squeue-would-cut-at-eight-chars" in lines[1]
    assert lines[2].split()[4] == "R" and lines[3].split()[-1] == "Submitted"
    r = dl2ctl("queue", "--noheader", "--format", "ID,st,reason_full", "--all")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        f"{a}  PD  Resources: no node has a worker's 4 GPU, 8 CPU, 32 GB free (2 GPUs free in all)",
        f"{b}  R",
        f"{c}  PD  Submitted: no slot has decided on it yet (the daemon's next slot will)",
        f"{d}  CD"]
    r = dl2ctl("queue", "--format", "id,nodes")
    assert r.exit_code == 2 and "unknown column(s) 'nodes'; known: id, name" in r.output
    r = dl2ctl("show", str(a))
    assert r.exit_code == 0 and "PENDING (Resources: no node has a worker's 4 GPU" in r.output, r.output
    assert dl2ctl("queue", "-H", "-s", "F").output == ""
