"""`dl2ctl calibrate`: a speed model of this cluster's own jobs, fitted from the speeds the daemon stored per
slot (dl2d.workload.calibration), written as a speed-model file (dl2d.workload.speedfit, docs/jobs.md)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import click

from dl2d.cli.dbconn import Ctx, db_command


def _check_writable(path: Path) -> None:
    """Fail before any work when ``path`` cannot be written (its directory missing or read-only)."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise click.BadParameter(f"no directory {parent}", param_hint="--out")
    if not os.access(parent, os.W_OK):
        raise click.BadParameter(f"cannot write in {parent}", param_hint="--out")


@click.command()
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The speed-model file to write (JSON).")
@click.option("--gpus-per-node", type=click.IntRange(1, 64), default=4, show_default=True,
              help="GPUs per node of this cluster: the prior's shape (crossing a node costs what it costs).")
@click.option("--max-gpus", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="The curve covers 1..MAX GPUs.")
@click.option("--min-slots", type=click.IntRange(1, 10_000), default=3, show_default=True,
              help="Slots a class needs to be fitted; fewer: the stated prior, scaled to what was seen.")
@click.option("--json", "as_json", is_flag=True, help="Print the speed model instead of a table.")
@db_command
def calibrate(ctx: Ctx, out: Path, gpus_per_node: int, max_gpus: int, min_slots: int, as_json: bool) -> None:
    """Fit each job class's speed over GPUs from the speeds the daemon measured, for `dl2ctl sim/train`.

    A class is a job's --label, else its model. Only slots a job trained through at an unchanged size count
    (a start, a resize or the job's end in a slot holds time that is no speed). See docs/jobs.md.
    """
    from dl2d.core.files import write_atomic
    from dl2d.db.engine import session_scope
    from dl2d.db.slots import speed_samples
    from dl2d.workload.calibration import calibrate_spread, class_mix, fit_classes, gather
    from dl2d.workload.speedfit import speed_model_doc

    _check_writable(out)
    engine = ctx.engine()
    with ctx.reading(), session_scope(engine) as s:
        rows = speed_samples(s)
    engine.dispose()
    samples = gather(rows, gpus_per_node)
    classes = fit_classes(samples, gpus_per_node, max_gpus, min_slots)
    if not classes:
        raise click.ClickException(f"no all-reduce job has speeds stored in {ctx.url}: nothing to calibrate "
                                   "(the daemon stores them at the end of every slot a job runs in)")
    doc = speed_model_doc(classes, f"dl2ctl calibrate: {len(rows)} job-slots, --gpus-per-node {gpus_per_node}, "
                                   f"--min-slots {min_slots}", class_mix(samples),
                          calibrate_spread(samples, classes))
    write_atomic(out, json.dumps(doc, indent=1) + "\n")
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    click.echo(f"{'CLASS':24} {'FIT':6} {'SLOTS':>5}  {'GPUS SEEN':18} {'S/EPOCH@1':>10} {'SPEED-UP@MAX':>12}")
    for name, (_, t, fitted, observed) in sorted(classes.items()):
        seen = ",".join(str(g) for g in sorted(observed)) or "-"
        best = max(observed) if observed else 1
        click.echo(f"{name[:24]:24} {'fitted' if fitted else 'prior':6} {sum(n for n, _ in observed.values()):>5}  "
                   f"{seen[:18]:18} {t[1]:>10.1f} {t[1] / t[best]:>12.2f}")
    click.echo(f"wrote {out}")
