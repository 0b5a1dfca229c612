"""Run the reports of `report.sql` (the same file users run with sqlite3/psql) and return rows."""
from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    sql: str


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


def execute(bind: Session | Connection | Engine, name: str) -> ReportResult:
    """Run the report `name` of report.sql."""
    q = queries()[name]
    with _connection(bind) as conn:
        result = conn.execute(text(q.sql))
        return ReportResult(q, list(result.keys()), [dict(r) for r in result.mappings()])


def run_report(bind: Session | Connection | Engine, name: str) -> list[dict[str, Any]]:
    """Rows of one report as dicts (column name -> value)."""
    return execute(bind, name).rows


def run_all(bind: Session | Connection | Engine) -> dict[str, list[dict[str, Any]]]:
    with _connection(bind) as conn:
        return {name: run_report(conn, name) for name in queries()}
