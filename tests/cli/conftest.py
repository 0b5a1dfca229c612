"""Fixtures of the dl2ctl job-command tests: a fresh SQLite file per test, a fake calling user, and the
environment cleared of DL2D_* variables and of the host's /etc/dl2d/dl2d.toml."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

import dl2d.cli.dbconn as dbconn
from dl2d.cli.main import cli
from dl2d.db.engine import make_engine, session_scope, upgrade
from dl2d.db.jobs import submit_job

SPEC = {
    "name": "resnet-a", "job_type": "resnet-50", "total_epochs": 30, "command": "python train.py",
    "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8}, "ps": {"cpus": 2, "mem_gb": 4},
    "max_workers": 8, "max_ps": 4,
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in ("DL2D_DB_URL", "DL2D_STATE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DL2D_CONFIG", str(tmp_path / "no-such-config.toml"))


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'dl2d.sqlite'}"


@pytest.fixture
def as_user(monkeypatch):
    """as_user("alice") / as_user("bob", admin=True): who dl2ctl thinks is calling."""

    def set_user(name: str, admin: bool = False) -> None:
        monkeypatch.setattr(dbconn, "current_user", lambda: name)
        monkeypatch.setattr(dbconn, "is_admin", lambda user, group=None: admin or user == "root")

    set_user("alice")
    return set_user


@pytest.fixture
def dl2ctl(db_url, as_user):
    """dl2ctl("queue", "--json") -> click Result, against the test database."""

    def run(command: str, *args: str, input: str | None = None):
        return CliRunner().invoke(cli, [command, "--db", db_url, *args], input=input)

    return run


@pytest.fixture
def engine(db_url):
    upgrade(db_url)
    e = make_engine(db_url)
    yield e
    e.dispose()


@pytest.fixture
def seed(engine):
    """seed(owner=..., state=..., **spec overrides) -> job id, written with dl2d.db.jobs.submit_job."""

    def add(owner: str = "alice", state=None, **fields):
        with session_scope(engine) as s:
            job = submit_job(s, {**SPEC, "owner": owner, **fields})
            if state is not None:
                job.state = state
            return job.id

    return add


@pytest.fixture
def spec():
    """A valid job spec (a fresh copy)."""
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in SPEC.items()}
