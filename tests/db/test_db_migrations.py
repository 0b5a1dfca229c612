from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from dl2d.db.engine import (
    alembic_config,
    default_url,
    downgrade,
    make_engine,
    migration_connection,
    upgrade,
)
from dl2d.db.models import Base
from dl2d.db.report import queries

VIEWS = {"v_job_jct", "v_jct_daily", "v_jct_by_type", "v_jct_by_owner", "v_gpu_util_hourly",
         "v_resizes_per_job", "v_resizes_daily", "v_decision_sources", "v_decisions_daily", "v_fallback_reasons", "v_job_speed"}


def _diff(engine):
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)


def test_upgrade_from_empty_matches_models(db_url):
    upgrade(db_url)
    upgrade(db_url)  # at every daemon start: a no-op the second time
    engine = make_engine(db_url)
    try:
        assert _diff(engine) == []
        insp = inspect(engine)
        assert set(Base.metadata.tables) <= set(insp.get_table_names())
        assert VIEWS <= set(insp.get_view_names())
        head = ScriptDirectory.from_config(alembic_config()).get_current_head()
        with engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == head
            for q in queries().values():  # every report query runs on the empty schema
                conn.execute(text(q.sql)).all()
    finally:
        engine.dispose()


def test_downgrade_to_base_and_back(db_url):
    upgrade(db_url)
    downgrade(db_url, "base")
    engine = make_engine(db_url)
    try:
        insp = inspect(engine)
        assert not set(Base.metadata.tables) & set(insp.get_table_names())
        assert not VIEWS & set(insp.get_view_names())
        upgrade(engine)
        assert _diff(engine) == []
    finally:
        engine.dispose()


def test_sqlite_connection_settings(tmp_path):
    url = default_url(tmp_path)
    assert url.endswith("/dl2d.sqlite") and url.startswith("sqlite:///")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() > 0
    finally:
        engine.dispose()


def test_0002_job_slot_stats_down_to_0001_keeps_the_decisions(db_url):
    from datetime import datetime, timezone

    from testkit.db import submission

    from dl2d.db.engine import session_scope
    from dl2d.db.jobs import submit_job
    from dl2d.db.models import JobSlotStat
    from dl2d.db.slots import AllocationRecord, DecisionRecord, record_slot

    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        with session_scope(engine) as s:
            job = submit_job(s, submission(), now=now)
            slot = record_slot(s, 0, now, [AllocationRecord(job.id, 2, 1)],
                               DecisionRecord("d" * 64, [[job.id, 2, 1]], job_flags={str(job.id): ["slow"]}))
            s.add(JobSlotStat(slot_id=slot.id, job_id=job.id, workers=2, ps=1, epochs=1.5, epochs_per_s=0.001,
                              predicted_epochs_per_s=0.002, speed_factor=0.5, shared_gpu=True, gpus=2))
        with engine.connect() as conn:
            (row,) = conn.execute(text("SELECT n_slots, avg_speed_factor, n_shared_slots FROM v_job_speed")).all()
            assert tuple(row) == (1, 0.5, 1)
        downgrade(engine, "0001")
        insp = inspect(engine)
        assert "job_slot_stats" not in insp.get_table_names() and "v_job_speed" not in insp.get_view_names()
        assert "job_flags" not in {c["name"] for c in insp.get_columns("decisions")}
        with engine.connect() as conn:
            assert conn.execute(text("SELECT n_decisions FROM v_decision_sources")).scalar() == 1
        upgrade(engine)
        assert _diff(engine) == []
        with engine.connect() as conn:
            assert conn.execute(text("SELECT job_flags FROM decisions")).scalar() is None
    finally:
        engine.dispose()


# A job in a state 0003 removes, with a child row of every kind: the rebuild of `jobs` must keep them all.
_ROWS_0002 = [
    "INSERT INTO jobs (id, name, owner, job_type, total_epochs, epochs_done, state, spec, submitted_at, workers, ps)"
    " VALUES (1, 'j', 'alice', 'resnet-50', 10, 1, 'CHECKPOINTING', '{}', '2026-01-01 00:00:00', 2, 1)",
    "INSERT INTO slots (id, number, started_at, n_jobs) VALUES (1, 0, '2026-01-01 00:00:00', 1)",
    "INSERT INTO allocations (slot_id, job_id, workers, ps, prev_workers, prev_ps) VALUES (1, 1, 2, 1, 0, 0)",
    "INSERT INTO events (job_id, ts, kind) VALUES (1, '2026-01-01 00:00:00', 'relaunch')",
    "INSERT INTO intents (slot_id, job_id, kind, target, idempotency_key, state, created_at, updated_at)"
    " VALUES (1, 1, 'relaunch', '{}', 'k', 'DONE', '2026-01-01 00:00:00', '2026-01-01 00:00:00')",
    "INSERT INTO tasks (job_id, role, \"index\", state) VALUES (1, 'worker', 0, 'RUNNING')",
]


def _children(conn) -> tuple[int, int, int]:
    return tuple(conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar() for t in ("allocations", "events", "intents"))


def test_0003_drops_the_unwritten_schema_and_keeps_every_row(db_url):
    upgrade(db_url, "0002")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            for sql in _ROWS_0002:
                conn.execute(text(sql))
        upgrade(engine)
        assert "tasks" not in inspect(engine).get_table_names()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT state FROM jobs")).scalar() == "RUNNING"
            assert conn.execute(text("SELECT kind FROM intents")).scalar() == "resize"
            assert _children(conn) == (1, 1, 1)  # nothing cascaded away with the old `jobs`
            assert conn.execute(text("SELECT n_relaunch FROM v_resizes_per_job")).scalar() == 1  # views are back
        for sql in ("UPDATE jobs SET state = 'RESIZING'", "UPDATE intents SET kind = 'relaunch'"):
            with pytest.raises(IntegrityError), engine.begin() as conn:
                conn.execute(text(sql))

        downgrade(engine, "0002")
        assert "tasks" in inspect(engine).get_table_names()
        with engine.begin() as conn:
            conn.execute(text("UPDATE jobs SET state = 'RESIZING'"))  # allowed again
            conn.execute(text("UPDATE intents SET kind = 'relaunch'"))
            assert _children(conn) == (1, 1, 1)
        upgrade(engine)
        assert _diff(engine) == []
        with engine.connect() as conn:
            assert (conn.execute(text("SELECT state FROM jobs")).scalar(), _children(conn)) == ("RUNNING", (1, 1, 1))
    finally:
        engine.dispose()


def test_sqlite_migrations_run_without_foreign_keys_and_give_them_back(tmp_path):
    engine = make_engine(default_url(tmp_path))
    try:
        upgrade(engine)
        assert engine.pool.checkedin() == 1  # the connection the migration ran on, back in the pool
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_0003_refuses_to_rebuild_sqlite_tables_with_foreign_keys_on(tmp_path):
    url = default_url(tmp_path)
    upgrade(url, "0002")
    engine = make_engine(url)
    try:
        with pytest.raises(RuntimeError, match="foreign keys off"), engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")  # foreign keys on: the cascade would delete rows
        with engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == "0002"
        assert "tasks" in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_sqlite_migration_leaving_dangling_references_is_rolled_back(tmp_path):
    engine = make_engine(default_url(tmp_path))
    try:
        upgrade(engine)
        with engine.connect() as conn:
            head = MigrationContext.configure(conn).get_current_revision()
        with pytest.raises(RuntimeError, match="missing parents"), migration_connection(engine) as conn:
            # what a careless table rebuild could do with foreign keys off: a child row without its job
            conn.execute(text("INSERT INTO events (job_id, ts, kind) VALUES (42, '2026-01-01 00:00:00', 'submit')"))
            conn.execute(text(f"UPDATE alembic_version SET version_num = '{head}x'"))  # a migration ran
        with engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM events")).scalar() == 0
            assert MigrationContext.configure(conn).get_current_revision() == head
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()
