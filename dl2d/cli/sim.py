"""`dl2ctl sim`: run the time-slotted cluster simulator with one scheduling policy, or compare several.

Without options it simulates today's world (dl2d.sim.worlds): 160 all-reduce jobs drawn from the Philly trace
at load 1 on 16 nodes of 4 T4 GPUs, 60-second slots, under DRF, and prints a table with the JCT lower bound
(dl2d.sim.bound). `--world dl2` is the DL2 paper's world (500 servers of 2 GPUs, 200 PS jobs of its eight
models in the daily pattern, 20-minute slots). Every number it prints comes from
`dl2d.sim.engine.SimResult.summary()`; `--json` prints that summary (plus the trace and cluster settings, the
bound and the per-slot GPU utilisation) as pure JSON on stdout, with the progress bar off.
"""
from __future__ import annotations

import json
from pathlib import Path

import click

from dl2d.cli.options import finite_number, flags, given_options, parse_workload, site_speed_model, sparkline
from dl2d.core.contract import ALLREDUCE_PLACEMENTS
from dl2d.policy import registry
from dl2d.sim import presets as twin
from dl2d.sim.cluster import MAX_SERVERS, PRESETS
from dl2d.sim.trace import MAX_TRACE_JOBS
from dl2d.sim.worlds import DEFAULT_WORLD, WORLDS
from dl2d.workload.catalog import WORK_RULES
from dl2d.workload.philly import STYLES as WORKLOAD_STYLES
from dl2d.workload.throughput import OFF_TABLE

#: Every registered policy (dl2d.policy.registry); learned ones need --checkpoint.
POLICIES = registry.names()
LEARNED = registry.names(learned=True)
CLUSTERS = tuple(PRESETS)
#: Options that only shape a generated trace: rejected together with --trace.
GENERATION_OPTIONS = ("jobs", "arrivals", "max_arrivals", "epochs_model", "estimate_error", "interference",
                      "workload", "load", "style", "adaptive_batch")
#: Options of one world's generated traces only.
DL2_ONLY = ("arrivals", "max_arrivals", "epochs_model")
TODAY_ONLY = ("workload", "load", "style", "adaptive_batch")
DEFAULT_JOBS = {"today": 160, "dl2": 200}
#: A slot, or the training a resize costs, is at most a day (slots are 60 s today, 20 minutes in DL2's world;
#: the daemon's sim.resize_overhead_s has the same bound); `inf` used to end in a traceback.
MAX_SECONDS = 86_400.0


def parse_policies(text: str) -> list[str]:
    """`a,b,c` (or `all`: every registered policy) -> a list of known, distinct policy names; BadParameter
    otherwise."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(POLICIES)
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


def parse_checkpoints(values, names: list[str], world: str = "today", strict: bool = True) -> dict[str, Path]:
    """`--checkpoint PATH` (one learned policy) or `--checkpoint NAME=PATH` (several) -> {name: path}; a learned
    policy that ships a trained one for ``world`` (dl2-target, elastic-chooser) needs none. ``strict``: a learned
    policy with neither is a usage error (else its build fails, and a comparison gives it a row saying why)."""
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
        if strict and n not in out and registry.problems(n, registry.PolicyOptions(world=world)):
            raise click.UsageError(f"--policy {n} needs --checkpoint PATH (trained with "
                                   f"{registry.get(n).trained_by})")
    return out


def make_policy(name: str, checkpoint: Path | None, tetris_threshold: int | None, speed_model: str = "measured",
                world: str = "today", whole_nodes: bool = False, baseline_rules: str = "dl2d", batch: str = "fixed"):
    """A policy by name from the registry; any problem (a missing or unreadable checkpoint) is a clear error."""
    options = registry.PolicyOptions(checkpoint=str(checkpoint) if checkpoint else "",
                                     tetris_threshold=tetris_threshold, speed_model=speed_model, world=world,
                                     whole_nodes=whole_nodes, baseline_rules=baseline_rules, batch=batch)
    try:
        return registry.build(name, options)
    except registry.PolicyBuildError as e:
        raise click.ClickException(f"cannot load {name} checkpoint {checkpoint}: {e}" if checkpoint else str(e)) \
            from None


@click.command()
@click.option("--policy", type=click.Choice(POLICIES, case_sensitive=False), default=None,
              help="Scheduling policy to simulate [default: drf]. dl2, chic and chic-pair need --checkpoint.")
@click.option("--checkpoint", "checkpoints", metavar="[NAME=]PATH", multiple=True,
              help="Checkpoint of a learned policy (dl2 from `dl2ctl train`, chic/chic-pair from "
                   "bench/bench_chic.py); NAME=PATH, repeated, when several learned policies run.")
@click.option("--compare", "compare", metavar="A,B,...", default=None,
              help="Run several policies on the same trace and cluster and print one table, e.g. "
                   "drf,tetris,optimus,fifo,srtf; 'all': every registered policy (one that cannot be built "
                   "or does not finish gets a row saying why).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Read the jobs from a trace file (.json or .csv, see docs/simulator.md) instead of generating them.")
@click.option("--world", type=click.Choice(tuple(WORLDS)), default=DEFAULT_WORLD, show_default=True,
              help="today: all-reduce jobs of present-day models on 4-GPU T4 nodes, measured speeds, Philly "
                   "workloads, 60 s slots; dl2: the DL2 paper's PS jobs, testbed speeds and 20-minute slots.")
@click.option("--workload", default="philly", show_default=True,
              help="today: philly (drawn from the Philly trace: --jobs, --load, --seed) or a packaged Pollux "
                   "workload, pollux:K or pollux-realistic:K (K = 1-8).")
@click.option("--load", type=click.FloatRange(min=0, min_open=True), callback=finite_number,
              default=1.0, show_default=True,
              help="today, philly: arrival rate, 1 = 20 jobs an hour per 64 GPUs (the Pollux workloads' rate).")
@click.option("--style", type=click.Choice(WORKLOAD_STYLES), default="realistic", show_default=True,
              help="today, philly: the jobs as their users submitted them (as pollux-realistic:K), or each given a "
                   "configuration (GPUs, batch) as Pollux's evaluation tuned its jobs (as pollux:K).")
@click.option("--jobs", type=click.IntRange(1, MAX_TRACE_JOBS), default=None,
              help=f"Number of jobs to generate (at most {MAX_TRACE_JOBS}, as in a trace file) "
                   "[default: 160 today, 200 dl2].")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the generated trace and of the per-slot speed noise (same seed, same result).")
@click.option("--arrivals", type=click.Choice(("daily", "uniform", "poisson")), default="daily", show_default=True,
              help="Arrival pattern: daily (DL2 Fig. 8a, busy afternoons), uniform (max per slot) or poisson.")
@click.option("--max-arrivals", type=click.IntRange(1, MAX_TRACE_JOBS), default=10, show_default=True,
              help="Most jobs arriving in one slot (the Poisson mean for --arrivals poisson).")
@click.option("--epochs-model", type=click.Choice(("dl2", "weibull")), default="dl2", show_default=True,
              help="Total epochs per job: dl2 (per-type typical epochs x U(0.9, 1.1)) or weibull.")
@click.option("--estimate-error", type=click.FloatRange(0, 1, max_open=True), callback=finite_number,
              default=0.0, show_default=True,
              help="Relative error of the user's epoch estimate: true = estimate x (1 + E x U(-1, 1)).")
@click.option("--interference", type=click.FloatRange(min=0), callback=finite_number, default=None,
              help="Sigma of each job's persistent log-normal speed factor (cluster interference) [default: 0.27].")
@click.option("--cluster", type=click.Choice(CLUSTERS), default=None,
              help="Cluster preset [default: the world's]: t4-16 / t4-128 / t4-512 nodes of 4 T4 GPUs, 48 cores, "
                   "192 GB; dl2 = 500, testbed = 13, small = 40, tiny = 4 servers of 2 GPUs, 8 cores, 48 GB.")
@click.option("--servers", type=click.IntRange(1, MAX_SERVERS), default=None,
              help=f"Number of servers of the --cluster preset's kind (at most {MAX_SERVERS}); overrides its count.")
@click.option("--slot-seconds", type=click.FloatRange(0, MAX_SECONDS, min_open=True), callback=finite_number,
              default=None,
              help="Length of a scheduling slot in seconds [default: today 60, dl2 1200].")
@click.option("--restart-seconds", type=click.FloatRange(0, MAX_SECONDS), callback=finite_number,
              default=None,
              help="Training a job loses when it is resized or moved [default: today 30, dl2 0].")
@click.option("--allreduce-placement", type=click.Choice(ALLREDUCE_PLACEMENTS), default=None,
              help="Where an all-reduce job's new workers go: pack (the server that best fits the workers the job "
                   "still wants, so it spans the fewest nodes, as Slurm places a job) or spread (the least loaded "
                   "server, DL2's rule, which PS jobs always follow) [default: pack].")
@click.option("--speed-model", metavar="measured|parametric|FILE", default="measured", show_default=True,
              help="Training speeds of PS jobs: measured (the DL2 testbed data, interpolated) or parametric "
                   "(Optimus-style fit); or a speed-model FILE from `dl2ctl calibrate`: its curves are the truth and "
                   "the schedulers' estimate of the all-reduce models it holds (a twin of the cluster it came from).")
@click.option("--slot-noise", type=click.FloatRange(0, 1, max_open=True), callback=finite_number, default=None,
              help="Per job and slot speed noise: speed x (1 + N x U(-1, 1)) [default: 0.1].")
@click.option("--preset", "twin_preset", type=click.Choice(tuple(twin.PRESETS)), default="dl2d", show_default=True,
              help="today: the twin's frictions and rules as a set (dl2d.sim.presets): dl2d's own, or reference, the "
                   "Pollux artifact's simulator (no interference, its placement, batch and work rules, its "
                   "Tiresias and Optimus+Oracle). Each option below (and --interference, --slot-noise, "
                   "--allreduce-placement) overrides its part.")
@click.option("--shared-node-slowdown", type=click.FloatRange(0, 1, max_open=True), callback=finite_number,
              default=None, help="How much slower a multi-node job trains on a node another multi-node job shares "
                                 "[default: the world's, today 0.1, dl2 0].")
@click.option("--accumulate", type=click.Choice(tuple(twin.ACCUMULATE)), default=None,
              help="An all-reduce job's batch on its GPUs: none (split evenly whatever its size), cap (each GPU at "
                   "most its model's largest measured local batch, gradient accumulation beyond it) or artifact "
                   "(cap, and a one-GPU job beyond its model's initial batch over two passes) [default: none].")
@click.option("--off-table", type=click.Choice(OFF_TABLE), default=None,
              help="Speed at a placement never measured: fit (Pollux's throughput model) or interpolate (between "
                   "the measurements, as the Pollux artifact) [default: fit].")
@click.option("--work", type=click.Choice(WORK_RULES), default=None,
              help="An all-reduce job's work: iterations (of the measured runs, interpolated in log batch) or "
                   "progress (statistical efficiency from the measured gradient noise) [default: iterations].")
@click.option("--baseline-rules", type=click.Choice(twin.BASELINE_RULES), default=None,
              help="tiresias and optimus-oracle: dl2d's rules, or the Pollux artifact's (reference) [default: dl2d].")
@click.option("--batch-change", type=click.Choice(twin.BATCH_CHANGES), default=None,
              help="When a job that adapts its batch takes a new one: at a restart, as the scheduler gives it "
                   "(dl2d's job contract), or in-place, its own goodput-optimal batch at every epoch (an AdaptDL "
                   "job; needs --work progress) [default: restart].")
@click.option("--adaptive-batch", is_flag=True,
              help="today: every job of the workload lets the scheduler choose its total batch (within its model's "
                   "measured limits; its work stays what it was submitted with).")
@click.option("--batch", "batch_rule", type=click.Choice(registry.BATCH_RULES), default="fixed", show_default=True,
              help="goodput: each policy gives every job that allows it, at each (re)start, the batch of the "
                   "highest goodput (throughput x statistical efficiency) on its GPUs.")
@click.option("--tetris-threshold", type=click.IntRange(min=1), default=None,
              help="Bundles Tetris gives a job before moving to the next [default: the per-job maximum, 16].")
@click.option("--whole-nodes", is_flag=True,
              help="A job of more workers than a node holds gets whole nodes' worth (8, 12, ... on 4-GPU nodes), "
                   "as sites give multi-node jobs whole nodes; elastic and dl2-target only.")
@click.option("--save-trace", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the trace used to this file (.json or .csv).")
@click.option("--per-type", is_flag=True, help="Also print the average JCT (hours) per job type.")
@click.option("--lp-bound", is_flag=True,
              help="Also solve the tighter lower bound on the average JCT (dl2d.sim.lp_bound: a linear program over "
                   "every job's sizes and the cluster's capacity; seconds for 40 jobs, about a minute for 1 000).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the results as JSON on stdout (no table, no progress bar).")
@click.pass_context
def sim(ctx, policy, checkpoints, compare, trace_path, world, workload, load, style, jobs, seed, arrivals,
        max_arrivals, epochs_model, estimate_error, interference, cluster, servers, slot_seconds, restart_seconds,
        allreduce_placement, speed_model, slot_noise, twin_preset, shared_node_slowdown, accumulate, off_table, work,
        baseline_rules, batch_change, adaptive_batch, batch_rule, tetris_threshold, whole_nodes, save_trace, per_type,
        lp_bound, as_json) -> None:
    """Simulate a GPU cluster under a scheduling policy and report job completion times.

    A job's completion time (JCT) runs from its arrival slot to the moment it finishes, fractions of a slot
    included; it is shown in slots (SLOT-SECONDS each, 20 minutes by default) and in hours. Makespan is the
    time from the first arrival to the last completion. GPU and CPU utilisation are the fraction of the
    cluster's GPUs / cores allocated, averaged over the slots of the run.

    \b
    Examples:
      dl2ctl sim                                     # DRF, today: 160 Philly jobs, 64 GPUs
      dl2ctl sim --compare slurm,tiresias,drf,optimus --workload pollux:3
      dl2ctl sim --compare all --cluster t4-128 --jobs 1280 --load 2
      dl2ctl sim --world dl2 --compare drf,tetris,optimus,fifo,srtf
      dl2ctl sim --world dl2 --policy srtf --cluster small --jobs 40 --seed 3 --json
      dl2ctl sim --policy dl2 --checkpoint dl2-policy.ckpt --trace jobs.csv
    """
    if compare is not None and policy is not None:
        raise click.UsageError("give either --policy or --compare, not both")
    names = parse_policies(compare) if compare is not None else [(policy or "drf").lower()]
    if checkpoints and not any(n in LEARNED for n in names):
        raise click.UsageError(f"--checkpoint only applies to the learned policies ({', '.join(LEARNED)})")
    every = compare is not None and compare.strip().lower() == "all"
    checkpoint = parse_checkpoints(checkpoints, names, world, strict=not every)
    if whole_nodes:  # before anything is written (--save-trace)
        users = registry.names(reads="whole_nodes")
        ignore = [n for n in names if n not in users]
        if ignore:
            raise click.UsageError(f"--whole-nodes: {' and '.join(ignore)} cannot give whole nodes (only "
                                   f"{', '.join(users)} can)")

    def given(options):
        return given_options(ctx, options)

    if trace_path is not None and given(GENERATION_OPTIONS):
        raise click.UsageError(f"{flags(given(GENERATION_OPTIONS))} only shape a generated trace; they cannot be "
                               "used with --trace")
    wrong = given(DL2_ONLY if world == "today" else TODAY_ONLY)
    if wrong:
        raise click.UsageError(f"{flags(wrong)} only shape the {'dl2' if world == 'today' else 'today'} world's "
                               f"traces (--world {'dl2' if world == 'today' else 'today'})")
    if world != "today" and twin_preset != "dl2d":
        raise click.UsageError(f"--preset {twin_preset} is a setting of today's world (--world today)")
    settings = twin.resolve(twin_preset, {"interference": interference, "slot_noise": slot_noise,
                                     "shared_node_slowdown": shared_node_slowdown,
                                     "allreduce_placement": allreduce_placement, "accumulate": accumulate,
                                     "off_table": off_table, "work": work, "baseline_rules": baseline_rules,
                                     "batch_change": batch_change},
                            WORLDS[world])
    interference = settings["interference"]
    workload_folder, workload_k = parse_workload(workload)
    if workload_k is not None and given(("jobs", "load", "style")):
        raise click.UsageError(f"{flags(given(('jobs', 'load', 'style')))} shape a generated Philly workload, not "
                               f"the packaged {workload}")

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

    from dataclasses import replace

    from dl2d.sim import engine as E
    from dl2d.sim import trace as T
    from dl2d.sim.bound import lower_bound
    from dl2d.sim.cluster import preset
    from dl2d.sim.worlds import world as world_named
    from dl2d.workload import philly, workloads

    the_world = world_named(world)
    spec = preset(cluster or the_world.cluster)
    if servers:
        spec = replace(spec, num_servers=servers)
    slot_seconds = slot_seconds or the_world.slot_seconds
    jobs = jobs or DEFAULT_JOBS[world]
    if trace_path is not None:
        try:
            trace = T.load(trace_path)
        except T.TraceError as e:
            raise click.BadParameter(str(e), param_hint="--trace") from None
    elif world == "today":
        try:
            if workload_k is None:
                wl = philly.generate(jobs, load=load, cluster_gpus=int(spec.capacity[0]), seed=seed,
                                     max_gpus=the_world.max_workers, style=style)
            else:
                wl = workloads.packaged_workload(workload_k, workload_folder)
            trace = T.from_workload(wl, slot_seconds, seed=seed, interference_sigma=interference,
                                    epoch_estimate_error=estimate_error, adaptive=adaptive_batch,
                                    config={"workload": workload, "load": load,
                                            **({"style": style} if workload_k is None else {})})
        except (T.TraceError, ValueError) as e:
            raise click.UsageError(str(e)) from None
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

    site, speed_model = site_speed_model(speed_model, trace)
    try:
        trace.check_site(site)
    except T.TraceError as e:
        raise click.BadParameter(str(e), param_hint="--trace") from None
    # a comparison never dies for one row: a policy that cannot be built or does not finish gets a row saying why
    failed: dict[str, str] = {}  # policy -> why it has no result
    schedulers = {}
    for n in names:
        try:
            schedulers[n] = make_policy(n, checkpoint.get(n), tetris_threshold, speed_model, world, whole_nodes,
                                        settings["baseline_rules"], batch_rule)
        except click.ClickException as e:
            if compare is None:
                raise
            failed[n] = f"not built: {e.message}"
    limits = {}
    for s in schedulers.values():  # the DL2 policy's output layer fixes its per-job maxima; use them for every policy
        cfg = getattr(s, "cfg", None)
        if cfg is not None:
            limits = {"max_workers": cfg.max_workers, "max_ps": cfg.max_ps}
    overhead = the_world.resize_overhead_s if restart_seconds is None else restart_seconds
    sim_cfg = the_world.sim_config(slot_seconds=slot_seconds, speed_model=speed_model, resize_overhead_s=overhead,
                                   **limits)
    sim_cfg = twin.sim_config(settings, replace(sim_cfg, cluster=spec, site_speeds=site))
    bound = lower_bound(trace, sim_cfg)
    if lp_bound:
        from dl2d.sim.lp_bound import lp_lower_bound

        try:
            with Console(stderr=True).status("solving the LP bound"):
                lp = lp_lower_bound(trace, sim_cfg)
        except ValueError as e:
            raise click.UsageError(f"--lp-bound: {e}") from None

    n_jobs = len(trace)
    results = {}
    columns = (TextColumn("{task.description:>14}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs done"),
               TextColumn("slot {task.fields[slot]}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), disable=as_json) as progress:
        for name, scheduler in schedulers.items():
            label = getattr(scheduler, "name", name)
            task = progress.add_task(label, total=n_jobs, slot=0)

            def on_slot(state, task=task):
                progress.update(task, completed=int(np.sum(~np.isnan(state.finish_time))), slot=state.slot)

            try:
                results[name] = E.run(trace, scheduler, sim_cfg, seed=seed, on_slot=on_slot, name=label)
            except E.DidNotFinish as e:
                why = f"{e}: its jobs are too long or too slow for this cluster and slot length, or it starves one"
                if compare is None:
                    raise click.ClickException(f"{label}: {why}") from None
                failed[name] = why
            except Exception as e:  # noqa: BLE001 (a policy's own failure: its row says it, the others run)
                if compare is None:
                    raise
                failed[name] = f"failed: {type(e).__name__}: {e}"

    if trace_path is not None:
        trace_setting = {"file": str(trace_path)}
    elif world == "today":
        trace_setting = {"workload": workload, "jobs": len(trace), "seed": seed, "estimate_error": estimate_error,
                         "interference": interference, "adaptive_batch": adaptive_batch,
                         **({"load": load, "style": style} if workload_k is None else {})}
    else:
        trace_setting = {"jobs": jobs, "seed": seed, "arrivals": arrivals, "max_arrivals": max_arrivals,
                         "epochs_model": epochs_model, "estimate_error": estimate_error, "interference": interference}
    setting = {
        "world": world, "trace": trace_setting,
        "cluster": {"servers": spec.num_servers, "gpus": spec.gpus, "cpus": spec.cpus, "mem_gb": spec.mem_gb},
        "sim": {"slot_seconds": slot_seconds, "speed_model": site.source if site else speed_model,
                "slot_noise": sim_cfg.slot_noise, "seed": seed,
                "max_workers": sim_cfg.max_workers, "max_ps": sim_cfg.max_ps, "restart_seconds": overhead,
                "allreduce_placement": sim_cfg.allreduce_placement,
                "shared_node_slowdown": sim_cfg.shared_node_slowdown, "whole_nodes": whole_nodes,
                "preset": twin_preset, "speed_rules": sim_cfg.speed_rules.as_dict(),
                "baseline_rules": settings["baseline_rules"], "batch": batch_rule,
                "batch_change": settings["batch_change"]},
        "lower_bound": {"avg_jct_slots": round(bound.avg_jct_slots, 3),
                        "avg_jct_hours": round(bound.avg_jct_slots * slot_seconds / 3600, 3),
                        "no_contention_slots": round(bound.no_contention_slots, 3),
                        "capacity_slots": round(bound.capacity_slots, 3)},
    }
    if lp_bound:
        setting["lp_bound"] = {"avg_jct_slots": round(lp.avg_jct_slots, 3),
                               "avg_jct_hours": round(lp.avg_jct_slots * slot_seconds / 3600, 3),
                               "lp_slots": round(lp.lp_slots, 3), "bucket_seconds": lp.bucket_s,
                               "solve_seconds": round(lp.solve_s, 1)}
    if as_json:
        out = {**setting, "results": [
            {**results[n].summary(), "finished": True,
             "gpu_util_per_slot": [round(float(u), 4) for u in results[n].gpu_util]} if n in results else
            {"policy": n, "finished": False, "error": failed[n]} for n in names]}
        click.echo(json.dumps(out, indent=2))
        return

    console = Console()
    if trace_path is not None:
        src = f"trace {trace_path}"
    elif world == "today":
        src = f"{workload}" + (f" ({style}) at load {load:g}" if workload_k is None else "") + f", seed {seed}"
    else:
        src = f"{arrivals} trace, seed {seed}"
    gpus = int(spec.capacity[0])
    table = Table(title=f"{world} world: {n_jobs} jobs ({src}) on {spec.num_servers} servers ({gpus} GPUs), "
                        f"{slot_seconds / 60:g}-minute slots", box=box.SIMPLE_HEAD,
                  caption="JCT: arrival to completion, averaged over jobs (p99: 99th percentile); util: allocated / "
                          "total, mean over slots; resizes: allocations changed (restarts); ms/slot: decision time. "
                          f"Lower bound on the average JCT (dl2d.sim.bound): "
                          f"{bound.avg_jct_slots * slot_seconds / 3600:.2f} h"
                          + (f"; the LP bound (dl2d.sim.lp_bound): {lp.avg_jct_slots * slot_seconds / 3600:.2f} h"
                             if lp_bound else ""))
    for col in ("policy", "avg JCT h", "p99 JCT h", "avg JCT slots", "makespan h", "GPU util", "resizes",
                "GPU util over time", "ms/slot", "wall s"):
        table.add_column(col, justify="left" if col in ("policy", "GPU util over time") else "right",
                         no_wrap=col == "policy", min_width=12 if col == "GPU util over time" else None)
    for n in names:
        if n not in results:
            table.add_row(n, "[yellow]-[/]", "", "", "", "", "", "[yellow]see below[/]", "", "")
            continue
        s = results[n].summary()
        table.add_row(s["policy"], f"{s['avg_jct_hours']:.2f}", f"{s['p99_jct_hours']:.2f}",
                      f"{s['avg_jct_slots']:.2f}", f"{s['makespan_hours']:.1f}", f"{s['gpu_util']:.3f}",
                      str(s["resizes"]), sparkline(results[n].gpu_util, 12), f"{s['decision_ms']:.2f}", f"{s['wall_s']:.1f}")
    console.print(table)
    for n, why in failed.items():
        console.print(f"[yellow]{n}:[/] {why}", highlight=False)
    if per_type and results:
        pt = Table(title="Average JCT per job type (hours)", box=box.SIMPLE_HEAD)
        pt.add_column("job type")
        pt.add_column("jobs", justify="right")
        for r in results.values():
            pt.add_column(r.policy, justify="right")
        per = [r.per_type_jct_hours() for r in results.values()]
        from dl2d.workload.catalog import MODEL_NAMES

        for t, tname in enumerate(MODEL_NAMES):
            count = int(np.sum(trace.type_idx == t))
            if count:
                pt.add_row(tname, str(count), *(f"{p[tname]:.2f}" for p in per))
        console.print(pt)
    if any(r.unplaced for r in results.values()):
        console.print("[yellow]note:[/] some requested tasks fit on no server and were not placed: "
                      + ", ".join(f"{r.policy} {r.unplaced}" for r in results.values() if r.unplaced))
    if save_trace is not None:
        console.print(f"trace written to {save_trace}")
