"""`dl2ctl conform`: the conformance harness on this cluster's Slurm (dl2d.daemon.conform): one seeded trace of
short demo jobs at declared speeds run by dl2d on the real Slurm and in its simulated twin, under each policy,
compared slot by slot (docs/cli.md, docs/BENCHMARKS.md)."""
from __future__ import annotations

import json
import os
import pwd
import sys
import tempfile
from pathlib import Path

import click

DEFAULT_POLICIES = "dl2-target,elastic,slurm"


def _policies(value: str) -> list[str]:
    from dl2d.policy import registry

    names = [p.strip() for p in value.split(",") if p.strip()]
    unknown = [p for p in names if p not in registry.names()]
    if not names or unknown:
        raise click.BadParameter(f"unknown policy {', '.join(unknown) or '(none given)'}; known: "
                                 f"{', '.join(registry.names())}", param_hint="--policies")
    return names


@click.command()
@click.option("--policies", default=DEFAULT_POLICIES, show_default=True, help="Comma-separated policies to run.")
@click.option("--slurm-conf", type=click.Path(exists=True, dir_okay=False), envvar="SLURM_CONF",
              help="The cluster's slurm.conf (default: $SLURM_CONF).")
@click.option("--slot", "slot_s", type=click.FloatRange(1.0, 600.0), default=3.0, show_default=True,
              help="Slot seconds, in both worlds (the trace's jobs take 3-10 slots each).")
@click.option("--jobs", "num_jobs", type=click.IntRange(2, 64), default=12, show_default=True,
              help="Demo jobs (the demo program at declared speeds).")
@click.option("--jax-jobs", type=click.IntRange(0, 8), default=2, show_default=True,
              help="Also this many JAX jobs of docs/jobs.md's recipe (examples/jax_allreduce.py), their speed in the "
                   "twin from dl2ctl calibrate of the real run.")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(10.0, 86_400.0), default=600.0, show_default=True,
              help="Seconds a policy's real run may take.")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path),
              help="Run both worlds' daemons under this directory and keep it (else a temporary one, removed).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the reports as JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON instead of a line per policy.")
def conform(policies: str, slurm_conf: str | None, slot_s: float, num_jobs: int, jax_jobs: int, seed: int,
            timeout_s: float, keep: Path | None, out: Path | None, as_json: bool) -> None:
    """Run one trace on this Slurm under dl2d and in its twin, and compare them slot by slot.

    Each policy runs the trace on the real cluster first (dl2d as a subprocess with the slurm backend; the jobs
    run as you), then in the twin with the start and restart costs measured there. Per policy: the share of
    job-slots in which both gave each job the same workers, the first divergence and its cause, average JCTs,
    resizes, and the slots in which Slurm held a GPU dl2d counted free. The trace needs the cluster to itself:
    each run waits up to a minute for Slurm's nodes to hold no GPU, then stops. Exit 1 when a world did not
    finish every job.
    """
    import shutil

    from dl2d.daemon.conform.compare import ordering, report_line
    from dl2d.daemon.conform.trace import make_trace
    from dl2d.daemon.conform.worlds import clean_env
    from dl2d.daemon.conform.worlds import conform as conform_one
    from dl2d.slurm.cli_driver import CliDriver

    from dl2d.daemon.conform.trace import jax_example

    names = _policies(policies)
    if not slurm_conf:
        raise click.UsageError("no Slurm: give --slurm-conf or set SLURM_CONF")
    if jax_jobs and not jax_example().is_file():
        raise click.UsageError(f"--jax-jobs: no {jax_example()} (dl2d installed without its examples): give "
                               "--jax-jobs 0 or run from a checkout")
    root = keep or Path(tempfile.mkdtemp(prefix="dl2d-conform-"))
    owner = pwd.getpwuid(os.geteuid()).pw_name
    try:
        driver = CliDriver(timeout=15, env={"SLURM_CONF": slurm_conf})
        jobs = make_trace(num_jobs, seed=seed, slot_seconds=slot_s, jax_jobs=jax_jobs)
        env = clean_env({"SLURM_CONF": slurm_conf})
        reports = []
        for policy in names:
            try:
                rep = conform_one(jobs, policy, slot_s, slurm_conf, root, driver, python=sys.executable, env=env,
                                  timeout_s=timeout_s, owner=owner)
            except RuntimeError as e:
                raise click.ClickException(f"{policy}: {e}") from None
            reports.append(rep)
            if not as_json:
                click.echo(report_line(rep))
        doc = {"seed": seed, "slot_s": slot_s, "jobs": num_jobs, "jax_jobs": jax_jobs, "reports": reports,
               "ordering": {w: ordering(reports, w) for w in ("real", "twin")}}
        if out is not None:
            out.write_text(json.dumps(doc, indent=1) + "\n")
        if as_json:
            click.echo(json.dumps(doc, indent=1))
        else:
            click.echo(f"ordering by average JCT, real: {', '.join(doc['ordering']['real'])}; "
                       f"twin: {', '.join(doc['ordering']['twin'])}")
        if any(r[w]["finished"] != len(jobs) for r in reports for w in ("real", "twin")):
            raise click.ClickException("a world did not finish every job (see the reports)")
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
