"""What a job writes is input from a stranger (dl2d.daemon.slurm.jobreport), without a real Slurm: every value
the daemon reads from a job's progress and coordinator files is checked before it reaches the database, a date
or a socket; a job whose file is refused fails alone, with the reason, and the slot goes on for the others; a
job that says done while Slurm runs it keeps its GPUs until dl2d has ended its Slurm job; a job whose directory
holds a planted link fails at once instead of being retried every slot. A hypothesis fuzz of every reader of a
job's files. The same attacks on the real local Slurm: tests/slurm/test_hostile_jobs_real.py."""
from __future__ import annotations

import json
import math
import os
import pwd
from datetime import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from dl2d.daemon.backend import FAILED, FINISHED, PENDING, RUNNING, BackendError, JobRequest, Target
from dl2d.daemon.loop import SlotLoop
from dl2d.daemon.slurm.backend import SlurmBackend
from dl2d.daemon.slurm.jobdir import _json_object
from dl2d.daemon.slurm.jobreport import JobReportError, checked_coordinator, checked_progress
from dl2d.daemon.slurm.planning import status_from
from dl2d.daemon.slurm.settings import SlurmBackendConfig
from dl2d.db.engine import make_engine, session_scope, upgrade
from dl2d.db.jobs import submit_job
from dl2d.db.models import Event, EventKind, Job, JobState, utcnow
from dl2d.policy.registry import make_heuristic
from dl2d.slurm.backoff import BackoffPolicy
from dl2d.slurm.driver import SlurmJob
from dl2d.slurm.memory import InMemorySlurm

ME = pwd.getpwuid(os.geteuid()).pw_name
DEMANDS = {"worker": {"gpus": 1, "cpus": 1, "mem_gb": 1}, "ps": {"cpus": 1, "mem_gb": 1}}
T = 1_700_000_000


def backend(tmp_path, fake, **cfg) -> SlurmBackend:
    return SlurmBackend(fake, SlurmBackendConfig(state_dir=tmp_path / "state", checkpoint_timeout_s=1.0,
                                                 poll_interval_s=0.01, run_jobs_as="daemon",
                                                 backoff=BackoffPolicy(base=0.001, cap=0.001, max_attempts=2),
                                                 **cfg))


def write_progress(b: SlurmBackend, job_id: int, text: str) -> None:
    owned = b.job_dir(job_id) / "job"
    owned.mkdir(parents=True, exist_ok=True)
    (owned / "progress.json").write_text(text)


@pytest.mark.parametrize("text, why", [
    ('{"status": "running", "epoch": NaN}', "epoch = nan is not a finite number"),
    ('{"status": "running", "epoch": 1e999}', "epoch = inf is not a finite number"),
    ('{"status": "done", "epoch": 1, "time": 1e18}', "time = 1e+18 is outside"),
    ('{"epoch": -3}', "epoch = -3 is outside"),
    ('{"epoch": 99999999999999999999999999}', "epoch = 1e+26 is outside"),
    ('{"epoch": "7"}', "epoch must be a number, not str"),
    ('{"epoch": true}', "epoch must be a number, not bool"),
    ('{"step": 900, "total_steps": 100, "epochs": 1}', "step = 900 is beyond total_steps = 100"),
    ('{"status": ["done"]}', "status must be a short word"),
    ('{"state": "' + "x" * 200 + '"}', "state must be a short word"),
])
def test_a_refused_value_names_the_field(text, why):
    with pytest.raises(JobReportError, match=why.replace("+", r"\+").replace("[", r"\[")):
        checked_progress(json.loads(text))


def test_the_contracts_reports_pass_as_they_are():
    demo = {"epoch": 3, "epochs": 5, "status": "running", "resumed_from": None, "runs": 1, "time": T + 0.5}
    assert checked_progress(demo) == {"epoch": 3.0, "epochs": 5.0, "status": "running", "time": T + 0.5}
    run = {"step": 120, "total_steps": 400, "epochs": 2.0, "state": "running", "time": T, "lost_steps": 20,
           "samples": 15360, "loss": None}
    assert checked_progress(run)["step"] == 120 and checked_progress(None) is None
    assert checked_coordinator({"address": "10.1.2.3:41234", "pid": 7}) == {"address": "10.1.2.3:41234"}
    assert checked_coordinator({"address": "[::1]:5000"}) == {"address": "[::1]:5000"}
    for bad in ({"address": "10.1.2.3"}, {"address": "a:99999"}, {"address": 5}, {"address": "x:1;rm -rf /"}, {}):
        with pytest.raises(JobReportError, match="address must be host:port"):
            checked_coordinator(bad)


def test_a_nan_epoch_fails_that_job_alone_and_the_slot_goes_on(tmp_path):
    """Through the daemon's loop and a real SQLite database (the NOT NULL constraint that stopped the daemon):
    the job is FAILED with the reason, in its event, and its Slurm job cancelled; the other job runs on; the file
    left behind does not stop the next slots either."""
    engine = make_engine(f"sqlite:///{tmp_path / 'dl2d.sqlite'}")
    upgrade(engine)
    fake = InMemorySlurm()
    b = backend(tmp_path, fake)
    with session_scope(engine) as s:
        bad, good = (submit_job(s, {"name": name, "owner": ME, "job_type": "resnet-50", "total_epochs": 5,
                                    "command": "python train.py", **DEMANDS}).id for name in ("bad", "good"))
    loop = SlotLoop(engine, b, None, make_heuristic("drf"), slot_seconds=1, pace=False)
    loop.run(max_slots=1)
    fake.run()
    write_progress(b, bad, '{"status": "running", "epoch": NaN}')
    write_progress(b, good, json.dumps({"status": "running", "epoch": 1.5}))
    for _ in range(3):
        assert loop.run(max_slots=1) == 1
        fake.run()  # Slurm starts what the slot submitted
    with session_scope(engine) as s:
        loop.reconcile(s, b.observe(), utcnow())
    with session_scope(engine) as s:
        jobs = {j.id: j for j in s.scalars(select(Job))}
        assert jobs[bad].state == JobState.FAILED and jobs[good].state == JobState.RUNNING
        assert jobs[good].epochs_done == 1.5 and jobs[bad].epochs_done == 0.0
        fail = s.scalars(select(Event).where(Event.job_id == bad, Event.kind == EventKind.FAIL)).one()
        assert fail.detail["message"] == "its progress file is refused: epoch = nan is not a finite number"
    slurm_id = b._record(bad)["slurm_job_id"]
    assert ("cancel", slurm_id) in fake.calls and not fake.slurm_jobs[slurm_id].active


def test_a_job_that_says_done_but_runs_on_is_ended_after_the_grace(tmp_path):
    fake = InMemorySlurm()
    now = [float(T)]
    fake.clock = lambda: now[0]
    b = backend(tmp_path, fake, done_grace_s=30)
    b.apply(JobRequest(1, "resnet-50", 5, {"command": "true", **DEMANDS}), Target(2, 1))
    fake.run()
    write_progress(b, 1, json.dumps({"status": "done", "epoch": 5, "time": T + 1}))
    clock = pytest.MonkeyPatch()
    try:
        clock.setattr("dl2d.daemon.slurm.backend.time.time", lambda: now[0])
        st1 = b.observe()[1]
        assert (st1.state, st1.workers) == (RUNNING, 2) and "says done" in st1.message  # it holds its GPUs
        now[0] += 29
        assert b.observe()[1].state == RUNNING and ("cancel", "101") not in fake.calls
        now[0] += 2
        assert b.observe()[1].state in (RUNNING, FINISHED) and ("cancel", "101") in fake.calls
        st2 = b.observe()[1]  # Slurm holds nothing of it now
        assert st2.state == FINISHED and st2.finished_at.timestamp() == T + 31  # Slurm's EndTime
        assert b.apply(JobRequest(1, "resnet-50", 5, {"command": "true", **DEMANDS}), Target(2, 1)).method == "noop"
    finally:
        clock.undo()


def test_a_planted_link_fails_the_job_at_once_instead_of_every_slot(tmp_path):
    """The job's user replaced its secret with a link to a root file: the next start refuses it without reading
    anything, and the job is FAILED with the reason (it was retried, and logged, every slot)."""
    fake = InMemorySlurm()
    b = backend(tmp_path, fake)
    req = JobRequest(1, "resnet-50", 5, {"command": "true", **DEMANDS})
    b.apply(req, Target(1, 1))
    fake.run()
    write_progress(b, 1, json.dumps({"status": "checkpointed", "epoch": 2}))
    fake.end("101", "COMPLETED")
    assert b.observe()[1].state == PENDING  # checkpointed: waits to be started again
    secret = b.job_dir(1) / "job" / "job.secret"
    secret.unlink()
    secret.symlink_to("/etc/shadow")
    with pytest.raises(BackendError, match="cannot prepare its directory") as e:
        b.apply(req, Target(1, 1))
    assert not e.value.retryable
    st = b.observe()[1]
    assert st.state == FAILED and st.message.endswith("job.secret: it is a symbolic link")
    with pytest.raises(BackendError, match="is not restarted"):
        b.apply(req, Target(1, 1))
    assert [c[0] for c in fake.calls].count("submit") == 1


def test_a_progress_file_that_is_a_link_or_a_fifo_fails_the_job_once(tmp_path, caplog):
    fake = InMemorySlurm()
    b = backend(tmp_path, fake)
    for job_id in (1, 2):
        b.apply(JobRequest(job_id, "resnet-50", 5, {"command": "true", **DEMANDS}), Target(1, 1))
    fake.run()
    (b.job_dir(1) / "job" / "progress.json").symlink_to("/etc/shadow")
    os.mkfifo(b.job_dir(2) / "job" / "progress.json")
    with caplog.at_level("ERROR"):
        first = b.observe()
        again = b.observe()
    assert first[1].message == ("its progress file is refused: job/progress.json (or a directory on its way) is a "
                                "symbolic link or not a directory")
    assert first[2].message == "its progress file is refused: job/progress.json is not a regular file"
    assert all(again[j].state == FAILED for j in (1, 2))
    assert sum("failed: its progress file is refused" in r.getMessage() for r in caplog.records) == 2  # once each


# ------------------------------------------------------------------------------------------------ fuzz

JSON_LEAVES = (st.none() | st.booleans() | st.integers(min_value=-(2 ** 80), max_value=2 ** 80)
               | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40))
FIELDS = st.sampled_from(["epoch", "epochs", "step", "total_steps", "lost_steps", "time", "state", "status",
                          "address", "samples", "x"])
DOCS = st.dictionaries(FIELDS, st.recursive(JSON_LEAVES, lambda kids: st.lists(kids, max_size=3)
                                            | st.dictionaries(st.text(max_size=5), kids, max_size=3), max_leaves=6),
                       max_size=8)
SLURM_JOBS = st.sampled_from([None, SlurmJob("7", "dl2d-1", "RUNNING", start_time=T, nodes=("n1",)),
                              SlurmJob("7", "dl2d-1", "PENDING"),
                              SlurmJob("7", "dl2d-1", "COMPLETED", start_time=T, end_time=T + 60),
                              SlurmJob("7", "dl2d-1", "FAILED", start_time=T, end_time=T + 60)])
MTIMES = st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, T + 5.0, 1e18])


def _wire(doc: dict) -> bytes:
    """The doc as a job would write it (json's own NaN/Infinity, as Python's json.loads accepts them)."""
    return json.dumps(doc, default=str).encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=DOCS, slurm=SLURM_JOBS, mtime=MTIMES)
def test_fuzz_every_progress_report_is_refused_or_a_sound_status(doc, slurm, mtime):
    """Any report, through the daemon's own reading (the bytes, the JSON, the checks, the status): a
    JobReportError, or a status whose numbers the database takes and whose date exists."""
    try:
        checked = checked_progress(_json_object(_wire(doc)))
    except JobReportError as e:
        assert str(e) and "\n" not in str(e)
        return
    status = status_from(1, {"slurm_job_id": "7", "applied": {"workers": 1, "ps": 0}}, slurm, checked, mtime,
                         now=T + 120)
    assert math.isfinite(status.epochs_done) and status.epochs_done >= 0
    assert math.isfinite(status.lost_epochs) and status.lost_epochs >= 0
    assert status.finished_at is None or isinstance(status.finished_at, datetime)
    if status.finished_at is not None:
        assert T <= status.finished_at.timestamp() <= T + 120


ADDRESSES = st.fixed_dictionaries({"address": st.from_regex(r"\[?[a-z0-9.:-]{1,30}\]?:[0-9]{1,6}", fullmatch=True)
                                               | st.text(max_size=40)})


@settings(max_examples=300, deadline=None)
@given(doc=DOCS | ADDRESSES)
def test_fuzz_every_coordinator_file_is_refused_or_an_address(doc):
    try:
        got = checked_coordinator(_json_object(_wire(doc)))
    except JobReportError:
        return
    host, _, port = got["address"].rpartition(":")
    assert host and 1 <= int(port) <= 65535 and len(got["address"]) < 300


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300) | DOCS.map(_wire))
def test_fuzz_the_backend_observes_any_progress_file(tmp_path_factory, data):
    """Any bytes in a running job's progress file: observe() answers for every job — the job running, or
    FAILED with a one-line reason — and the other job is untouched."""
    d = tmp_path_factory.mktemp("fuzz")
    fake = InMemorySlurm()
    b = backend(d, fake)
    for job_id in (1, 2):
        b.apply(JobRequest(job_id, "resnet-50", 5, {"command": "true", **DEMANDS}), Target(1, 1))
    fake.run()
    (b.job_dir(1) / "job" / "progress.json").write_bytes(data)
    out = b.observe()
    assert out[2].state == RUNNING
    assert out[1].state in (RUNNING, FAILED, PENDING, FINISHED)
    if out[1].state == FAILED:
        assert out[1].message.startswith("its progress file is refused: ") and "\n" not in out[1].message
        assert ("cancel", "101") in fake.calls
