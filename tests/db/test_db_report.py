from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner
from sqlalchemy import text
from testkit.db import submission

from dl2d.cli.report import report
from dl2d.db.advice import advice_report
from dl2d.db.engine import session_scope
from dl2d.db.events import record_event
from dl2d.db.jobs import submit_job
from dl2d.db.models import Job, JobState
from dl2d.db.report import Window, execute, parse_report_sql, queries, run_all, run_report
from dl2d.db.samples import insert_node_samples
from dl2d.db.slots import AllocationRecord, DecisionRecord, record_job_slot_stats, record_slot


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


# (owner, job_type, submitted, finished, state): JCTs 1 h, 3 h (day 1), 2 h (day 2); the others don't count
JOBS = [
    ("alice", "resnet-50", utc(2024, 5, 1, 8), utc(2024, 5, 1, 9), JobState.COMPLETED),
    ("alice", "vgg-16", utc(2024, 5, 1, 12), utc(2024, 5, 1, 15), JobState.COMPLETED),
    ("bob", "resnet-50", utc(2024, 5, 1, 23), utc(2024, 5, 2, 1), JobState.COMPLETED),
    ("bob", "resnet-50", utc(2024, 5, 1, 8), utc(2024, 5, 1, 20), JobState.FAILED),
    ("carol", "dssm", utc(2024, 5, 2, 8), None, JobState.RUNNING),
]


@pytest.fixture
def reports(engine):
    with session_scope(engine) as s:
        ids = []
        for i, (owner, jt, sub, fin, state) in enumerate(JOBS):
            job = submit_job(s, submission(name=f"j{i}", owner=owner, job_type=jt), now=sub)
            job.state, job.finished_at = state, fin
            # a non-UTC time zone must be stored as the same instant
            job.started_at = (sub + timedelta(minutes=30)).astimezone(timezone(timedelta(hours=2)))
            ids.append(job.id)
        record_event(s, "resize", ids[0], ts=utc(2024, 5, 1, 8, 20))
        record_event(s, "resize", ids[0], ts=utc(2024, 5, 1, 8, 40))
        record_event(s, "relaunch", ids[1], ts=utc(2024, 5, 2, 0, 10))
        for n in range(4):
            src = "fallback" if n == 3 else "policy"
            record_slot(s, n, utc(2024, 5, 1, 8 + n), [AllocationRecord(ids[0], 1, 1)],
                        DecisionRecord("0" * 64, [], source=src, fallback_reason="timeout" if n == 3 else None,
                                       latency_ms=10.0 * (n + 1)))
        insert_node_samples(s, [
            {"node": "n1", "ts": utc(2024, 5, 1, 8, 0), "gpu_count": 2, "gpu_util_mean_pct": 50.0, "n": 6,
             "resolution_s": 60, "gpu_mem_used_bytes": 10.0, "gpu_mem_total_bytes": 40.0},
            {"node": "n2", "ts": utc(2024, 5, 1, 8, 30), "gpu_count": 1, "gpu_util_mean_pct": 80.0, "n": 6,
             "resolution_s": 60, "gpu_mem_used_bytes": 10.0, "gpu_mem_total_bytes": 40.0},
            {"node": "n1", "ts": utc(2024, 5, 1, 9, 0).timestamp(), "gpu_count": 2, "gpu_util_mean_pct": 10.0,
             "mystery": 1},
            {"node": "cpu1", "ts": utc(2024, 5, 1, 8, 0), "gpu_count": 0, "gpu_util_mean_pct": None},
        ])
    return run_all(engine)


def test_jct_reports(reports):
    h = 3600.0
    assert [(r["day"], r["n_jobs"]) for r in reports["jct_daily"]] == [("2024-05-01", 2), ("2024-05-02", 1)]
    assert [r["avg_jct_s"] for r in reports["jct_daily"]] == pytest.approx([2 * h, 2 * h])
    assert reports["jct_daily"][0]["max_jct_s"] == pytest.approx(3 * h)
    by_type = {r["job_type"]: (r["n_jobs"], r["avg_jct_s"]) for r in reports["jct_by_type"]}
    assert by_type == {"resnet-50": (2, pytest.approx(1.5 * h)), "vgg-16": (1, pytest.approx(3 * h))}
    by_owner = {r["owner"]: (r["n_jobs"], r["avg_jct_s"]) for r in reports["jct_by_owner"]}
    assert by_owner == {"alice": (2, pytest.approx(2 * h)), "bob": (1, pytest.approx(2 * h))}


def test_queue_time_and_timezones(engine, reports):
    with session_scope(engine) as s:
        job = s.query(Job).filter_by(name="j0").one()
        assert job.started_at == utc(2024, 5, 1, 8, 30) and job.started_at.tzinfo == timezone.utc


def test_resize_gpu_and_decision_reports(reports):
    assert [(r["job_id"], r["n_resize"], r["n_relaunch"]) for r in reports["resizes_per_job"]] == [
        (1, 2, 0), (2, 0, 1)]
    assert [(r["day"], r["n_resize"], r["n_relaunch"], r["n_jobs"]) for r in reports["resizes_daily"]] == [
        ("2024-05-01", 2, 0, 1), ("2024-05-02", 0, 1, 1)]
    sources = {r["source"]: (r["n_decisions"], float(r["share"]), r["avg_latency_ms"])
               for r in reports["decision_sources"]}
    assert sources == {"policy": (3, 0.75, pytest.approx(20.0)), "fallback": (1, 0.25, pytest.approx(40.0))}
    assert [(r["day"], r["n_policy"], r["n_fallback"]) for r in reports["decisions_daily"]] == [
        ("2024-05-01", 3, 1)]
    assert reports["fallback_reasons"] == [{"fallback_reason": "timeout", "n_decisions": 1}]
    hours = {r["hour"]: r for r in reports["gpu_util_hourly"]}
    assert list(hours) == ["2024-05-01 08:00", "2024-05-01 09:00"]
    assert hours["2024-05-01 08:00"]["n_nodes"] == 2
    assert hours["2024-05-01 08:00"]["avg_gpu_util"] == pytest.approx((2 * 50 + 80) / 3)
    assert hours["2024-05-01 08:00"]["gpu_mem_frac"] == pytest.approx(0.25)
    assert hours["2024-05-01 09:00"]["avg_gpu_util"] == pytest.approx(10.0)


def test_cli_report(db_url, reports):
    out = CliRunner().invoke(report, ["--db", db_url, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert [r["n_jobs"] for r in data["jct_daily"]] == [2, 1]
    out = CliRunner().invoke(report, ["--db", db_url, "--only", "jct_by_owner"])
    assert out.exit_code == 0 and "alice" in out.output and "7,200.00" in out.output


def test_parse_report_sql():
    q = parse_report_sql("-- header\n-- name: a\n-- First\n-- line two\nSELECT 1\nFROM x;\n\n-- name: b\nSELECT 2;\n")
    assert list(q) == ["a", "b"]
    assert q["a"].description == "First line two" and q["a"].sql == "SELECT 1\nFROM x" and q["b"].sql == "SELECT 2"


def test_a_query_binds_the_window_and_runs_without_it_as_null():
    q = parse_report_sql("-- name: a\nSELECT d::date FROM t WHERE (:start IS NULL OR d >= :start) AND :endx < :end;")["a"]
    assert q.params == ["end", "start"]
    assert q.sql == "SELECT d::date FROM t WHERE (NULL IS NULL OR d >= NULL) AND :endx < NULL"
    assert parse_report_sql("-- name: b\nSELECT 1")["b"].params == []
    assert all(set(x.params) == {"start", "end"} for x in queries().values())  # every report honours the window


# --- time windows (dl2ctl report -S/-E) -------------------------------------------------------------------------

D1, D2, D3 = utc(2026, 11, 1), utc(2026, 11, 2), utc(2026, 11, 3)
W = Window(D1, D3)  # [2026-11-01, 2026-11-03)
H = 3600.0
# name: (owner, job_type, submitted, finished, state); in W: d (finished at its start), a, b; c finished at its
# end (excluded), e failed, f before it
WJOBS = {
    "a": ("alice", "resnet-50", utc(2026, 11, 1, 6), utc(2026, 11, 1, 8), JobState.COMPLETED),  # 2 h
    "b": ("bob", "vgg-16", D2, utc(2026, 11, 2, 1), JobState.COMPLETED),  # 1 h
    "c": ("alice", "vgg-16", utc(2026, 11, 2, 20), D3, JobState.COMPLETED),  # 4 h
    "d": ("carol", "dssm", utc(2026, 10, 31, 21), D1, JobState.COMPLETED),  # 3 h
    "e": ("bob", "resnet-50", utc(2026, 11, 1, 9), utc(2026, 11, 2, 9), JobState.FAILED),
    "f": ("dave", "dssm", utc(2026, 10, 30), utc(2026, 10, 31, 23, 59, 59), JobState.COMPLETED),  # 23:59:59
}


def _stat(job_id, factor, shared=False):
    return {"job_id": job_id, "workers": 1, "ps": 0, "epochs": 1.0, "epochs_per_s": 0.01,
            "predicted_epochs_per_s": 0.01, "speed_factor": factor, "ended": False, "gpus": 1,
            "gpu_util_mean_pct": 50.0, "gpu_mem_per_gpu_max_bytes": 2.0 ** 30, "shared_gpu": shared,
            "gpu_observations": 1}


@pytest.fixture
def windowed(engine):
    with session_scope(engine) as s:
        ids = {}
        for name, (owner, jt, sub, fin, state) in WJOBS.items():
            job = submit_job(s, submission(name=name, owner=owner, job_type=jt), now=sub)
            job.state, job.finished_at = state, fin
            ids[name] = job.id
        for kind, job, ts in [("resize", "a", utc(2026, 10, 31, 23)), ("resize", "a", utc(2026, 11, 1, 1)),
                              ("relaunch", "b", utc(2026, 11, 2, 2)), ("resize", "b", utc(2026, 11, 2, 3)),
                              ("hot_scale", "c", D3)]:
            record_event(s, kind, ids[job], ts=ts)
        # (start, source, fallback reason, latency, job_slot_stats rows)
        for n, (t, src, why, ms, stats) in enumerate([
                (utc(2026, 10, 31, 12), "policy", None, 5.0, [_stat(ids["a"], 0.5)]),
                (D1, "policy", None, 10.0, [_stat(ids["a"], 1.0)]),
                (utc(2026, 11, 1, 12), "fallback", "timeout", 30.0, []),
                (utc(2026, 11, 2, 6), "fallback", "no_checkpoint", 50.0, [_stat(ids["b"], 0.8, shared=True)]),
                (D3, "fallback", "timeout", 70.0, [_stat(ids["a"], 0.2)])]):
            slot = record_slot(s, n, t, [], DecisionRecord("0" * 64, [], source=src, fallback_reason=why,
                                                           latency_ms=ms))
            record_job_slot_stats(s, slot, stats)
        sample = {"resolution_s": 60, "n": 1, "gpu_mem_used_bytes": 10.0, "gpu_mem_total_bytes": 40.0}
        insert_node_samples(s, [
            {**sample, "node": "n1", "ts": utc(2026, 10, 31, 23, 59, 59), "gpu_count": 2, "gpu_util_mean_pct": 10.0},
            {**sample, "node": "n1", "ts": D1, "gpu_count": 2, "gpu_util_mean_pct": 50.0},
            {**sample, "node": "n2", "ts": utc(2026, 11, 1, 0, 30), "gpu_count": 1, "gpu_util_mean_pct": 80.0},
            {**sample, "node": "n1", "ts": utc(2026, 11, 2, 23, 59), "gpu_count": 2, "gpu_util_mean_pct": 20.0},
            {**sample, "node": "n1", "ts": D3, "gpu_count": 2, "gpu_util_mean_pct": 90.0},
        ])
    return ids


def _jct(rows, key):
    return [(r[key], r["n_jobs"], round(float(r["avg_jct_s"]) / H, 6), round(float(r["max_jct_s"]) / H, 6))
            for r in rows]


def test_a_window_selects_the_jobs_that_finished_in_it(engine, windowed):
    r = run_all(engine, W)
    assert _jct(r["jct_daily"], "day") == [("2026-11-01", 2, 2.5, 3.0), ("2026-11-02", 1, 1.0, 1.0)]
    assert _jct(r["jct_by_type"], "job_type") == [("dssm", 1, 3.0, 3.0), ("resnet-50", 1, 2.0, 2.0),
                                                  ("vgg-16", 1, 1.0, 1.0)]
    assert _jct(r["jct_by_owner"], "owner") == [("alice", 1, 2.0, 2.0), ("bob", 1, 1.0, 1.0),
                                                ("carol", 1, 3.0, 3.0)]
    everything = run_all(engine)
    f_jct = round((48 * H - 1) / H, 6)  # 2026-10-30 00:00 -> 10-31 23:59:59
    assert _jct(everything["jct_daily"], "day") == [("2026-10-31", 1, f_jct, f_jct),
                                                    ("2026-11-01", 2, 2.5, 3.0), ("2026-11-02", 1, 1.0, 1.0),
                                                    ("2026-11-03", 1, 4.0, 4.0)]
    only_start = run_report(engine, "jct_by_owner", Window(start=utc(2026, 11, 1, 0, 0, 1)))
    assert [(x["owner"], x["n_jobs"]) for x in only_start] == [("alice", 2), ("bob", 1)]  # d: 1 s too early
    only_end = run_report(engine, "jct_by_owner", Window(end=D1))
    assert [(x["owner"], x["n_jobs"]) for x in only_end] == [("dave", 1)]


def test_a_window_selects_the_samples_events_decisions_and_slots_in_it(engine, windowed):
    r = run_all(engine, W)
    hours = [(x["hour"], x["n_nodes"], round(float(x["avg_gpu_util"]), 6)) for x in r["gpu_util_hourly"]]
    assert hours == [("2026-11-01 00:00", 2, 60.0), ("2026-11-02 23:00", 1, 20.0)]
    assert [(x["job_id"], x["n_resize"], x["n_relaunch"], x["n_hot_scale"]) for x in r["resizes_per_job"]] == [
        (windowed["a"], 1, 0, 0), (windowed["b"], 1, 1, 0)]
    assert [(x["day"], x["n_resize"], x["n_relaunch"], x["n_hot_scale"], x["n_jobs"]) for x in r["resizes_daily"]] == [
        ("2026-11-01", 1, 0, 0, 1), ("2026-11-02", 1, 1, 0, 1)]
    assert [(x["source"], x["n_decisions"], round(float(x["share"]), 6), x["avg_latency_ms"])
            for x in r["decision_sources"]] == [("fallback", 2, round(2 / 3, 6), 40.0),
                                                ("policy", 1, round(1 / 3, 6), 10.0)]
    assert [(x["day"], x["n_policy"], x["n_fallback"]) for x in r["decisions_daily"]] == [
        ("2026-11-01", 1, 1), ("2026-11-02", 0, 1)]
    assert [(x["fallback_reason"], x["n_decisions"]) for x in r["fallback_reasons"]] == [
        ("no_checkpoint", 1), ("timeout", 1)]
    assert [(x["job_id"], x["n_slots"], x["min_speed_factor"], x["n_shared_slots"]) for x in r["job_speed"]] == [
        (windowed["a"], 1, 1.0, 0), (windowed["b"], 1, 0.8, 1)]
    # a window starting within an hour takes the samples, not the hours: n1's sample at 00:00 is out
    mid = run_report(engine, "gpu_util_hourly", Window(utc(2026, 11, 1, 0, 15), D2))
    assert [(x["hour"], x["n_nodes"], float(x["avg_gpu_util"])) for x in mid] == [("2026-11-01 00:00", 1, 80.0)]
    everything = run_all(engine)
    assert [(x["fallback_reason"], x["n_decisions"]) for x in everything["fallback_reasons"]] == [
        ("timeout", 2), ("no_checkpoint", 1)]
    assert [(x["job_id"], x["n_slots"], x["min_speed_factor"]) for x in everything["job_speed"]] == [
        (windowed["a"], 3, 0.2), (windowed["b"], 1, 0.8)]
    assert len(everything["gpu_util_hourly"]) == 4 and len(everything["resizes_daily"]) == 4


# what each report was before windows: the views (the queries with no window must give the same rows)
VIEW_QUERIES = {
    "jct_daily": "SELECT day, n_jobs, avg_jct_s, max_jct_s FROM v_jct_daily ORDER BY day",
    "jct_by_type": "SELECT job_type, n_jobs, avg_jct_s, max_jct_s FROM v_jct_by_type ORDER BY job_type",
    "jct_by_owner": "SELECT owner, n_jobs, avg_jct_s, max_jct_s FROM v_jct_by_owner ORDER BY owner",
    "gpu_util_hourly": "SELECT hour, n_nodes, avg_gpu_util, gpu_mem_frac FROM v_gpu_util_hourly ORDER BY hour",
    "job_speed": "SELECT job_id, name, job_type, n_slots, avg_epochs_per_h, avg_predicted_epochs_per_h, "
                 "avg_speed_factor, min_speed_factor, avg_gpu_util, max_gpu_mem_gib, n_shared_slots "
                 "FROM v_job_speed ORDER BY job_id",
    "resizes_per_job": "SELECT job_id, name, owner, job_type, n_resize, n_relaunch, n_hot_scale "
                       "FROM v_resizes_per_job WHERE n_resize + n_relaunch + n_hot_scale > 0 ORDER BY job_id",
    "resizes_daily": "SELECT day, n_resize, n_relaunch, n_hot_scale, n_jobs FROM v_resizes_daily ORDER BY day",
    "decision_sources": "SELECT policy, source, n_decisions, share, avg_latency_ms FROM v_decision_sources "
                        "ORDER BY policy, source",
    "decisions_daily": "SELECT day, n_policy, n_fallback, avg_latency_ms FROM v_decisions_daily ORDER BY day",
    "fallback_reasons": "SELECT fallback_reason, n_decisions FROM v_fallback_reasons "
                        "ORDER BY n_decisions DESC, fallback_reason",
}


def test_with_no_window_the_reports_are_the_views(engine, windowed):
    assert set(VIEW_QUERIES) == set(queries())
    with engine.connect() as conn:
        for name, sql in VIEW_QUERIES.items():
            old = conn.execute(text(sql))
            new = execute(conn, name)
            assert new.columns == list(old.keys()), name
            expected = [dict(x) for x in old.mappings()]
            assert new.rows == expected, name
            assert conn.execute(text(queries()[name].sql)).mappings().all() == expected, name  # the NULL form


def test_days_and_hours_are_utc_whatever_the_session_time_zone(engine, windowed):
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":  # SQLite has no session time zone
            conn.execute(text("SET TIME ZONE 'Pacific/Kiritimati'"))  # UTC+14: every day would move
            conn.execute(text("SET DateStyle TO 'SQL, DMY'"))
        days = [x["day"] for x in run_report(conn, "decisions_daily", W)]
        hours = [x["hour"] for x in run_report(conn, "gpu_util_hourly", W)]
    assert days == ["2026-11-01", "2026-11-02"] and hours == ["2026-11-01 00:00", "2026-11-02 23:00"]


def test_the_advice_report_takes_the_jobs_that_finished_in_the_window(engine, windowed):
    a, b = windowed["a"], windowed["b"]
    with session_scope(engine) as s:
        slot = record_slot(s, 10, utc(2026, 10, 31, 20), [AllocationRecord(a, 1, 0), AllocationRecord(b, 1, 0)],
                           DecisionRecord("1" * 64, [], advice={"policy": "drf", "jobs": [[a, 2, 0, 0.002, 0.001],
                                                                                         [b, 1, 0, 0.001, 0.001]]}),
                           ended_at=utc(2026, 10, 31, 21))
        assert slot.id
    with session_scope(engine) as s:
        assert [x["job_id"] for x in advice_report(s)] == [a, b, None]
        assert [x["job_id"] for x in advice_report(s, D2, D3)] == [b, None]  # a finished on the 1st
        assert [x["job_id"] for x in advice_report(s, None, D2)] == [a, None]
        assert advice_report(s, D3, None) == []


def test_cli_report_window_json_and_header(db_url, windowed):
    r = CliRunner().invoke(report, ["--db", db_url, "--json", "-S", "2026-11-01", "-E", "2026-11-03T00:00"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["window"] == {"start": "2026-11-01T00:00:00+00:00", "end": "2026-11-03T00:00:00+00:00"}
    assert [x["n_jobs"] for x in data["jct_daily"]] == [2, 1]
    assert set(data) == {"window", *queries()}  # no advice rows here: not shown by default
    r = CliRunner().invoke(report, ["--db", db_url, "--json"])
    assert "window" not in json.loads(r.output)
    r = CliRunner().invoke(report, ["--db", db_url, "-S", "2026-11-01", "-E", "2026-11-03", "--only", "jct_by_owner"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "Window (UTC): from 2026-11-01 00:00:00 to 2026-11-03 00:00:00 (end excluded)"
    assert "carol" in r.output and "dave" not in r.output and "10,800.00" in r.output
