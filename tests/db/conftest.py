"""Fixtures of the database tests: every `db_url`/`engine` test runs on SQLite (a temporary file) and on a
real PostgreSQL server started by scripts/pg-localhost.sh (or the one at $DL2D_TEST_PG_URL).

PostgreSQL is skipped with a reason when it cannot be started, except under CI (env `CI` set) where that
is a failure.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import text

from dl2d.db.engine import make_engine, upgrade

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pg-localhost.sh"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL is required under CI: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pg_server_url():
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed (pip install 'psycopg[binary]')")
    if os.environ.get("DL2D_TEST_PG_URL"):
        yield os.environ["DL2D_TEST_PG_URL"]
        return
    # not under pytest's tmp dir: that one is 0700 root and the server runs as `postgres`
    d = tempfile.mkdtemp(prefix="dl2d-pg-")
    try:
        proc = subprocess.run(["bash", str(SCRIPT), "start", d, str(_free_port())],
                              capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        proc = None
        err = str(e)
    if proc is None or proc.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        _unavailable("could not start PostgreSQL: " + (err if proc is None else proc.stderr[-2000:]))
    try:
        yield proc.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", d], capture_output=True, timeout=120)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    """URL of an empty database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'dl2d.sqlite'}"
    url = request.getfixturevalue("pg_server_url")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
    return url


@pytest.fixture
def engine(db_url):
    """An engine on a database migrated to head."""
    upgrade(db_url)
    eng = make_engine(db_url)
    yield eng
    eng.dispose()
