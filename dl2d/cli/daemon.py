"""`dl2ctl daemon status`: is the daemon alive, what did it do last.

Two sources: the daemon's status file (`<state dir>/dl2d.status.json`, rewritten after every slot: pid,
state, last slot, tick time, fallbacks, stale nodes, metrics URL) and the database (the last slot row and
its decision), so the command also works from a login node that only reaches the database.
Exit status: 0 running, 3 not running or stale (as `systemctl status`), 2 usage/config errors.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

STALE_FACTOR = 3.0  # a status older than 3 slots (or 3 slot-lengths of wall time) is stale

#: The most of the daemon's status file read (a few KB a node; any file in the state dir could be put there)
STATUS_FILE_BYTES = 64 << 20


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def assess(status: dict[str, Any] | None, now: float, same_host: bool = True) -> tuple[str, str]:
    """(verdict, why) from the status file: running | stopped | stale | unknown. Pure but for the pid check."""
    if status is None:
        return "unknown", "no status file"
    if status.get("state") == "stopped":
        return "stopped", "the daemon stopped cleanly"
    pid = status.get("pid")
    if same_host and isinstance(pid, int) and not _pid_alive(pid):
        return "stopped", f"process {pid} is gone (killed or crashed)"
    age = now - float(status.get("updated_at") or 0)
    slot = float(status.get("slot_seconds") or 1200)
    if age > STALE_FACTOR * slot + 60:
        return "stale", f"no slot finished for {age:.0f} s (slot length {slot:g} s)"
    return "running", f"last update {age:.0f} s ago"


def _db_summary(url: str) -> dict[str, Any]:
    from dl2d.db.engine import make_engine, session_scope
    from dl2d.db.events import count_events, last_event
    from dl2d.db.intents import count_pending_intents
    from dl2d.db.jobs import count_jobs_by_state
    from dl2d.db.models import DecisionSource, EventKind, JobState
    from dl2d.db.slots import count_decisions, last_slot

    engine = make_engine(url)
    try:
        with session_scope(engine) as s:
            last = last_slot(s)
            jobs = count_jobs_by_state(s)
            out = {"jobs": {st.value: jobs[st] for st in JobState if jobs.get(st)},
                   "pending_intents": count_pending_intents(s),
                   "fallback_slots": count_decisions(s, DecisionSource.FALLBACK)}
            if last is not None:
                out["last_slot"] = {"number": last.number, "started_at": last.started_at.isoformat(),
                                    "ended_at": last.ended_at.isoformat() if last.ended_at else None,
                                    "reward": last.reward, "duration_ms": last.duration_ms,
                                    "source": last.decision.source.value if last.decision else None}
            reverts = count_events(s, [EventKind.POLICY_REVERT])
            if reverts:  # the online learner put back to its last good parameters (docs/daemon.md)
                ev = last_event(s, EventKind.POLICY_REVERT)
                out["policy_reverts"] = reverts
                out["last_policy_revert"] = {"at": ev.ts.isoformat(), **(ev.detail or {})}
            return out
    finally:
        engine.dispose()


@click.group("daemon")
def daemon() -> None:
    """Inspect the dl2d daemon."""


@daemon.command("status")
@click.option("--state-dir", envvar="DL2D_STATE_DIR", default=None,
              help="The daemon's state directory (default: from the config file, else /var/lib/dl2d).")
@click.option("--db", "db_url", envvar="DL2D_DB_URL", metavar="URL", help="Database URL (default: as dl2ctl report).")
@click.option("--config", "config_path", envvar="DL2D_CONFIG", default="/etc/dl2d/dl2d.toml", show_default=True,
              help="The daemon's config file (read for state_dir / db_url when present).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(state_dir: str | None, db_url: str | None, config_path: str, as_json: bool) -> None:
    """Whether the daemon runs, its last slot, jobs by state and pending journal intents."""
    from dl2d.cli.dbconn import load_config, resolve_db_url, state_dir_of

    cfg: dict[str, Any] = {} if os.path.exists(config_path) and not os.access(config_path, os.R_OK) \
        else load_config(config_path)
    env = {**os.environ, **({"DL2D_STATE_DIR": state_dir} if state_dir else {})}
    state_dir = state_dir_of(env, cfg)
    url = resolve_db_url(db_url, env, cfg)  # the same rule as every dl2ctl command
    path = Path(state_dir) / "dl2d.status.json"
    from dl2d.core.files import InputFileError, read_bounded

    try:
        st = json.loads(read_bounded(path, STATUS_FILE_BYTES))
    except InputFileError as e:
        if not e.missing:
            raise click.ClickException(f"cannot read {e}") from None
        st = None
    except ValueError as e:
        raise click.ClickException(f"cannot read {path}: {e}") from None
    verdict, why = assess(st, time.time())
    out: dict[str, Any] = {"status": verdict, "why": why, "status_file": str(path), "daemon": st}
    try:
        out["database"] = _db_summary(url)
    except Exception as e:  # the DB may be unreachable from here: say so, still report the file
        out["database"] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
    if as_json:
        click.echo(json.dumps(out, indent=1, default=str))
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"dl2d: {verdict} ({why})", show_header=False)
        t.add_column("key")
        t.add_column("value")
        for k in ("pid", "backend", "policy", "slot", "last_tick_ms", "last_source", "fallbacks", "stale_nodes",
                  "policy_version", "metrics_url", "db_url"):
            if st and st.get(k) is not None:
                t.add_row(k, str(st[k]))
        db = out["database"]
        for k, v in db.items():
            t.add_row(f"db.{k}", json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v))
        Console().print(t)
    raise SystemExit(0 if verdict == "running" else 3)
