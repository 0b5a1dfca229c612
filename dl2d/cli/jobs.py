"""`dl2ctl submit`, `queue`, `show JOB` and `cancel JOB...`: the user's job commands.

`submit` and `cancel` ask the daemon over its control socket, which decides the caller's rights (see
`dl2d.cli.dbconn` for how the socket and the database are found, and when they write the database directly):
`submit` inserts a PENDING job that the daemon picks up at its next slot, `cancel` marks a job CANCELLED (and
journals a `cancel` intent when it holds a Slurm allocation) for the daemon to carry out. `queue` and `show`
read the database. The functions that turn rows
into table/JSON records are pure; the click commands are thin shells around them and the repository
functions of `dl2d.db` (`jobs`, `events`, `slots`).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from dl2d.cli.dbconn import Ctx, _shown, daemon_view, db_command
from dl2d.core.jobs import LAUNCHES
from dl2d.daemon.slurm.jobdir import JobDir
from dl2d.db.jobs import _iso, job_record
from dl2d.db.models import ACTIVE_STATES, JobState

STATE_NAMES = [s.value for s in JobState]


# --------------------------------------------------------------------------------------------------
# pure formatting


def format_age(seconds: float) -> str:
    """A compact age: 45s, 12m, 3h05m, 2d04h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else round(float(x), 2)


def _n(x: Any) -> Any:
    return _num(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x


#: Slurm's short job state codes (squeue's ST), accepted by --state and shown by queue.
STATE_CODES = {"PENDING": "PD", "RUNNING": "R", "COMPLETED": "CD", "FAILED": "F", "CANCELLED": "CA"}

#: queue's columns: name -> (heading, right-aligned, value of a job record). The default set is squeue's shape.
QUEUE_FIELDS: dict[str, tuple[str, bool, Any]] = {
    "id": ("ID", True, lambda r: str(r["id"])),
    "name": ("NAME", False, lambda r: r["name"]),
    "owner": ("OWNER", False, lambda r: r["owner"]),
    "type": ("TYPE", False, lambda r: r["job_type"]),
    "st": ("ST", False, lambda r: STATE_CODES.get(r["state"], r["state"])),
    "state": ("STATE", False, lambda r: r["state"]),
    "workers": ("WORKERS", True, lambda r: str(r["workers"])),
    "ps": ("PS", True, lambda r: str(r["ps"])),
    "epochs": ("EPOCHS", True, lambda r: f"{_num(r['epochs_done'])}/{_num(r['total_epochs'])}"),
    "age": ("AGE", True, lambda r: format_age(r["age_s"])),
    "slurm": ("SLURM", False, lambda r: r["slurm_job_id"] or ""),
    "reason": ("REASON", False, lambda r: (r.get("reason") or "").split(":")[0]),
    "reason_full": ("REASON", False, lambda r: r.get("reason") or ""),
}
QUEUE_DEFAULT = ("id", "name", "owner", "type", "st", "workers", "ps", "epochs", "age", "slurm", "reason")


def parse_format(value: str | None) -> list[str]:
    """--format: comma-separated QUEUE_FIELDS names, any case; None: the default columns."""
    if not value:
        return list(QUEUE_DEFAULT)
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in QUEUE_FIELDS]
    if bad or not names:
        raise click.BadParameter(f"unknown column(s) {', '.join(map(repr, bad)) or 'none given'}; known: "
                                 f"{', '.join(QUEUE_FIELDS)}", param_hint="--format")
    return names


def format_table(headings: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[bool],
                 header: bool = True) -> list[str]:
    """Plain columns two spaces apart, each as wide as its widest cell: nothing cut, nothing wrapped, whatever the
    terminal (squeue's shape; pipes and `cut`/`awk` see whole fields). The last column is not padded."""
    rows = [list(r) for r in rows]
    table = ([list(headings)] if header else []) + rows
    if not table:
        return []
    widths = [max(len(r[i]) for r in table) for i in range(len(headings))]
    out = []
    for r in table:
        cells = [(c.rjust(w) if rt else c.ljust(w)) for c, w, rt in zip(r, widths, right)]
        if not right[-1]:
            cells[-1] = r[-1]
        out.append("  ".join(cells).rstrip())
    return out


def queue_lines(recs: Sequence[dict[str, Any]], columns: Sequence[str], header: bool = True) -> list[str]:
    """`queue`'s table of job records in ``columns`` (QUEUE_FIELDS names)."""
    fields = [QUEUE_FIELDS[c] for c in columns]
    return format_table([f[0] for f in fields], ([f[2](r) for f in fields] for r in recs), [f[1] for f in fields],
                        header)


def pending_reason(rec: dict[str, Any], reasons: dict[int, str]) -> str | None:
    """Why a pending job waits (the daemon's reason from the last slot); None for a job that is not pending."""
    if rec["state"] != JobState.PENDING.value:
        return None
    return reasons.get(rec["id"], "Submitted: no slot has decided on it yet (the daemon's next slot will)")


def parse_states(values: Iterable[str]) -> list[JobState]:
    """--state values (repeatable, comma-separated, any case; Slurm's codes PD, R, CD, F, CA; `active` = every
    non-finished state)."""
    by_code = {code: name for name, code in STATE_CODES.items()}
    out: list[JobState] = []
    for v in values:
        for part in v.split(","):
            p = part.strip().upper()
            if not p:
                continue
            p = by_code.get(p, p)
            if p == "ACTIVE":
                out.extend(s for s in ACTIVE_STATES if s not in out)
            elif p in STATE_NAMES:
                if JobState(p) not in out:
                    out.append(JobState(p))
            else:
                raise click.BadParameter(f"unknown state {part.strip()!r}; known: {', '.join(STATE_NAMES)} (or "
                                         f"{', '.join(by_code)}), active", param_hint="--state")
    return out


def resize_records(rows: Iterable[tuple[int, datetime, int, int, int, int]]) -> list[dict[str, Any]]:
    """(slot number, slot start, prev_workers, prev_ps, workers, ps) rows -> the changes, in slot order."""
    out = []
    for number, started, pw, pps, w, ps in sorted(rows, key=lambda r: r[0]):
        if (pw, pps) != (w, ps):
            out.append({"slot": number, "at": _iso(started), "workers_from": pw, "workers_to": w,
                        "ps_from": pps, "ps_to": ps})
    return out


def output_file(slurm_state_dir: str | Path, job_id: int, slurm_job_id: str | None) -> str | None:
    """Where Slurm writes the output of the job's latest run (its batch script's ``--output``, in the job's own
    directory: dl2d.daemon.slurm.jobdir); None for a job that never reached Slurm. A failed job's reason is
    often only Slurm's (``NonZeroExitCode``): its output says why."""
    if not slurm_job_id:
        return None
    pattern = JobDir(Path(slurm_state_dir) / "jobs" / str(int(job_id))).output_pattern
    return str(pattern).replace("%j", str(slurm_job_id))


def no_daemon_note(reason: str, url: str, what: str) -> str:
    """What dl2ctl tells a user whose write went to the database because no daemon answered: the write is real,
    but nothing acts on it until a daemon runs."""
    return (f"note: {reason}: {what} written to the database {_shown(url)} directly; it waits there until dl2d "
            "starts, which acts on it at its first slot")


def _detail_text(detail: dict[str, Any] | None) -> str:
    if not detail:
        return ""
    return " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in detail.items())


# --------------------------------------------------------------------------------------------------
# submit


def _submit_flags(f: Any) -> Any:
    opts = [
        click.option("-J", "--job-name", help="Job name (as sbatch -J): letters, digits, '.', '_', '-'."),
        click.option("--arch", type=click.Choice(["allreduce", "ps"]),
                     help="How the job trains: allreduce (DDP, FSDP, JAX: workers only) or ps (parameter "
                          "servers) [default: ps for a DL2 type or a job given PS demands, else allreduce]."),
        click.option("--type", "job_type", metavar="MODEL",
                     help="The model: any name for an all-reduce job (bert, cifar10, deepspeech2, imagenet, ncf, "
                          "yolov3 are measured); for a PS job one of the 8 DL2 models: resnet-50, vgg-16, "
                          "resnext-110, inception-bn, seq2seq, cnn-text-classification, dssm, wlm (aliases "
                          "resnet50, vgg16, ctc)."),
        click.option("--batch-size", type=float,
                     help="All-reduce: the total batch of all workers together (required for a measured model)."),
        click.option("--adaptive-batch", is_flag=True, default=None,
                     help="All-reduce, a measured model: dl2d chooses the total batch with the GPUs, for the "
                          "most goodput (docs/jobs.md); --batch-size is then the initial one."),
        click.option("--max-batch-size", type=float, metavar="N",
                     help="With --adaptive-batch: the largest total batch the job accepts [its model's measured]."),
        click.option("--max-local-batch", type=int, metavar="N",
                     help="With --adaptive-batch: the most samples one GPU takes in a pass (beyond it the job "
                          "accumulates gradients) [its model's measured]."),
        click.option("--workers", metavar="N|MIN-MAX",
                     help="The workers you ask for (what Slurm alone would give the job); MIN-MAX, as Slurm's "
                          "--nodes=MIN-MAX: ask for MAX, never run with fewer than MIN (the job waits instead)."),
        click.option("--epoch-seconds", type=float,
                     help="All-reduce, a model dl2d does not know: seconds per epoch on one GPU (a hint for "
                          "the scheduler's speed prior)."),
        click.option("--epochs", type=float, help="Total epochs to train (your estimate)."),
        click.option("--label", metavar="CLASS",
                     help="The job's class for dl2ctl calibrate [default: its model]: jobs that train alike."),
        click.option("--launch", type=click.Choice(LAUNCHES),
                     help="All-reduce: srun = dl2d starts one process per worker, each told its rank "
                          "(docs/jobs.md) [default]; once = the command runs once on the first node and starts "
                          "its own processes (torchrun)."),
        click.option("--wrap", "--command", "command", metavar="CMD",
                     help="The training command each worker runs (as sbatch --wrap)."),
        click.option("--gpus-per-worker", type=float,
                     help="GPUs per worker [default: 1 for an all-reduce job, 0 for a PS job]."),
        click.option("--cpus-per-worker", type=float, help="CPUs per worker."),
        click.option("--mem-per-worker", metavar="MEM",
                     help="Memory per worker, sbatch syntax: 8G, 512M; plain numbers are megabytes."),
        click.option("--cpus-per-ps", type=float, help="CPUs per parameter server."),
        click.option("--mem-per-ps", metavar="MEM", help="Memory per parameter server (as --mem-per-worker)."),
        click.option("--max-workers", type=int,
                     help="Most workers the scheduler may give the job [default 64 all-reduce, 16 PS]."),
        click.option("--max-ps", type=int, help="Most parameter servers [default 16]."),
        click.option("--sync-mode", type=click.Choice(["sync", "async"]), help="Training mode [default sync]."),
        click.option("-t", "--time", metavar="TIME",
                     help="Time limit, sbatch syntax: MM, HH:MM:SS, D-HH:MM ... [default none]."),
        click.option("--owner", metavar="USER",
                     help="Submit on behalf of USER (admins only) [default: you]."),
        click.option("-A", "--account", metavar="NAME", help="Slurm account to charge [default: your default]."),
        click.option("-q", "--qos", metavar="NAME", help="Slurm QOS [default: your default]."),
        click.option("-p", "--partition", metavar="NAME",
                     help="Slurm partition(s), comma-separated [default: dl2d's [slurm] partition, else Slurm's]."),
        click.option("--export", "export", metavar="NAME=VALUE", multiple=True,
                     callback=lambda ctx, param, value: value or None,  # not given: None, like the other flags
                     help="A variable of the job's environment (repeatable; the spec's [env] table). The job sees "
                          "only these, Slurm's and dl2d's own (docs/jobs.md), never the submitting shell's."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _spec_text(path: str) -> str:
    """The spec file's text (``-``: standard input), read bounded: a FIFO, a device or a file of megabytes is
    refused with one line instead of blocking or filling memory (dl2d.core.files.read_bounded)."""
    from dl2d.cli.jobspec import MAX_SPEC_CHARS
    from dl2d.core.files import InputFileError, read_bounded

    if path == "-":
        return click.get_text_stream("stdin").read(MAX_SPEC_CHARS + 1)
    try:
        data = read_bounded(path, 4 * MAX_SPEC_CHARS)  # UTF-8: at most 4 bytes a character
    except InputFileError as e:
        if e.missing:  # a usage error, as click's own check of a path is (exit 2)
            raise click.BadParameter(f"{path}: No such file or directory", param_hint="'[SPEC]'") from None
        raise click.ClickException(f"job spec {e}") from None
    return data.decode("utf-8")[:MAX_SPEC_CHARS + 1]


@click.command()
@click.argument("spec_file", required=False, metavar="[SPEC]", type=click.Path(dir_okay=False, allow_dash=True))
@_submit_flags
@click.option("--format", "fmt", type=click.Choice(["toml", "json"]),
              help="Format of SPEC [default: from its extension; JSON if it starts with '{', else TOML].")
@click.option("--dry-run", is_flag=True, help="Validate and print the submission; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the new job as JSON.")
@db_command
def submit(ctx: Ctx, spec_file, fmt: str | None, dry_run: bool, as_json: bool, **flags: Any) -> None:
    """Submit a training job; prints its id.

    SPEC is a TOML or JSON job spec file ('-' reads standard input); flags override its fields, and a job
    can be given by flags alone. Required: name, model (job type), total epochs, command, worker cpus and
    memory; an all-reduce job of a measured model its total batch size; a PS job its PS cpus and memory.
    Every problem is listed at once and nothing is written when there is one (exit 1).

    Spec keys: name, kind, job_type, total_epochs, command, [worker] gpus/cpus/mem_gb, [ps] cpus/mem_gb
    (PS jobs), batch_size and epoch_seconds (all-reduce jobs), and optionally workers, max_workers, max_ps,
    sync, time_limit_min, owner (see docs/cli.md).

    \b
    Examples:
      dl2ctl submit job.toml
      dl2ctl submit -J bert-a --arch allreduce --type bert --batch-size 96 --workers 8 --epochs 2 \\
          --wrap 'torchrun train.py' --gpus-per-worker 1 --cpus-per-worker 8 --mem-per-worker 40G
      dl2ctl submit -J resnet-a --type resnet-50 --epochs 30 --wrap 'python train.py' \\
          --gpus-per-worker 1 --cpus-per-worker 4 --mem-per-worker 16G --cpus-per-ps 2 --mem-per-ps 8G
    """
    from dl2d.cli.jobspec import (
        MAX_SPEC_CHARS,
        SpecError,
        explain_errors,
        merge_submission,
        parse_spec_text,
        spec_format,
    )
    from dl2d.db.errors import SubmissionError
    from dl2d.db.jobs import validate_submission

    spec: dict[str, Any] = {}
    if spec_file is not None:
        name = "<stdin>" if spec_file == "-" else spec_file
        try:
            spec = parse_spec_text(_spec_text(spec_file), fmt or spec_format(str(name)), source=str(name))
        except SpecError as e:
            raise click.ClickException(str(e)) from e
        except UnicodeDecodeError as e:
            raise click.ClickException(f"{name}: not UTF-8 text (byte {e.start}); a job spec is TOML or JSON") \
                from None
    elif not any(v is not None for v in flags.values()):
        raise click.UsageError("give a job spec file or the job's flags (see dl2ctl submit --help)")

    from dl2d.db.jobs import submission_owner_problem

    via_daemon = not dry_run and ctx.via_daemon()  # then ctx.user and ctx.admin are the daemon's answer
    data, errors = merge_submission(spec, flags, ctx.user)
    problem = submission_owner_problem(data.get("owner"), ctx.user, ctx.admin)
    if problem:
        errors.append(problem)
    try:
        sub = validate_submission(data)
    except SubmissionError as e:
        errors.extend(explain_errors(e.errors))
    if errors:
        lines = "\n".join(f"  - {m}" for m in errors)
        n = len(errors)
        raise click.ClickException(f"invalid job submission ({n} problem{'s' if n > 1 else ''}):\n{lines}")

    if dry_run:
        click.echo(json.dumps({"name": sub.name, "owner": sub.owner, "job_type": sub.job_type,
                               "total_epochs": sub.total_epochs, **sub.spec()}, indent=2))
        return

    if via_daemon:  # the daemon decides the rights again, from the caller's uid and its own config
        reply = ctx.ask({"op": "submit", "submission": data})
        if not reply.get("ok"):
            problems = explain_errors([str(m) for m in reply.get("errors") or []]) or ["(no reason given)"]
            lines = "\n".join(f"  - {m}" for m in problems)
            raise click.ClickException(f"dl2d refused the job submission:\n{lines}")
        rec = reply["job"]
    else:
        rec = _submit_directly(ctx, sub)
    if as_json:
        click.echo(json.dumps(rec, indent=2))
    else:
        click.echo(f"Submitted job {rec['id']} ({rec['name']}, {rec['job_type']}, {_num(rec['total_epochs'])} "
                   f"epochs) for {rec['owner']}")
    if ctx.no_daemon:  # on stderr: --json's standard output stays one JSON document
        click.echo(no_daemon_note(ctx.no_daemon, ctx.url, f"job {rec['id']} was"), err=True)


def _submit_directly(ctx: Ctx, sub: Any) -> dict[str, Any]:
    """Insert the job into the database itself (no daemon answers; see dl2d.cli.dbconn)."""
    from dl2d.db.engine import session_scope
    from dl2d.db.jobs import submit_job
    from dl2d.db.models import utcnow

    engine = ctx.engine()
    try:
        with ctx.reading(), session_scope(engine) as s:
            return job_record(submit_job(s, sub), utcnow())
    finally:
        engine.dispose()


# --------------------------------------------------------------------------------------------------
# queue


@click.command()
@click.option("--state", "-s", "states", multiple=True, metavar="STATE",
              help="Only jobs in these states (repeatable or comma-separated: PENDING, RUNNING, COMPLETED, "
                   "FAILED, CANCELLED or Slurm's codes PD, R, CD, F, CA, or `active`).")
@click.option("--user", "-u", "users", multiple=True, metavar="USER",
              help="Only jobs of these owners (repeatable or comma-separated).")
@click.option("--me", is_flag=True, help="Only your jobs.")
@click.option("--all", "-a", "show_all", is_flag=True,
              help="Include finished jobs (COMPLETED, FAILED, CANCELLED); by default only active ones.")
@click.option("--format", "-o", "fmt", metavar="COLS",
              help="Columns, comma-separated: " + ", ".join(QUEUE_FIELDS) + " [default: "
                   + ",".join(QUEUE_DEFAULT) + "].")
@click.option("--noheader", "-H", is_flag=True, help="No header line (as squeue --noheader).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@db_command
def queue(ctx: Ctx, states: tuple[str, ...], users: tuple[str, ...], me: bool, show_all: bool, fmt: str | None,
          noheader: bool, as_json: bool) -> None:
    """List jobs like squeue: state, type, owner, current workers/PS, epochs done/total, age, and why a pending
    job waits (REASON: Resources, no node has room for a worker; Priority, one would fit but the policy ran
    other jobs first; Submitted, no slot has run since it came).

    By default all users' active jobs (not finished) are listed, oldest first.
    """
    from dl2d.db.engine import session_scope
    from dl2d.db.jobs import list_jobs
    from dl2d.db.models import utcnow
    from dl2d.db.slots import pending_reasons

    wanted = parse_states(states)
    columns = parse_format(fmt)
    if not wanted and not show_all:
        wanted = list(ACTIVE_STATES)
    owners = [u.strip() for v in users for u in v.split(",") if u.strip()] + ([ctx.user] if me else [])
    engine = ctx.engine()
    try:
        with ctx.reading(), session_scope(engine) as s:
            now = utcnow()
            jobs = list_jobs(s, wanted, owners)
            reasons = pending_reasons(s) if any(j.state == JobState.PENDING for j in jobs) else {}
            recs = [job_record(j, now) for j in jobs]
    finally:
        engine.dispose()
    for r in recs:
        r["reason"] = pending_reason(r, reasons)
    if as_json:
        click.echo(json.dumps(recs, indent=2))
        return
    if recs:
        click.echo("\n".join(queue_lines(recs, columns, header=not noheader)))
    elif not noheader:
        click.echo("no jobs" + ("" if show_all else " (active; --all includes finished jobs)"))


# --------------------------------------------------------------------------------------------------
# show


def load_job_detail(session: Any, job_id: int, now: datetime) -> dict[str, Any]:
    """Everything `show` prints about a job, as a JSON-ready dict (JobNotFound when there is none)."""
    from dl2d.db.events import job_events
    from dl2d.db.jobs import get_job
    from dl2d.db.slots import job_allocation_history, pending_reasons

    job = get_job(session, job_id)
    rec = job_record(job, now)
    rec["spec"] = job.spec
    rec["events"] = [{"ts": _iso(e.ts), "kind": e.kind.value, "detail": e.detail}
                     for e in job_events(session, job_id)]
    rec["resizes"] = resize_records(job_allocation_history(session, job_id))
    rec["reason"] = pending_reason(rec, pending_reasons(session) if rec["state"] == JobState.PENDING.value else {})
    if (job.spec or {}).get("adaptive_batch"):
        from dl2d.daemon.batches import batch_detail
        from dl2d.db.slots import recent_job_slot_stats

        last = recent_job_slot_stats(session, [job_id], 1).get(job_id) or [{}]
        gpus = int(job.workers * float(((job.spec or {}).get("worker") or {}).get("gpus") or 1))
        rec["batch"] = batch_detail(job.spec, job.job_type, job.batch_size, job.batch_noise, job.epochs_done, gpus,
                                    last[-1].get("nodes"))
    return rec


@click.command()
@click.argument("job_id", type=click.IntRange(1, 2 ** 63 - 1), metavar="JOB")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@db_command
def show(ctx: Ctx, job_id: int, as_json: bool) -> None:
    """Show job JOB: its spec, current allocation, events timeline and resizes."""
    from dl2d.db.engine import session_scope
    from dl2d.db.errors import JobNotFound
    from dl2d.db.models import utcnow

    engine = ctx.engine()
    try:
        with ctx.reading(), session_scope(engine) as s:
            rec = load_job_detail(s, job_id, utcnow())
    except JobNotFound as e:
        raise click.ClickException(f"{e} (dl2ctl queue --all lists the jobs)") from e
    finally:
        engine.dispose()
    rec["output"] = output_file(_slurm_state_dir(ctx), job_id, rec["slurm_job_id"])
    if as_json:
        click.echo(json.dumps(rec, indent=2))
        return
    _print_detail(rec)


def _slurm_state_dir(ctx: Ctx) -> str:
    """The Slurm backend's state dir as the daemon's config (as dl2ctl reads it) gives it."""
    cfg = daemon_view(os.environ, ctx.config)
    return cfg.slurm.state_dir or str(Path(cfg.state_dir) / "slurm")


def batch_lines(b: dict[str, Any] | None) -> list[tuple[str, str]]:
    """``show``'s lines of an adaptive job's batch (dl2d.daemon.batches.batch_detail); none for another job."""
    if not b:
        return []
    noise = (f"{b['noise_reports']} reports: noise scale {b['noise_scale_vs_model']:.2f}x its model's (last |G|^2 "
             f"{b['last_grad_sqr']:.3g}, variance {b['last_grad_var']:.3g})" if b["noise_reports"] else
             "its model's measured (no report yet)")
    good = b.get("goodput_vs_submitted")
    return [("adaptive batch", f"{_n(b['batch_size'])} now (submitted {_n(b['submitted_batch_size'])}; at most "
                               f"{_n(b['max_batch_size'])}, {_n(b['max_local_batch'])} a GPU a pass)"),
            ("gradient noise", noise),
            ("efficiency", f"{b['efficiency']:.2f} (progress per sample against its submitted batch's)"),
            ("goodput", f"{good:.2f}x its submitted batch's on its GPUs" if good is not None else "- (not running)")]


def _print_detail(rec: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    spec = rec["spec"] or {}
    w, p = spec.get("worker", {}), spec.get("ps", {})
    allreduce = spec.get("kind") == "allreduce"
    asked = f", asked {spec['workers']}" if spec.get("workers") else ""
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    for k, v in [
        ("job", f"{rec['id']} {rec['name']}"), ("owner", rec["owner"]), ("type", rec["job_type"]),
        ("architecture", "all-reduce" if allreduce else "parameter servers"),
        ("state", rec["state"] + (f" ({rec['reason']})" if rec.get("reason") else "")), ("epochs", f"{_num(rec['epochs_done'])}/{_num(rec['total_epochs'])}"),
        *([("lost to restarts", f"{_num(rec['lost_epochs'])} epochs trained again (a restart found no "
                                "checkpoint holding them)")] if rec.get("lost_epochs") else []),
        ("allocation", f"{rec['workers']} workers (max {spec.get('max_workers')}{asked})" if allreduce else
         f"{rec['workers']} workers, {rec['ps']} PS (max {spec.get('max_workers')} workers, "
         f"{spec.get('max_ps')} PS{asked})"),
        ("worker demand", f"{_n(w.get('gpus'))} GPU, {_n(w.get('cpus'))} CPU, {_n(w.get('mem_gb'))} GB"),
        *([("batch size", _n(spec.get("batch_size")) if spec.get("batch_size") else "-")] if allreduce else
          [("PS demand", f"{_n(p.get('cpus'))} CPU, {_n(p.get('mem_gb'))} GB")]),
        *([("epoch seconds (hint)", _n(spec["epoch_seconds"]))] if spec.get("epoch_seconds") else []),
        *batch_lines(rec.get("batch")),
        ("command", spec.get("command", "")), ("sync", spec.get("sync", "")),
        ("time limit", f"{spec['time_limit_min']} min" if spec.get("time_limit_min") else "none"),
        ("slurm job", rec["slurm_job_id"] or "-"), ("output", rec.get("output") or "-"),
        ("submitted", rec["submitted_at"]),
        ("started", rec["started_at"] or "-"), ("finished", rec["finished_at"] or "-"),
    ]:
        head.add_row(k, str(v))
    console.print(head)
    t = Table(title="Events", title_justify="left", box=None, header_style="bold")
    for c in ("TIME", "EVENT", "DETAIL"):
        t.add_column(c)
    for e in rec["events"]:
        t.add_row(e["ts"], e["kind"], _detail_text(e["detail"]))
    console.print(t)
    if rec["resizes"]:
        t = Table(title="Resizes", title_justify="left", box=None, header_style="bold")
        for c in ("SLOT", "TIME", "WORKERS", "PS"):
            t.add_column(c)
        for r in rec["resizes"]:
            t.add_row(str(r["slot"]), r["at"], f"{r['workers_from']} -> {r['workers_to']}",
                      f"{r['ps_from']} -> {r['ps_to']}")
        console.print(t)
    else:
        console.print("Resizes: none")


# --------------------------------------------------------------------------------------------------
# cancel


@click.command()
@click.argument("job_ids", type=click.IntRange(1, 2 ** 63 - 1), nargs=-1, required=True, metavar="JOB...")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome per job as JSON.")
@db_command
def cancel(ctx: Ctx, job_ids: Sequence[int], as_json: bool) -> None:
    """Cancel jobs. Only a job's owner, root or a member of the dl2d-admin group may cancel it.

    The job is marked CANCELLED at once; the daemon stops its Slurm job at its next slot. Finished jobs
    cannot be cancelled. Each job is handled on its own; the exit status is 1 when any job was refused.
    """
    if ctx.via_daemon():  # the daemon decides who may cancel, from the caller's uid and its own config
        results = ctx.ask({"op": "cancel", "job_ids": list(dict.fromkeys(job_ids))})["results"]
    else:
        from dl2d.db.jobs import cancel_jobs

        engine = ctx.engine()
        try:
            with ctx.reading():
                results = cancel_jobs(engine, job_ids, ctx.user, admin=ctx.admin)
        finally:
            engine.dispose()
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        for r in results:
            if r["cancelled"]:
                click.echo(f"Cancelled job {r['id']} ({r['name']})")
            else:
                click.echo(f"Error: cannot cancel job {r['id']}: {r['error']}", err=True)
    done = [str(r["id"]) for r in results if r["cancelled"]]
    if ctx.no_daemon and done:
        click.echo(no_daemon_note(ctx.no_daemon, ctx.url, f"the cancellation of job {', '.join(done)} was"), err=True)
    if not all(r["cancelled"] for r in results):
        click.get_current_context().exit(1)
