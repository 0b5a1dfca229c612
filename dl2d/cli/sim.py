"""`dl2ctl sim`: run the time-slotted cluster simulator with one scheduling policy, or compare several.

Without options it simulates the DL2 paper's scale (500 servers of 2 GPUs / 8 cores / 48 GB, 200 jobs arriving
in the daily pattern, trace seed 0) under DRF and prints a table. Every number it prints comes from
`dl2d.sim.engine.SimResult.summary()`; `--json` prints that summary (plus the trace and cluster settings and
the per-slot GPU utilisation) as pure JSON on stdout, with the progress bar off.
"""
from __future__ import annotations

import json
from pathlib import Path

import click

from dl2d.policy import registry
from dl2d.sim.cluster import PRESETS

#: Every registered policy (dl2d.policy.registry); learned ones need --checkpoint.
POLICIES = registry.names()
BASELINE_NAMES = registry.names(heuristic=True)
LEARNED = registry.names(learned=True)
CLUSTERS = tuple(PRESETS)
#: Options that only shape a generated trace: rejected together with --trace.
GENERATION_OPTIONS = ("jobs", "arrivals", "max_arrivals", "epochs_model", "estimate_error", "interference")
SPARK = "▁▂▃▄▅▆▇█"


def parse_policies(text: str) -> list[str]:
    """`a,b,c` (or `all`) -> a list of known, distinct policy names; BadParameter otherwise."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(BASELINE_NAMES)
    if not names:
        raise click.BadParameter("give a comma-separated list of policies, e.g. drf,tetris,optimus",
                                 param_hint="--compare")
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise click.BadParameter(f"unknown policy {', '.join(map(repr, unknown))}; choose from "
                                 f"{', '.join(POLICIES)} (or 'all')", param_hint="--compare")
    if len(set(names)) != len(names):
        raise click.BadParameter("a policy is listed twice", param_hint="--compare")
    return names


def parse_checkpoints(values, names: list[str]) -> dict[str, Path]:
    """`--checkpoint PATH` (one learned policy) or `--checkpoint NAME=PATH` (several) -> {name: path}."""
    learned = [n for n in names if n in LEARNED]
    out: dict[str, Path] = {}
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or name not in LEARNED:
            if len(learned) != 1:
                raise click.UsageError("with several learned policies give --checkpoint NAME=PATH for each "
                                       f"({', '.join(learned) or 'none selected'})")
            name, path = learned[0], v
        if name not in learned:
            raise click.UsageError(f"--checkpoint {v}: {name} is not among the policies to run")
        out[name] = Path(path)
    for n in learned:
        if n not in out:
            raise click.UsageError(f"--policy {n} needs --checkpoint PATH (trained with "
                                   f"{registry.get(n).trained_by})")
    return out


def make_policy(name: str, checkpoint: Path | None, tetris_threshold: int | None, speed_model: str = "measured"):
    """A policy by name from the registry; any problem (a missing or unreadable checkpoint) is a clear error."""
    options = registry.PolicyOptions(checkpoint=str(checkpoint) if checkpoint else "",
                                     tetris_threshold=tetris_threshold, speed_model=speed_model)
    try:
        return registry.build(name, options)
    except registry.PolicyBuildError as e:
        raise click.ClickException(f"cannot load {name} checkpoint {checkpoint}: {e}" if checkpoint else str(e)) \
            from None


def sparkline(values, width: int = 24) -> str:
    """Mean of `values` over `width` equal chunks, drawn with block characters (0 = ▁, 1 = █)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return ""
    chunks = np.array_split(v, min(width, v.size))
    return "".join(SPARK[min(int(np.mean(c) * len(SPARK)), len(SPARK) - 1)] for c in chunks)


@click.command()
@click.option("--policy", type=click.Choice(POLICIES, case_sensitive=False), default=None,
              help="Scheduling policy to simulate [default: drf]. dl2, chic and chic-pair need --checkpoint.")
@click.option("--checkpoint", "checkpoints", metavar="[NAME=]PATH", multiple=True,
              help="Checkpoint of a learned policy (dl2 from `dl2ctl train`, chic/chic-pair from "
                   "bench/bench_chic.py); NAME=PATH, repeated, when several learned policies run.")
@click.option("--compare", "compare", metavar="A,B,...", default=None,
              help="Run several policies on the same trace and cluster and print one table, e.g. "
                   "drf,tetris,optimus,fifo,srtf ('all' = those five).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Read the jobs from a trace file (.json or .csv, see docs/simulator.md) instead of generating them.")
@click.option("--jobs", type=click.IntRange(min=1), default=200, show_default=True,
              help="Number of jobs to generate.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the generated trace and of the per-slot speed noise (same seed, same result).")
@click.option("--arrivals", type=click.Choice(("daily", "uniform", "poisson")), default="daily", show_default=True,
              help="Arrival pattern: daily (DL2 Fig. 8a, busy afternoons), uniform (max per slot) or poisson.")
@click.option("--max-arrivals", type=click.IntRange(min=1), default=10, show_default=True,
              help="Most jobs arriving in one slot (the Poisson mean for --arrivals poisson).")
@click.option("--epochs-model", type=click.Choice(("dl2", "weibull")), default="dl2", show_default=True,
              help="Total epochs per job: dl2 (per-type typical epochs x U(0.9, 1.1)) or weibull.")
@click.option("--estimate-error", type=click.FloatRange(0, 1, max_open=True), default=0.0, show_default=True,
              help="Relative error of the user's epoch estimate: true = estimate x (1 + E x U(-1, 1)).")
@click.option("--interference", type=click.FloatRange(min=0), default=0.27, show_default=True,
              help="Sigma of each job's persistent log-normal speed factor (cluster interference).")
@click.option("--cluster", type=click.Choice(CLUSTERS), default="dl2", show_default=True,
              help="Cluster preset: dl2 = 500 servers, testbed = 13, small = 40, tiny = 4 "
                   "(each server 2 GPUs, 8 CPU cores, 48 GB).")
@click.option("--servers", type=click.IntRange(min=1), default=None,
              help="Number of servers (2 GPUs, 8 cores, 48 GB each); overrides --cluster.")
@click.option("--slot-seconds", type=click.FloatRange(min=0, min_open=True), default=1200.0, show_default=True,
              help="Length of a scheduling slot in seconds (DL2: 20 minutes).")
@click.option("--speed-model", type=click.Choice(("measured", "parametric")), default="measured", show_default=True,
              help="Training speeds: measured (the DL2 testbed data, interpolated) or parametric (Optimus-style fit).")
@click.option("--slot-noise", type=click.FloatRange(0, 1, max_open=True), default=0.1, show_default=True,
              help="Per job and slot speed noise: speed x (1 + N x U(-1, 1)).")
@click.option("--tetris-threshold", type=click.IntRange(min=1), default=None,
              help="Bundles Tetris gives a job before moving to the next [default: the per-job maximum, 16].")
@click.option("--save-trace", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the trace used to this file (.json or .csv).")
@click.option("--per-type", is_flag=True, help="Also print the average JCT (hours) per job type.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the results as JSON on stdout (no table, no progress bar).")
@click.pass_context
def sim(ctx, policy, checkpoints, compare, trace_path, jobs, seed, arrivals, max_arrivals, epochs_model,
        estimate_error, interference, cluster, servers, slot_seconds, speed_model, slot_noise, tetris_threshold,
        save_trace, per_type, as_json) -> None:
    """Simulate a GPU cluster under a scheduling policy and report job completion times.

    A job's completion time (JCT) runs from its arrival slot to the moment it finishes, fractions of a slot
    included; it is shown in slots (SLOT-SECONDS each, 20 minutes by default) and in hours. Makespan is the
    time from the first arrival to the last completion. GPU and CPU utilisation are the fraction of the
    cluster's GPUs / cores allocated, averaged over the slots of the run.

    \b
    Examples:
      dl2ctl sim                                     # DRF, 500 servers, 200 jobs
      dl2ctl sim --compare drf,tetris,optimus,fifo,srtf
      dl2ctl sim --policy srtf --cluster small --jobs 40 --seed 3 --json
      dl2ctl sim --policy dl2 --checkpoint dl2-policy.ckpt --trace jobs.csv
    """
    if compare is not None and policy is not None:
        raise click.UsageError("give either --policy or --compare, not both")
    names = parse_policies(compare) if compare is not None else [(policy or "drf").lower()]
    if checkpoints and not any(n in LEARNED for n in names):
        raise click.UsageError(f"--checkpoint only applies to the learned policies ({', '.join(LEARNED)})")
    checkpoint = parse_checkpoints(checkpoints, names)
    if trace_path is not None:
        given = [n for n in GENERATION_OPTIONS
                 if ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE]
        if given:
            opts = ", ".join("--" + n.replace("_", "-") for n in given)
            raise click.UsageError(f"{opts} only shape a generated trace; they cannot be used with --trace")

    import numpy as np
    from rich import box
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Table

    from dl2d.sim import engine as E
    from dl2d.sim import trace as T
    from dl2d.sim.cluster import ClusterSpec, preset

    if trace_path is not None:
        try:
            trace = T.load(trace_path)
        except T.TraceError as e:
            raise click.BadParameter(str(e), param_hint="--trace") from None
    else:
        try:
            tcfg = T.TraceConfig(num_jobs=jobs, max_arrivals_per_slot=max_arrivals, arrival_pattern=arrivals,
                                 epochs_model=epochs_model, epoch_estimate_error=estimate_error,
                                 interference_sigma=interference)
            trace = T.generate(tcfg, seed=seed)
        except T.TraceError as e:
            raise click.UsageError(str(e)) from None
    if save_trace is not None:
        try:
            T.save(trace, save_trace)
        except T.TraceError as e:
            raise click.BadParameter(str(e), param_hint="--save-trace") from None
        except OSError as e:
            raise click.BadParameter(f"cannot write {save_trace}: {e.strerror}", param_hint="--save-trace") from None

    spec = ClusterSpec(servers) if servers else preset(cluster)
    schedulers = [make_policy(n, checkpoint.get(n), tetris_threshold, speed_model) for n in names]
    limits = {}
    for s in schedulers:  # the DL2 policy's output layer fixes its per-job maxima; use them for every policy
        cfg = getattr(s, "cfg", None)
        if cfg is not None:
            limits = {"max_workers": cfg.max_workers, "max_ps": cfg.max_ps}
    sim_cfg = E.SimConfig(cluster=spec, slot_seconds=slot_seconds, speed_model=speed_model, slot_noise=slot_noise,
                          **limits)

    n_jobs = len(trace)
    results = []
    columns = (TextColumn("{task.description:>14}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs done"),
               TextColumn("slot {task.fields[slot]}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), disable=as_json) as progress:
        for name, scheduler in zip(names, schedulers):
            label = getattr(scheduler, "name", name)
            task = progress.add_task(label, total=n_jobs, slot=0)

            def on_slot(state, task=task):
                progress.update(task, completed=int(np.sum(~np.isnan(state.finish_time))), slot=state.slot)

            results.append(E.run(trace, scheduler, sim_cfg, seed=seed, on_slot=on_slot, name=label))

    setting = {
        "trace": {"file": str(trace_path)} if trace_path is not None else
                 {"jobs": jobs, "seed": seed, "arrivals": arrivals, "max_arrivals": max_arrivals,
                  "epochs_model": epochs_model, "estimate_error": estimate_error, "interference": interference},
        "cluster": {"servers": spec.num_servers, "gpus": spec.gpus, "cpus": spec.cpus, "mem_gb": spec.mem_gb},
        "sim": {"slot_seconds": slot_seconds, "speed_model": speed_model, "slot_noise": slot_noise, "seed": seed,
                "max_workers": sim_cfg.max_workers, "max_ps": sim_cfg.max_ps},
    }
    if as_json:
        out = {**setting, "results": [{**r.summary(), "gpu_util_per_slot": [round(float(u), 4) for u in r.gpu_util]}
                                      for r in results]}
        click.echo(json.dumps(out, indent=2))
        return

    console = Console()
    src = f"trace {trace_path}" if trace_path is not None else f"{arrivals} trace, seed {seed}"
    table = Table(title=f"{n_jobs} jobs ({src}) on {spec.num_servers} servers, "
                        f"{slot_seconds / 60:g}-minute slots, {speed_model} speeds", box=box.SIMPLE_HEAD,
                  caption="JCT: arrival to completion, averaged over jobs; util: allocated / total, "
                          "mean over slots; ms/slot: scheduler decision time")
    for col in ("policy", "avg JCT h", "avg JCT slots", "makespan h", "GPU util", "CPU util", "GPU util over time",
                "ms/slot", "wall s"):
        table.add_column(col, justify="left" if col in ("policy", "GPU util over time") else "right",
                         no_wrap=col == "policy", min_width=12 if col == "GPU util over time" else None)
    for r in results:
        s = r.summary()
        table.add_row(s["policy"], f"{s['avg_jct_hours']:.2f}", f"{s['avg_jct_slots']:.2f}",
                      f"{s['makespan_hours']:.1f}", f"{s['gpu_util']:.3f}", f"{s['cpu_util']:.3f}",
                      sparkline(r.gpu_util, 12), f"{s['decision_ms']:.2f}", f"{s['wall_s']:.1f}")
    console.print(table)
    if per_type:
        pt = Table(title="Average JCT per job type (hours)", box=box.SIMPLE_HEAD)
        pt.add_column("job type")
        pt.add_column("jobs", justify="right")
        for r in results:
            pt.add_column(r.policy, justify="right")
        per = [r.per_type_jct_hours() for r in results]
        from dl2d.workload.jobtypes import TYPE_NAMES

        for t, tname in enumerate(TYPE_NAMES):
            count = int(np.sum(trace.type_idx == t))
            if count:
                pt.add_row(tname, str(count), *(f"{p[tname]:.2f}" for p in per))
        console.print(pt)
    if any(r.unplaced for r in results):
        console.print("[yellow]note:[/] some requested tasks fit on no server and were not placed: "
                      + ", ".join(f"{r.policy} {r.unplaced}" for r in results if r.unplaced))
    if save_trace is not None:
        console.print(f"trace written to {save_trace}")
