"""Who a Slurm job runs as, without a real Slurm: the backend over the in-memory Slurm hands
the driver the job's owner, account, QOS, partition and declared environment; an owner without an account on
the host fails that job (FAILED in the database, with the reason) while the daemon goes on; another user's Slurm
job that carries a job's name and comment is not adopted; the settings and start-up checks. The same on the
real local Slurm, with the job running as `nobody`: tests/slurm/test_jobs_run_as_owner.py."""
from __future__ import annotations

import logging
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import select

from dl2d.daemon.backend import FAILED, START, BackendError, JobRequest, Target
from dl2d.daemon.loop import SlotLoop
from dl2d.daemon.slurm.backend import SlurmBackend, backend_from_section, closed_directory
from dl2d.daemon.slurm.settings import SlurmBackendConfig, SlurmSection, run_jobs_as_problem, settings_from_section
from dl2d.db.engine import make_engine, session_scope, upgrade
from dl2d.db.jobs import submit_job
from dl2d.db.models import Event, EventKind, Job, JobState, utcnow
from dl2d.policy.registry import make_heuristic
from dl2d.slurm.backoff import BackoffPolicy
from dl2d.slurm.memory import InMemorySlurm

ME = pwd.getpwuid(os.geteuid()).pw_name
DEMANDS = {"worker": {"gpus": 1, "cpus": 1, "mem_gb": 1}, "ps": {"cpus": 1, "mem_gb": 1}}


def backend(tmp_path, fake, **cfg) -> SlurmBackend:
    return SlurmBackend(fake, SlurmBackendConfig(state_dir=tmp_path / "state", checkpoint_timeout_s=1.0,
                                                 poll_interval_s=0.01, partition="cpu",
                                                 backoff=BackoffPolicy(base=0.001, cap=0.001, max_attempts=2),
                                                 **cfg))


def req(job_id=1, **spec) -> JobRequest:
    return JobRequest(job_id, "resnet-50", 5, {"command": "true", **DEMANDS, **spec})


def test_the_job_runs_as_its_owner_with_what_it_names(tmp_path):
    fake = InMemorySlurm()
    b = backend(tmp_path, fake)
    env = {"WANDB_PROJECT": "bert", "OMP_NUM_THREADS": "4"}
    assert b.apply(req(owner=ME, account="proj-a", qos="high", partition="gpu", env=env), Target(2, 1)).method == START
    spec = fake.specs["101"]
    assert (spec.user, spec.account, spec.qos, spec.partition, dict(spec.env)) == (ME, "proj-a", "high", "gpu", env)
    assert spec.output == str(b.job_dir(1) / "job" / "slurm-%j.out")  # in the job's own directory
    assert "export DL2D_JOB_DIR=" + str(b.job_dir(1) / "job") in spec.script
    assert b.job_dir(1).joinpath("record.json").exists() and b.job_dir(1).joinpath("job", "checkpoint").is_dir()
    assert b._record(1)["user"] == ME
    # a spec that names none: the [slurm] partition, the user's default account and QOS, nothing declared
    b.apply(req(2, owner=ME), Target(1, 1))
    spec = fake.specs["102"]
    assert (spec.partition, spec.account, spec.qos, dict(spec.env)) == ("cpu", None, None, {})
    # run_jobs_as = "daemon": every job is the daemon's, whoever submitted it (single-user setups)
    fake = InMemorySlurm()
    b = backend(tmp_path / "d", fake, run_jobs_as="daemon")
    b.apply(req(owner="no-such-user-dl2d"), Target(1, 1))
    assert fake.specs["101"].user is None and b._record(1)["user"] == ME


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the job's directory to another user needs root")
def test_the_owner_gets_the_jobs_own_directory(tmp_path):
    fake = InMemorySlurm()
    b = backend(tmp_path, fake)
    b.apply(req(owner="nobody"), Target(1, 1))
    nobody = pwd.getpwnam("nobody")
    assert fake.specs["101"].user == "nobody"
    for path in (b.job_dir(1) / "job", b.job_dir(1) / "job" / "checkpoint"):
        assert os.stat(path).st_uid == nobody.pw_uid and os.stat(path).st_mode & 0o777 == 0o700
    assert os.stat(b.job_dir(1)).st_uid == 0 and os.stat(b.job_dir(1)).st_mode & 0o777 == 0o755
    assert os.stat(b.job_dir(1) / "target.env").st_mode & 0o777 == 0o644
    assert os.stat(b.config.state_dir / "jobs").st_mode & 0o777 == 0o711


def test_an_owner_without_an_account_fails_the_job_and_the_daemon_goes_on(tmp_path, caplog):
    """Through the daemon's loop: the job is FAILED in the database with the reason, nothing reached Slurm for
    it, and the other job starts in the same slot."""
    engine = make_engine(f"sqlite:///{tmp_path / 'dl2d.sqlite'}")
    upgrade(engine)
    fake = InMemorySlurm()
    b = backend(tmp_path, fake)
    with session_scope(engine) as s:
        ids = [submit_job(s, {"name": name, "owner": owner, "job_type": "resnet-50", "total_epochs": 5,
                              "command": "python train.py", **DEMANDS}).id
               for name, owner in (("ghost", "nosuchuserdl2d"), ("real", ME))]
    loop = SlotLoop(engine, b, None, make_heuristic("drf"), slot_seconds=1, pace=False)
    with caplog.at_level(logging.ERROR, logger="dl2d.daemon.slurm.backend"):
        loop.run(max_slots=1)
    fake.run()
    loop.run(max_slots=1)
    fake.run()  # Slurm starts what the slot submitted (a job is running once Slurm says so)
    with session_scope(engine) as s:
        loop.reconcile(s, b.observe(), utcnow())
    with session_scope(engine) as s:
        ghost, real = s.get(Job, ids[0]), s.get(Job, ids[1])
        assert ghost.state == JobState.FAILED and real.state == JobState.RUNNING
        [fail] = s.scalars(select(Event).where(Event.job_id == ghost.id, Event.kind == EventKind.FAIL)).all()
    why = "cannot run as its owner: user 'nosuchuserdl2d' has no account on this host (no passwd entry)"
    assert why in fail.detail["message"] and why in caplog.text
    # only the real user's job reached Slurm (maybe twice: DRF may grow it once the other is gone)
    assert {(spec.user, spec.dl2d_job_id) for spec in fake.specs.values()} == {(ME, str(ids[1]))}
    st = b.observe()[ids[0]]
    assert st.state == FAILED and why in st.message
    with pytest.raises(BackendError, match="it is not restarted") as e:  # and it is never tried again
        b.apply(req(ids[0], owner="nosuchuserdl2d"), Target(1, 1))
    assert not e.value.retryable


def test_a_request_without_owner_is_refused(tmp_path):
    b = backend(tmp_path, InMemorySlurm())
    with pytest.raises(BackendError, match="names no owner to run as") as e:
        b.apply(req(), Target(1, 1))
    assert not e.value.retryable and b.observe()[1].state == FAILED


def test_a_slurm_job_is_adopted_only_with_its_submissions_token_and_user(tmp_path, caplog):
    """Anyone can sbatch --job-name=dl2d-1 --comment=dl2d:1 (ids are sequential): the backend adopts an unknown
    active job (its own, submitted just before a crash) only when the comment carries the token it recorded
    before sbatch and Slurm runs the job as the user it was submitted as; anything else is left alone, logged
    once."""
    fake = InMemorySlurm()
    b = backend(tmp_path, fake)
    b.apply(req(owner=ME), Target(1, 1))
    token = b._record(1)["submit_token"]
    fake.end("101", "COMPLETED")
    planted = fake.slurm_jobs["101"].__class__
    fake.slurm_jobs["666"] = planted(job_id="666", name="dl2d-1", state="RUNNING", comment="dl2d:1", user="mallory",
                                     num_nodes=1)
    fake.slurm_jobs["667"] = planted(job_id="667", name="dl2d-1", state="RUNNING", comment="dl2d:1", user=ME,
                                     num_nodes=1)  # even the job's own user: the id alone is guessable
    fake.slurm_jobs["668"] = planted(job_id="668", name="dl2d-1", state="RUNNING", comment=f"dl2d:1:{token}",
                                     user="mallory", num_nodes=1)  # the token copied from squeue, another user
    with caplog.at_level(logging.WARNING):
        assert b.observe()[1].backend_ref == "101"
        assert b.observe()[1].backend_ref == "101"
    assert sorted(r.getMessage().split("Slurm job ")[1].split()[0] for r in caplog.records
                  if "left alone" in r.getMessage()) == ["666", "667", "668"]  # once each
    fake.slurm_jobs["669"] = planted(job_id="669", name="dl2d-1", state="RUNNING", comment=f"dl2d:1:{token}",
                                     user=ME, num_nodes=1)
    assert b.observe()[1].backend_ref == "669"  # its own submission: adopted


def test_run_jobs_as_setting_and_start_checks(tmp_path, monkeypatch, caplog):
    assert settings_from_section(SlurmSection(), tmp_path)[2].run_jobs_as == "owner"  # the default
    assert settings_from_section(SlurmSection(run_jobs_as="daemon"), tmp_path)[2].run_jobs_as == "daemon"
    with pytest.raises(ValueError, match="run_jobs_as must be one of owner, daemon, got 'me'"):
        settings_from_section(SlurmSection(run_jobs_as="me"), tmp_path)
    assert run_jobs_as_problem("owner", 0) is None and run_jobs_as_problem("daemon", 999) is None
    problem = run_jobs_as_problem("owner", 999)
    assert problem.startswith('slurm.run_jobs_as = "owner": jobs run as the users who submit them, which needs '
                              "the daemon to run as root (it runs as uid 999)")
    # at start: a daemon that is not root refuses "owner" (a config error: one line, exit 2)
    monkeypatch.setattr("dl2d.slurm.driver.make_driver", lambda kind, **options: InMemorySlurm())
    monkeypatch.setattr(os, "geteuid", lambda: 999)
    with pytest.raises(ValueError, match="needs the daemon to run as root"):
        backend_from_section(SlurmSection(state_dir=str(tmp_path / "s")), tmp_path)
    monkeypatch.undo()
    monkeypatch.setattr("dl2d.slurm.driver.make_driver", lambda kind, **options: InMemorySlurm())
    # a state dir the jobs' users cannot reach: one line at start naming the directory (not pytest's: 0700)
    base = Path(tempfile.mkdtemp(prefix="dl2d-run-as-"))
    try:
        base.chmod(0o711)
        closed = base / "closed"
        (closed / "s").mkdir(parents=True)
        closed.chmod(0o700)
        with caplog.at_level(logging.ERROR, logger="dl2d.daemon.slurm.backend"):
            backend_from_section(SlurmSection(state_dir=str(closed / "s")), tmp_path)
        assert f"Slurm state_dir: {closed} (mode 0700) does not let other users through: jobs run as their " \
               f"owners and cannot reach their directories under {closed}/s/jobs; chmod o+x {closed}" in caplog.text
        closed.chmod(0o711)
        assert closed_directory(closed / "s") is None
    finally:
        shutil.rmtree(base)
