"""Slurm is the truth for what a job holds, without a real Slurm (the in-memory one, through the daemon's loop and
a real SQLite database): a job dl2d sized but Slurm holds pending is PENDING in the database with Slurm's reason,
and its start time is Slurm's; a job that is not elastic is relaunched to change its size on the nodes it holds,
never recorded at a size its allocation does not have."""
from __future__ import annotations

import os
import pwd
from datetime import timezone

from dl2d.daemon.backend import NOOP, RESTART, JobRequest, Target
from dl2d.daemon.loop import SlotLoop
from dl2d.daemon.slurm.backend import SlurmBackend
from dl2d.daemon.slurm.settings import SlurmBackendConfig
from dl2d.db.engine import make_engine, session_scope, upgrade
from dl2d.db.jobs import submit_job
from dl2d.db.models import Job, JobState
from dl2d.db.slots import pending_reasons
from dl2d.policy.registry import make_heuristic
from dl2d.slurm.backoff import BackoffPolicy
from dl2d.slurm.memory import InMemorySlurm

ME = pwd.getpwuid(os.geteuid()).pw_name
DEMANDS = {"worker": {"gpus": 1, "cpus": 1, "mem_gb": 1}, "ps": {"cpus": 1, "mem_gb": 1}}
T = 1_700_000_000


def backend(tmp_path, fake) -> SlurmBackend:
    return SlurmBackend(fake, SlurmBackendConfig(state_dir=tmp_path / "state", checkpoint_timeout_s=1.0,
                                                 poll_interval_s=0.01, run_jobs_as="daemon",
                                                 backoff=BackoffPolicy(base=0.001, cap=0.001, max_attempts=2)))


def test_a_job_slurm_holds_pending_is_pending_with_slurms_reason_and_starts_when_slurm_starts_it(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'dl2d.sqlite'}")
    upgrade(engine)
    fake = InMemorySlurm()
    fake.clock = lambda: T
    b = backend(tmp_path, fake)
    with session_scope(engine) as s:
        job_id = submit_job(s, {"name": "held", "owner": ME, "job_type": "resnet-50", "total_epochs": 5,
                                "command": "python train.py", **DEMANDS, "max_workers": 2, "max_ps": 1}).id
    loop = SlotLoop(engine, b, None, make_heuristic("drf"), slot_seconds=1, pace=False)
    loop.run(max_slots=1)  # submitted; Slurm has not started it
    slurm_id = b._record(job_id)["slurm_job_id"]
    fake.set_job(slurm_id, reason="Resources")
    loop.run(max_slots=1)
    with session_scope(engine) as s:
        job = s.get(Job, job_id)
        assert (job.state, job.workers, job.started_at) == (JobState.PENDING, 2, None)  # sized, not running
        assert pending_reasons(s)[job_id] == "Slurm PENDING (Resources)"
    fake.clock = lambda: T + 93  # Slurm starts it 93 s later
    fake.run()
    loop.run(max_slots=1)
    with session_scope(engine) as s:
        job = s.get(Job, job_id)
        assert job.state == JobState.RUNNING
        assert job.started_at.replace(tzinfo=timezone.utc).timestamp() == T + 93  # Slurm's StartTime


def test_a_job_that_is_not_elastic_is_relaunched_to_change_size_on_its_nodes(tmp_path):
    """4 workers on one node of 4 GPUs, then 3: Slurm takes no GPU from a node in place, so the daemon relaunches
    the job at 3 (its record says 3 only once Slurm runs it so); it never records 3 on the allocation of 4."""
    fake = InMemorySlurm()
    b = backend(tmp_path, fake)
    req = JobRequest(1, "resnet-50", 5, {"command": "python train.py", "launch": "once", **DEMANDS})
    b.apply(req, Target(4, 1))
    fake.run()
    assert fake.slurm_jobs["101"].gpus_per_node == 4
    res = b.apply(req, Target(3, 1))
    assert (res.method, res.running) == (RESTART, False)
    new = b._record(1)["slurm_job_id"]
    assert new != "101" and fake.slurm_jobs[new].gpus_per_node == 3 and not fake.slurm_jobs["101"].active
    fake.run()
    assert b.apply(req, Target(3, 1)).method == NOOP and b.observe()[1].workers == 3


def test_a_job_that_is_not_elastic_keeps_its_servers_rather_than_restart_for_them(tmp_path):
    fake = InMemorySlurm()
    b = backend(tmp_path, fake)
    req = JobRequest(1, "resnet-50", 5, {"command": "python train.py", "launch": "once", **DEMANDS})
    b.apply(req, Target(2, 2))
    fake.run()
    res = b.apply(req, Target(2, 1))
    assert (res.method, res.held, res.running) == (NOOP, (2, 2), True)  # what Slurm holds for it, unchanged
    assert b._record(1)["applied"] == {"workers": 2, "ps": 2} and b.observe()[1].ps == 2
    assert [c[0] for c in fake.calls] == ["submit"]
