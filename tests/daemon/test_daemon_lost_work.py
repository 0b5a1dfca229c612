"""Work a job lost to a restart (docs/jobs.md: a job killed before it saved redoes the steps since its last
checkpoint, and reports them): the daemon keeps the most it was told in the job's row, logs it, and
`dl2ctl show` names it."""
from __future__ import annotations

from dataclasses import replace

from click.testing import CliRunner
from sqlalchemy import select

from dl2d.cli.main import cli
from dl2d.daemon.config import build_config
from dl2d.daemon.main import build_loop
from dl2d.db.engine import session_scope
from dl2d.db.jobs import submit_job
from dl2d.db.models import Job

SPEC = {"name": "lossy", "owner": "bob", "kind": "allreduce", "job_type": "cifar10", "batch_size": 512.0,
        "total_epochs": 1e4, "command": "python t.py", "worker": {"gpus": 1, "cpus": 1, "mem_gb": 1}}


class Feeder:
    hidden = None

    def __call__(self, session, number, now):
        if number == 0:
            submit_job(session, SPEC, known_types=(), now=now)
        return 0


class ReportsLostWork:
    """The simulated backend, with the job reporting ``lost[slot]`` epochs lost so far (as its progress does)."""

    def __init__(self, backend, lost):
        self.backend, self.lost, self.calls = backend, lost, 0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def observe(self):
        self.calls += 1
        told = self.lost[min(self.calls - 1, len(self.lost) - 1)]
        return {k: replace(st, lost_epochs=told) for k, st in self.backend.observe().items()}


def test_the_daemon_stores_the_work_a_job_lost_and_dl2ctl_show_names_it(tmp_path, caplog):
    cfg = build_config({"state_dir": str(tmp_path), "sim": {"cluster": "t4-16", "noise": 0.0},
                        "metrics": {"enabled": False}, "policy": {"name": "drf"}}, {})
    loop = build_loop(cfg, feeder=Feeder())
    loop.backend = ReportsLostWork(loop.backend, [0.0, 0.0, 0.25, 0.25, 0.4])
    loop.run(max_slots=6)
    with session_scope(loop.engine) as s:
        assert s.scalars(select(Job.lost_epochs)).one() == 0.4
    loop.engine.dispose()
    assert "epochs lost to restarts so far" in caplog.text
    r = CliRunner().invoke(cli, ["show", "--db", cfg.database_url, "1"])
    assert r.exit_code == 0 and "lost to restarts" in r.output and "0.4 epochs trained again" in r.output, r.output
