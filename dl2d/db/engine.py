"""Engines, sessions and schema migration.

SQLite (the default, one file in the daemon's state directory) is opened in WAL mode with foreign keys on
and a busy timeout, and every transaction starts with `BEGIN IMMEDIATE`: pysqlite's own transaction
handling breaks SAVEPOINTs (which `record_slot` relies on) and a deferred transaction that later writes
can fail at once with "database is locked" when the daemon and `dl2ctl` write concurrently.
PostgreSQL is used when a URL such as `postgresql+psycopg://user@host:port/db` is given.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 10_000


def default_url(state_dir: str | Path) -> str:
    """The default database: `<state_dir>/dl2d.sqlite`."""
    return f"sqlite:///{Path(state_dir).resolve() / 'dl2d.sqlite'}"


def make_engine(url: str, **kwargs) -> Engine:
    """Create an engine for `url` with dl2d's connection settings."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database not in (None, "", ":memory:") and not u.database.startswith("file:"):
            _create_private(Path(u.database))
        engine = create_engine(u, **kwargs)
        _setup_sqlite(engine, in_memory=u.database in (None, "", ":memory:"))
        return engine
    return create_engine(u, pool_pre_ping=True, **kwargs)


#: A new SQLite database file's mode, whatever the umask: it holds every job's spec, declared secrets included
#: (SQLite gives its -wal and -shm files the database file's mode).
DB_FILE_MODE = 0o640


def _create_private(path: Path) -> None:
    """Create the database file ``path`` (mode :data:`DB_FILE_MODE`) unless it exists; an existing file keeps
    the mode its owner gave it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, DB_FILE_MODE)
    except FileExistsError:
        return
    except OSError:
        return  # a directory that does not exist or cannot be written: SQLite says so, in its own words
    try:
        os.fchmod(fd, DB_FILE_MODE)  # the umask may have taken bits away, never added them: this is exact
    finally:
        os.close(fd)


def _setup_sqlite(engine: Engine, in_memory: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see module docstring)
        cur = dbapi_conn.cursor()
        # first: switching a new database to WAL takes a lock another process (a daemon creating the schema, a
        # second dl2ctl) may hold, and it should wait for it like every later statement does
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        if not in_memory:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


@contextmanager
def session_scope(bind: Engine | sessionmaker[Session]) -> Iterator[Session]:
    """A session in one transaction: committed on success, rolled back on error."""
    factory = bind if isinstance(bind, sessionmaker) else sessionmaker(bind, expire_on_commit=False)
    with factory() as session, session.begin():
        yield session


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    """An Alembic Config built in code (no alembic.ini needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def upgrade(target: str | Engine, revision: str = "head") -> None:
    """Migrate the database at `target` (URL or engine) to `revision`; safe to call at every start."""
    _run_alembic(command.upgrade, target, revision)


def downgrade(target: str | Engine, revision: str) -> None:
    _run_alembic(command.downgrade, target, revision)


def _run_alembic(fn, target: str | Engine, revision: str) -> None:
    engine = make_engine(target) if isinstance(target, str) else target
    try:
        with migration_connection(engine) as conn:
            fn(alembic_config(conn), revision)
    finally:
        if isinstance(target, str):
            engine.dispose()


@contextmanager
def migration_connection(engine: Engine) -> Iterator[Connection]:
    """A connection in one transaction to run migrations in.

    On SQLite, foreign keys are off meanwhile: a migration that changes a table rebuilds it (Alembic's batch
    mode: copy, DROP, rename), and with foreign keys on, dropping `jobs` would first delete every
    allocation, event and intent that references a job (ON DELETE CASCADE). The pragma only takes effect
    outside a transaction, hence here and not in a migration. When a migration ran, `foreign_key_check`
    makes sure before the commit that it left no dangling reference (a full scan, so not at every start of
    an up-to-date database); the connection gets its foreign keys back after.
    """
    with engine.connect() as conn:
        if conn.dialect.name != "sqlite":
            with conn.begin():
                yield conn
            return
        raw = conn.connection.dbapi_connection
        raw.execute("PRAGMA foreign_keys=OFF")  # autocommit mode (see _setup_sqlite): nothing is open yet
        try:
            with conn.begin():
                before = MigrationContext.configure(conn).get_current_revision()
                yield conn
                if MigrationContext.configure(conn).get_current_revision() != before:
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise RuntimeError(f"the migration left rows referencing missing parents: {broken[:5]}")
        finally:
            raw.execute("PRAGMA foreign_keys=ON")
