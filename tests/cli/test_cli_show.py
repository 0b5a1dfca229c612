"""`dl2ctl show JOB`: job, allocation, events timeline and resizes; unknown ids."""
from __future__ import annotations

import json
from datetime import timedelta

from dl2d.db.engine import session_scope
from dl2d.db.events import record_event
from dl2d.db.models import EventKind, Job, JobState
from dl2d.db.slots import AllocationRecord, record_slot


def _history(engine, jid):
    """Three slots after the submission: start at 2w/1ps, grow to 4w/2ps, stay; with start/resize events.
    Returns the first slot's start."""
    with session_scope(engine) as s:
        job = s.get(Job, jid)
        T0 = job.submitted_at + timedelta(minutes=1)
        job.state, job.workers, job.ps, job.slurm_job_id, job.epochs_done = JobState.RUNNING, 4, 2, "77", 3
        record_slot(s, 1, T0, [AllocationRecord(jid, 2, 1, 0, 0)])
        record_slot(s, 2, T0 + timedelta(minutes=20), [AllocationRecord(jid, 4, 2, 2, 1)])
        record_slot(s, 3, T0 + timedelta(minutes=40), [AllocationRecord(jid, 4, 2, 4, 2)])
        record_event(s, EventKind.START, job, {"slurm_job_id": "77"}, ts=T0)
        record_event(s, EventKind.RESIZE, job, {"workers": 4, "ps": 2}, ts=T0 + timedelta(minutes=20))
    return T0


def test_show_json(dl2ctl, seed, engine):
    jid = seed("bob")
    T0 = _history(engine, jid)
    r = dl2ctl("show", str(jid), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert (d["id"], d["owner"], d["state"], d["workers"], d["ps"], d["slurm_job_id"]) == \
        (jid, "bob", "RUNNING", 4, 2, "77")
    assert d["spec"]["worker"] == {"gpus": 1.0, "cpus": 2.0, "mem_gb": 8.0}
    assert [e["kind"] for e in d["events"]] == ["submit", "start", "resize"]  # in time order
    assert d["events"][2]["detail"] == {"workers": 4, "ps": 2}
    assert d["events"][1]["ts"] == T0.isoformat()
    assert d["resizes"] == [
        {"slot": 1, "at": T0.isoformat(), "workers_from": 0, "workers_to": 2, "ps_from": 0, "ps_to": 1},
        {"slot": 2, "at": (T0 + timedelta(minutes=20)).isoformat(), "workers_from": 2, "workers_to": 4,
         "ps_from": 1, "ps_to": 2},
    ]
    assert "tasks" not in d  # no table holds them (migration 0003)


def test_show_table(dl2ctl, seed, engine):
    jid = seed("bob", name="detail-job", time_limit_min=90)
    _history(engine, jid)
    r = dl2ctl("show", str(jid))
    assert r.exit_code == 0, r.output
    out = r.output
    for text in ["detail-job", "RUNNING", "3/30", "4 workers, 2 PS (max 8 workers, 4 PS)",
                 "1 GPU, 2 CPU, 8 GB", "2 CPU, 4 GB", "python train.py", "90 min", "Events", "slurm_job_id=77",
                 "workers=4 ps=2", "Resizes", "2 -> 4", "1 -> 2"]:
        assert text in out, text
    assert out.index("Events") < out.index("Resizes")


def test_show_new_job_without_history(dl2ctl, seed):
    jid = seed("alice")
    r = dl2ctl("show", str(jid))
    assert r.exit_code == 0, r.output
    assert "PENDING" in r.output and "submit" in r.output and "Resizes: none" in r.output
    assert "Tasks" not in r.output


def test_show_unknown_job(dl2ctl, seed):
    seed("alice")
    r = dl2ctl("show", "99")
    assert r.exit_code == 1
    assert r.output.strip() == "Error: no job with id 99 (dl2ctl queue --all lists the jobs)"
    r = dl2ctl("show", "abc")
    assert r.exit_code == 2 and "'abc' is not a valid integer" in r.output


def test_show_names_the_work_a_job_lost_to_restarts(dl2ctl, seed, engine):
    jid = seed("bob", name="lossy")
    r = dl2ctl("show", str(jid))
    assert r.exit_code == 0 and "lost to restarts" not in r.output  # none lost: no line
    with session_scope(engine) as s:
        s.get(Job, jid).lost_epochs = 0.25
    r = dl2ctl("show", str(jid))
    assert "lost to restarts" in r.output and "0.25 epochs trained again" in r.output, r.output
    assert json.loads(dl2ctl("show", str(jid), "--json").output)["lost_epochs"] == 0.25
