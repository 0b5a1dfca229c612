"""`dl2ctl nodes`: the cluster's nodes as the daemon sees them, like `sinfo -N -l`.

Each node's GPUs, CPUs and memory allocated (by the daemon's last slot, and GPUs held by Slurm jobs that are not
dl2d's) out of its capacity, its state in Slurm's words (idle, mixed, allocated, drained, with the drain reason)
and its node agent's health (ok, missed N polls, stale; `-` where no agent is configured). Asked of the running
daemon over its control socket (any user may); when none answers, read from its status file where this user may
(as the last slot left it).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

import click

NODE_STATES = ("idle", "mixed", "allocated", "drained")
HEADINGS = ("NODE", "STATE", "GPUS", "CPUS", "MEM_GB", "AGENT", "REASON")
RIGHT = (False, False, True, True, True, False, False)


def _n(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _reason(node: dict[str, Any]) -> str:
    """The node's reason, and the GPUs that Slurm jobs not dl2d's hold there (counted in its GPUS)."""
    other = int(node.get("gpus_other") or 0)
    held = f"{other} GPU{'s' if other != 1 else ''} held by other Slurm jobs" if other else ""
    return "; ".join(x for x in (node.get("reason") or "", held) if x)


def node_lines(nodes: Sequence[dict[str, Any]], header: bool = True) -> list[str]:
    """The table: allocated/total per resource (GPUs: dl2d's and other Slurm jobs', as Slurm counts them)."""
    from dl2d.cli.jobs import format_table

    rows = [(n["name"], n["state"], f"{n['gpus_alloc'] + n.get('gpus_other', 0)}/{n['gpus']}",
             f"{_n(n['cpus_alloc'])}/{_n(n['cpus'])}", f"{_n(n['mem_gb_alloc'])}/{_n(n['mem_gb'])}",
             n.get("agent") or "-", _reason(n)) for n in nodes]
    return format_table(HEADINGS, rows, RIGHT, header)


def _status(state_dir: str | None) -> tuple[dict[str, Any], str | None]:
    """(the daemon's status, a note when it comes from the file of a daemon that does not answer)."""
    from dl2d.cli.dbconn import resolve_socket, state_dir_of, user_config
    from dl2d.daemon.control import NoDaemon, ask

    config = user_config()
    socket = resolve_socket(None, os.environ, config)
    try:
        reply = ask(socket, {"op": "status"})
    except NoDaemon as e:
        path = Path(state_dir or state_dir_of(os.environ, config)) / "dl2d.status.json"
        from dl2d.cli.daemon import STATUS_FILE_BYTES
        from dl2d.core.files import InputFileError, read_bounded

        try:
            doc = json.loads(read_bounded(path, STATUS_FILE_BYTES))
        except InputFileError as err:
            if err.missing:
                raise click.ClickException(f"{e}, and there is no status file at {path}: is dl2d running here? "
                                           "(DL2D_SOCKET or --state-dir name another)") from None
            raise click.ClickException(f"{e}, and its status file cannot be read: {err}") from None
        except ValueError as err:
            raise click.ClickException(f"{e}, and its status file {path} cannot be read: {err}") from None
        age = time.time() - float(doc.get("updated_at") or 0)
        return doc, f"dl2d does not answer on {socket}: nodes as its status file had them {age:.0f} s ago"
    except ConnectionError as e:
        raise click.ClickException(str(e)) from None
    if not reply.get("ok"):
        raise click.ClickException(f"dl2d refused: {reply.get('error')}")
    return reply.get("status") or {}, None


@click.command()
@click.option("--state", "-t", "states", multiple=True, metavar="STATE",
              help="Only nodes in these states (repeatable or comma-separated: " + ", ".join(NODE_STATES) + ").")
@click.option("--noheader", "-H", is_flag=True, help="No header line (as sinfo --noheader).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option("--state-dir", metavar="DIR", help="Where to read the status file when no daemon answers "
              "[default: $DL2D_STATE_DIR, the config's state_dir, else /var/lib/dl2d].")
def nodes(states: tuple[str, ...], noheader: bool, as_json: bool, state_dir: str | None) -> None:
    """List the nodes like sinfo -N -l: GPUs, CPUs and memory allocated/total, state, agent health."""
    wanted = [p.strip().lower() for v in states for p in v.split(",") if p.strip()]
    bad = [w for w in wanted if w not in NODE_STATES]
    if bad:
        raise click.BadParameter(f"unknown node state(s) {', '.join(map(repr, bad))}; known: {', '.join(NODE_STATES)}",
                                 param_hint="--state")
    status, note = _status(state_dir)
    rows = [n for n in status.get("nodes") or [] if not wanted or n.get("state") in wanted]
    if note:
        click.echo(note, err=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif rows:
        click.echo("\n".join(node_lines(rows, header=not noheader)))
    elif not status.get("nodes"):
        click.echo("no nodes yet: the daemon lists them after its first slot", err=True)
