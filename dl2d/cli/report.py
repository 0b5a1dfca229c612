"""`dl2ctl report`: the SQL reports of dl2d/db/report.sql as tables (or JSON)."""
from __future__ import annotations

import json
import os
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import click


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:,.2f}"
    return str(v)


def _json_default(v: Any) -> Any:
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, (date, datetime)):
        return v.isoformat()
    return str(v)


@click.command()
@click.option("--db", "db_url", metavar="URL",
              help="Database URL [default: as dl2ctl queue: $DL2D_DB_URL, else the db_url of $DL2D_CONFIG or "
                   "/etc/dl2d/dl2d.toml, else <$DL2D_STATE_DIR or /var/lib/dl2d>/dl2d.sqlite].")
@click.option("--json", "as_json", is_flag=True,
              help='Print all reports as one JSON object (with -S/-E, also "window": {"start": ..., "end": ...}).')
@click.option("--only", "names", multiple=True, metavar="NAME", help="Only these reports (repeatable).")
@click.option("-S", "--start", metavar="TIME",
              help="Only what happened at or after TIME (UTC): YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS], now, now-7days, "
                   "now-12hours [default: no bound].")
@click.option("-E", "--end", metavar="TIME", help="Only what happened before TIME (same forms) [default: no bound].")
def report(db_url: str | None, as_json: bool, names: tuple[str, ...], start: str | None, end: str | None) -> None:
    """Job completion times, GPU utilisation, resizes and policy vs fallback decisions; in advise mode, each job's
    predicted JCT under what ran and under the policy's advice (report `advice`).

    With -S/-E (like sreport's) each report counts what happened in the window [start, end): the JCT and
    advice reports the jobs that finished in it, gpu_util_hourly the node samples, job_speed the slots that
    started in it, the resize reports the events and the decision reports the decisions."""
    from datetime import datetime, timezone

    from dl2d.db import advice
    from dl2d.db.engine import make_engine
    from dl2d.db.report import Query, ReportResult, Window, execute, parse_time, queries

    now = datetime.now(timezone.utc)  # one `now` for both bounds
    bounds = {}
    for key, hint, value in (("start", "-S/--start", start), ("end", "-E/--end", end)):
        try:
            bounds[key] = None if value is None else parse_time(value, now)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint=hint) from None
    try:
        window = Window(**bounds)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="-S/--start and -E/--end") from None
    known = {**queries(), advice.NAME: Query(advice.NAME, advice.DESCRIPTION, "")}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise click.BadParameter(f"unknown report(s) {unknown}; known: {', '.join(known)}", param_hint="--only")
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from dl2d.cli.dbconn import resolve_db_url, user_config

    url = resolve_db_url(db_url, os.environ, user_config())  # one resolution for every command
    try:
        u = make_url(url)
    except ArgumentError as e:
        raise click.ClickException(f"invalid database URL {url!r}: {e}") from None
    if u.get_backend_name() == "sqlite" and u.database and not os.path.exists(u.database):
        raise click.ClickException(f"no database at {u.database} (give --db URL)")
    try:
        engine = make_engine(url)
    except Exception as e:  # an unknown dialect, a missing driver
        raise click.ClickException(f"cannot open the database {u.render_as_string()}: {e}") from None
    try:
        from sqlalchemy.orm import Session

        with engine.connect() as conn:
            results = [execute(conn, n, window) for n in (names or known) if n != advice.NAME]
        if advice.NAME in (names or known):
            with Session(engine) as s:
                rows = advice.advice_report(s, window.start, window.end)
            if rows or advice.NAME in names:  # shown by default only where the daemon ran in advise mode
                results.append(ReportResult(known[advice.NAME], advice.COLUMNS, rows))
    except DBAPIError as e:
        raise click.ClickException(f"cannot read the reports from {u.render_as_string()}: {e.orig}") from e
    finally:
        engine.dispose()

    if as_json:
        out = {"window": window.as_json()} if window.bounded else {}  # the window only when one is given
        out.update({r.query.name: r.rows for r in results})
        click.echo(json.dumps(out, indent=2, default=_json_default))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if window.bounded:
        console.print(window.describe(), markup=False, highlight=False)
    for r in results:
        table = Table(title=f"{r.query.name}: {r.query.description}", title_justify="left")
        for c in r.columns:
            table.add_column(c, justify="left" if c in _TEXT_COLUMNS else "right")
        for row in r.rows:
            table.add_row(*(_cell(row[c]) for c in r.columns))
        console.print(table)


_TEXT_COLUMNS = {"day", "hour", "job_type", "owner", "name", "source", "fallback_reason", "policy"}

