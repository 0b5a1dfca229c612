from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from dl2d.db.engine import alembic_config, default_url, downgrade, make_engine, upgrade
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

    from dl2d.db import store
    from dl2d.db.engine import session_scope
    from dl2d.db.models import JobSlotStat
    from dbtest_helpers import submission

    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        with session_scope(engine) as s:
            job = store.submit_job(s, submission(), now=now)
            slot = store.record_slot(s, 0, now, [store.AllocationRecord(job.id, 2, 1)],
                                     store.DecisionRecord("d" * 64, [[job.id, 2, 1]], job_flags={str(job.id): ["slow"]}))
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
