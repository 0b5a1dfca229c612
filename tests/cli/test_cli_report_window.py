"""`dl2ctl report -S/--start, -E/--end` (like sreport's): the time parser, the window, and the command's errors
and relative times (SQLite; tests/db/test_db_report.py runs the windows on SQLite and PostgreSQL)."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from testkit.db import submission

from dl2d.db.engine import session_scope
from dl2d.db.jobs import submit_job
from dl2d.db.models import JobState
from dl2d.db.report import Window, parse_time

NOW = datetime(2026, 11, 20, 15, 30, 45, tzinfo=timezone.utc)


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


@pytest.mark.parametrize("value, expected", [
    ("2026-11-01", utc(2026, 11, 1)),
    ("2026-11-01T13:05", utc(2026, 11, 1, 13, 5)),
    ("2026-11-01T13:05:09", utc(2026, 11, 1, 13, 5, 9)),
    ("2026-11-01 13:05", utc(2026, 11, 1, 13, 5)),
    (" now ", NOW),
    ("NOW", NOW),
    ("now-7days", NOW - timedelta(days=7)),
    ("now-12hours", NOW - timedelta(hours=12)),
    ("now-1day", NOW - timedelta(days=1)),
    ("now+2weeks", NOW + timedelta(weeks=2)),
    ("now-90minutes", NOW - timedelta(minutes=90)),
    ("now-30min", NOW - timedelta(minutes=30)),
    ("now-3600", NOW - timedelta(hours=1)),  # sreport: seconds by default
    ("now-5s", NOW - timedelta(seconds=5)),
])
def test_parse_time(value, expected):
    got = parse_time(value, NOW)
    assert got == expected and got.tzinfo == timezone.utc


def test_parse_time_takes_a_naive_now_as_utc():
    assert parse_time("now-1h", datetime(2026, 1, 2, 3)) == utc(2026, 1, 2, 2)


@pytest.mark.parametrize("value, message", [
    ("yesterdayish", "'yesterdayish' is not a time: give YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] (UTC) or now["),
    ("2026-13-01", "'2026-13-01' is not a valid time: month must be in 1..12"),
    ("2026-02-30", "'2026-02-30' is not a valid time: day is out of range for month"),
    ("2026-11-01T25:00", "'2026-11-01T25:00' is not a valid time: hour must be in 0..23"),
    ("2026-11-1", "'2026-11-1' is not a time"),
    ("2026-11-01T13", "'2026-11-01T13' is not a time"),
    ("2026-11-01T13:05+02:00", "is not a time"),
    ("now-7fortnights", "'now-7fortnights': unknown unit 'fortnights' (give seconds, minutes, hours, days or weeks)"),
    ("now-m", "is not a time"),
    ("now-99999999999999days", "'now-99999999999999days' is out of range"),
    ("now-\u0663days", "is not a time"),  # an Arabic-Indic digit is not a count
    ("", "'' is not a time"),
])
def test_parse_time_errors_name_the_value(value, message):
    with pytest.raises(ValueError) as e:
        parse_time(value, NOW)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_window_is_half_open_and_says_what_it_is():
    w = Window(utc(2026, 11, 1), utc(2026, 11, 2, 12))
    assert w.bounded and not Window().bounded
    assert w.describe() == "Window (UTC): from 2026-11-01 00:00:00 to 2026-11-02 12:00:00 (end excluded)"
    assert Window(start=utc(2026, 11, 1)).describe() == "Window (UTC): from 2026-11-01 00:00:00"
    assert Window(end=utc(2026, 11, 1)).describe() == "Window (UTC): before 2026-11-01 00:00:00"
    assert w.as_json() == {"start": "2026-11-01T00:00:00+00:00", "end": "2026-11-02T12:00:00+00:00"}
    assert Window(end=utc(2026, 11, 1)).as_json() == {"start": None, "end": "2026-11-01T00:00:00+00:00"}
    assert Window(datetime(2026, 11, 1)).start == utc(2026, 11, 1)  # naive: UTC
    for start, end in ((utc(2026, 11, 2), utc(2026, 11, 1)), (utc(2026, 11, 1), utc(2026, 11, 1))):
        with pytest.raises(ValueError, match=r"^the start 2026-11-0\d 00:00:00 is not before the end 2026-11-01 "
                                             r"00:00:00 \(UTC\)$"):
            Window(start, end)


def _error_only(r, *needles: str) -> str:
    """The command failed as a usage error with one `Error:` line holding ``needles``, and printed no report."""
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, r.output
    assert all(n in errors[0] for n in needles), r.output
    assert "Traceback" not in r.output and "jct_" not in r.output and "Window" not in r.output, r.output
    assert r.output.rstrip().splitlines()[-1] == errors[0]
    return errors[0]


@pytest.mark.parametrize("args, needles", [
    (["-S", "yesterdayish"], ["-S/--start", "'yesterdayish' is not a time"]),
    (["--start", "now-2parsecs"], ["-S/--start", "'now-2parsecs': unknown unit 'parsecs'"]),
    (["-E", "2026-11-31"], ["-E/--end", "'2026-11-31' is not a valid time"]),
    (["-S", "2026-11-01", "--end", "tomorrowish"], ["-E/--end", "'tomorrowish'"]),
    (["-S", "2026-11-03", "-E", "2026-11-01"],
     ["-S/--start and -E/--end", "the start 2026-11-03 00:00:00 is not before the end 2026-11-01 00:00:00"]),
    (["-S", "2026-11-01T12:00", "-E", "2026-11-01 12:00:00"], ["-S/--start and -E/--end", "is not before"]),
    (["-S", "now", "-E", "now-1day"], ["-S/--start and -E/--end", "is not before"]),
])
def test_bad_times_are_one_usage_error_naming_the_option(dl2ctl, args, needles):
    # the database does not exist: the times are checked first
    _error_only(dl2ctl("report", *args), *needles)


@pytest.fixture
def recent_jobs(engine):
    """alice finished 2 days ago, bob 10 days ago, carol 1 hour ago (JCT 1 h each), all relative to now."""
    now = datetime.now(timezone.utc)
    with session_scope(engine) as s:
        for owner, ago in (("alice", timedelta(days=2)), ("bob", timedelta(days=10)), ("carol", timedelta(hours=1))):
            job = submit_job(s, submission(name=owner, owner=owner), now=now - ago - timedelta(hours=1))
            job.state, job.finished_at = JobState.COMPLETED, now - ago


def _owners(r) -> list[tuple[str, int]]:
    assert r.exit_code == 0, r.output
    return [(x["owner"], x["n_jobs"]) for x in json.loads(r.output)["jct_by_owner"]]


def test_relative_windows(dl2ctl, recent_jobs):
    assert _owners(dl2ctl("report", "--json", "--only", "jct_by_owner")) == [("alice", 1), ("bob", 1), ("carol", 1)]
    assert _owners(dl2ctl("report", "--json", "--only", "jct_by_owner", "-S", "now-7days")) == [
        ("alice", 1), ("carol", 1)]
    assert _owners(dl2ctl("report", "--json", "--only", "jct_by_owner", "-S", "now-12hours")) == [("carol", 1)]
    assert _owners(dl2ctl("report", "--json", "--only", "jct_by_owner", "-E", "now-7days")) == [("bob", 1)]
    assert _owners(dl2ctl("report", "--json", "--only", "jct_by_owner", "-S", "now-7days", "-E", "now-1day")) == [
        ("alice", 1)]
    assert _owners(dl2ctl("report", "--json", "--only", "jct_by_owner", "-S", "now")) == []


def test_an_absolute_start_and_now_as_the_end(dl2ctl, recent_jobs):  # as docs/cli.md's example
    day = (datetime.now(timezone.utc) - timedelta(days=5)).strftime("%Y-%m-%d")  # alice and carol after it
    r = dl2ctl("report", "-S", day, "-E", "now", "--only", "jct_by_owner")
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert first.startswith(f"Window (UTC): from {day} 00:00:00 to ") and first.endswith(" (end excluded)")
    assert "alice" in r.output and "carol" in r.output and "bob" not in r.output and "3,600.00" in r.output
    r = dl2ctl("report", "--json", "-S", day, "-E", "now", "--only", "jct_by_owner")
    data = json.loads(r.output)
    assert list(data) == ["window", "jct_by_owner"] and data["window"]["start"] == f"{day}T00:00:00+00:00"
    assert datetime.fromisoformat(data["window"]["end"]) <= datetime.now(timezone.utc)
    assert [x["owner"] for x in data["jct_by_owner"]] == ["alice", "carol"]
