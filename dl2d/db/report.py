"""Run the reports of `report.sql` (the same file users run with sqlite3/psql) and return rows.

A report may be limited to a time window [start, end) (`dl2ctl report -S/-E`, like Slurm's `sreport`): the
queries bind it as ``:start``/``:end`` (NULL: no bound). :func:`parse_time` reads what sreport users type and
:class:`Window` checks and describes a window; both are pure.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import cache
from importlib import resources
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.orm import Session

from dl2d.db.models import UTCDateTime

# the window's bounds in report.sql (psql and sqlite3 syntax too); not after a ':' (a PostgreSQL ::cast)
_WINDOW_PARAM = re.compile(r"(?<![:\w]):(start|end)\b")


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    source: str  # as in report.sql: may bind the window's bounds :start and :end

    @property
    def sql(self) -> str:
        """The query over all the rows (no window: its bounds as NULL), runnable as is."""
        return _WINDOW_PARAM.sub("NULL", self.source)

    @property
    def params(self) -> list[str]:
        """The window's bounds that the query binds."""
        return sorted(set(_WINDOW_PARAM.findall(self.source)))


def parse_report_sql(source: str) -> dict[str, Query]:
    """Split report.sql into its `-- name:` blocks (the comment lines after the name are the description)."""
    queries: dict[str, Query] = {}
    parts = re.split(r"^-- name:[ \t]*(\S+)[ \t]*$", source, flags=re.M)
    for name, rest in zip(parts[1::2], parts[2::2]):
        desc, sql = [], []
        for line in rest.splitlines():
            if line.startswith("--") and not sql:
                desc.append(line.lstrip("- ").strip())
            elif line.strip():
                sql.append(line)
        queries[name] = Query(name, " ".join(desc), "\n".join(sql).strip().rstrip(";"))
    return queries


@cache
def queries() -> dict[str, Query]:
    return parse_report_sql(resources.files("dl2d.db").joinpath("report.sql").read_text())


@dataclass(frozen=True)
class ReportResult:
    query: Query
    columns: list[str]
    rows: list[dict[str, Any]]


@contextmanager
def _connection(bind: Session | Connection | Engine) -> Iterator[Session | Connection]:
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            yield conn
    else:
        yield bind


def execute(bind: Session | Connection | Engine, name: str, window: Window | None = None) -> ReportResult:
    """Run the report `name` of report.sql over the rows in `window` (None: all).

    On PostgreSQL the transaction's time zone and DateStyle are set to UTC and ISO first (SET LOCAL): the
    reports' days and hours are the timestamps' text (see report.sql)."""
    q, w = queries()[name], window or Window()
    stmt = text(q.source).bindparams(*(bindparam(p, type_=UTCDateTime()) for p in q.params))
    with _connection(bind) as conn:
        dialect = (conn.get_bind() if isinstance(conn, Session) else conn).dialect.name
        if dialect == "postgresql":
            conn.execute(text("SET LOCAL TIME ZONE 'UTC'"))
            conn.execute(text("SET LOCAL DateStyle TO ISO"))
        result = conn.execute(stmt, {"start": w.start, "end": w.end} if q.params else {})
        return ReportResult(q, list(result.keys()), [dict(r) for r in result.mappings()])


def run_report(bind: Session | Connection | Engine, name: str, window: Window | None = None) -> list[dict[str, Any]]:
    """Rows of one report as dicts (column name -> value)."""
    return execute(bind, name, window).rows


def run_all(bind: Session | Connection | Engine, window: Window | None = None) -> dict[str, list[dict[str, Any]]]:
    with _connection(bind) as conn:
        return {name: run_report(conn, name, window) for name in queries()}


# --- time windows (pure) ---

_UNITS = {"s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
          "min": 60, "mins": 60, "minute": 60, "minutes": 60,
          "h": 3600, "hour": 3600, "hours": 3600,
          "d": 86400, "day": 86400, "days": 86400,
          "w": 604800, "week": 604800, "weeks": 604800}
_RELATIVE = re.compile(r"now(?:([+-])(\d+)([a-z]*))?", re.I | re.A)
_ABSOLUTE = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?)?", re.A)
TIME_FORMATS = "YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] (UTC) or now[-N{days|hours|minutes|seconds|weeks}]"


def parse_time(value: str, now: datetime) -> datetime:
    """A time as sreport's -S/-E take it -> an aware UTC datetime: ``YYYY-MM-DD`` (midnight),
    ``YYYY-MM-DDTHH:MM[:SS]`` (UTC; a space for the T too), ``now``, ``now-7days``, ``now+2hours``, ``now-3600``
    (seconds; units: s/sec/second(s), min/minute(s), h/hour(s), d/day(s), w/week(s)). ``now`` is taken as UTC
    if naive. ValueError (one line, naming the value) otherwise."""
    v = value.strip()
    if m := _RELATIVE.fullmatch(v):
        sign, count, unit = m.groups()
        base = (now if now.tzinfo else now.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
        if sign is None:
            return base
        seconds = _UNITS.get(unit.lower() or "s")
        if seconds is None:
            raise ValueError(f"{value!r}: unknown unit {unit!r} (give seconds, minutes, hours, days or weeks)")
        try:
            return base + (1 if sign == "+" else -1) * timedelta(seconds=int(count) * seconds)
        except OverflowError:
            raise ValueError(f"{value!r} is out of range") from None
    if m := _ABSOLUTE.fullmatch(v):
        try:
            return datetime(*(int(g) for g in m.groups() if g is not None), tzinfo=timezone.utc)
        except ValueError as e:
            raise ValueError(f"{value!r} is not a valid time: {e}") from None
    raise ValueError(f"{value!r} is not a time: give {TIME_FORMATS}")


@dataclass(frozen=True)
class Window:
    """The half-open interval [start, end) of UTC times a report covers; None: no bound (naive: UTC)."""
    start: datetime | None = None
    end: datetime | None = None

    def __post_init__(self) -> None:
        for k in ("start", "end"):
            t = getattr(self, k)
            if t is not None and t.tzinfo is None:
                object.__setattr__(self, k, t.replace(tzinfo=timezone.utc))
        if self.start is not None and self.end is not None and self.start >= self.end:
            raise ValueError(f"the start {_show(self.start)} is not before the end {_show(self.end)} (UTC)")

    @property
    def bounded(self) -> bool:
        return self.start is not None or self.end is not None

    def describe(self) -> str:
        """One line for the report header."""
        if self.start is not None and self.end is not None:
            return f"Window (UTC): from {_show(self.start)} to {_show(self.end)} (end excluded)"
        if self.start is not None:
            return f"Window (UTC): from {_show(self.start)}"
        if self.end is not None:
            return f"Window (UTC): before {_show(self.end)}"
        return "Window: all"

    def as_json(self) -> dict[str, str | None]:
        return {k: None if t is None else t.astimezone(timezone.utc).isoformat()
                for k, t in (("start", self.start), ("end", self.end))}


def _show(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
