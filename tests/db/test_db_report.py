from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner
from testkit.db import submission

from dl2d.cli.report import report
from dl2d.db.engine import session_scope
from dl2d.db.events import record_event
from dl2d.db.jobs import submit_job
from dl2d.db.models import Job, JobState
from dl2d.db.report import parse_report_sql, run_all
from dl2d.db.samples import insert_node_samples
from dl2d.db.slots import AllocationRecord, DecisionRecord, record_slot


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
