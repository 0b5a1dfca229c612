"""Batch-adapting policies against fixed-batch ones on the sixteen Pollux workloads (eight tuned, eight as
submitted), in the twin's reference preset (the Pollux artifact's cluster and rules, dl2d.sim.presets) or in
dl2d's own (``--preset dl2d``), each job's batch the scheduler's to choose where the policy adapts batches.

Why: the batch is the lever fixed-batch scheduling lacks (Pollux, OSDI'21). This measures how much each
batch-adapting policy gains, on the same traces as the fixed-batch ones, and what a slot's decision costs:

* ``NAME`` (a registered policy): every job at its submitted batch;
* ``NAME+goodput``: every job of a measured model adaptive, the policy sizing jobs on the speeds of their best
  batch at each size and each restarting job given that batch (dl2d.policy.elastic.goodput);
* ``NAME+batch``: the same batches, the sizes chosen for the submitted batch (the goodput batch alone);
* ``pollux``: the Pollux baseline (its genetic search; NCF's batch fixed, as the artifact has it).

Per policy and workload: the average and p99 JCT (hours) and the decision time a slot (ms); per workload the
lower bounds at the submitted batches and with every batch the scheduler's (dl2d.sim.bound; with ``--lp`` the
time-indexed program's too, dl2d.sim.lp_bound, which counts that jobs share the cluster). Seeds are the
workloads' own (workload k: seed k); nothing here was trained on them.

    python bench/bench_goodput.py [--preset reference|dl2d] [--policies elastic,elastic+goodput,pollux]
                                  [--workloads tuned:1-8,realistic:1-8] [--generations 30] [--lp] [--restart-s S]
                                  [--out FILE.json]

``--workloads generated-tuned:100-103,generated-realistic:100-103 --loads 1,2``: the tuning set instead (Philly
workloads generated in both styles, 160 jobs on 64 GPUs, dl2d.workload.philly; seed k, at each load), where the
batch-adapting rules' settings were chosen; ``--adaptive-keep-gain G`` runs elastic with that keep gain for jobs
whose batch the scheduler chooses (dl2d.policy.elastic.srtf.ADAPTIVE_KEEP_GAIN).

``--latency J``: instead, the decision time a slot at J jobs (the 16 workloads' jobs in turn, every one submitted
at once, every batch the scheduler's) on J / 4 nodes of the artifact's (4 T4 each), over ``--latency-slots``
slots of the engine: the first slot (every cache cold), then the median, 90th percentile and largest of the rest.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import replace

import numpy as np

from dl2d.policy import registry
from dl2d.policy.elastic import srtf
from dl2d.policy.elastic.goodput import GoodputBatch, goodput_batches
from dl2d.sim import engine as E
from dl2d.sim.bound import lower_bound
from dl2d.sim.lp_bound import ADAPTIVE_PHASES, lp_lower_bound
from dl2d.sim.trace import from_workload
from dl2d.workload.seeds import seed_list
from dl2d.workload.workloads import packaged_workload

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_reference import artifact_config, means, pollux_trace, settings  # noqa: E402

FOLDERS = {"tuned": "workloads", "realistic": "workloads-realistic"}
GENERATED = {"generated-tuned": "tuned", "generated-realistic": "realistic"}


def workload_jobs(folder: str, k: int, load: float | None = None) -> list:
    """The jobs of workload ``k`` of a set, by arrival: a packaged Pollux workload, or a generated one (seed k)."""
    if folder in GENERATED:
        from dl2d.workload import philly  # noqa: PLC0415

        jobs = philly.generate(160, load=load, cluster_gpus=64, seed=k, style=GENERATED[folder])
    else:
        jobs = packaged_workload(k, FOLDERS[folder])
    return sorted(jobs, key=lambda j: j.arrival_s)


class BatchOnly(GoodputBatch):
    """The goodput batch on the inner policy's sizes, chosen as for jobs at their submitted batch (``NAME+batch``:
    the inner policy sees no job it may re-batch)."""

    def __call__(self, view):
        if view.adaptive is None or not np.any(view.adaptive) or not len(view):
            return self.inner(view)
        a = self.inner(replace(view, adaptive=None))
        return replace(a, batch_size=goodput_batches(view, a))


def scheduler_of(name: str, k: int, generations: int, baseline_rules: str):
    """(policy, adapts batches, is Pollux) for a row name."""
    if name == "pollux":
        from dl2d.policy.baselines.pollux import Pollux

        return Pollux(seed=k, generations=generations), True, True
    base, _, mode = name.partition("+")
    inner = registry.build(base, registry.PolicyOptions(baseline_rules=baseline_rules))
    if mode == "goodput":
        return GoodputBatch(inner), True, False
    if mode == "batch":
        return BatchOnly(inner), True, False
    if mode:
        raise SystemExit(f"unknown row {name!r}: NAME, NAME+goodput, NAME+batch or pollux")
    return inner, False, False


def run_one(name: str, folder: str, k: int, cfg, generations: int, baseline_rules: str,
            load: float | None = None) -> dict:
    jobs = workload_jobs(folder, k, load)
    policy, adapts, is_pollux = scheduler_of(name, k, generations, baseline_rules)
    trace = from_workload(jobs, cfg.slot_seconds, seed=k, interference_sigma=0.0, adaptive=adapts)
    if is_pollux:
        trace = pollux_trace(trace)
    t0 = time.perf_counter()
    res = E.run(trace, policy, cfg, seed=k)
    hours = np.asarray(res.jct_slots, float) * cfg.slot_seconds / 3600
    return {"policy": name, "workloads": folder, "workload": k, **({"load": load} if load is not None else {}),
            "avg_h": round(float(hours.mean()), 4),
            "p99_h": round(float(np.percentile(hours, 99)), 4), "decision_ms": round(float(res.decision_ms), 2),
            "took_s": round(time.perf_counter() - t0, 1)}


def bounds(folder: str, k: int, cfg, lp: bool = False, lp_buckets: int = 120, load: float | None = None) -> dict:
    """The lower bounds on the average JCT (hours) of workload k: every job at its submitted batch, and every job
    of a measured model adaptive (dl2d.sim.bound: each at its best batch too); with ``lp`` also the time-indexed
    program's at each (dl2d.sim.lp_bound, the adaptive one in its default parts on at most ``lp_buckets``
    buckets) and the seconds each took."""
    jobs = workload_jobs(folder, k, load)
    out = {}
    hours = cfg.slot_seconds / 3600
    for name, adaptive in (("fixed", False), ("adaptive", True)):
        trace = from_workload(jobs, cfg.slot_seconds, seed=k, interference_sigma=0.0, adaptive=adaptive)
        out[f"{name}_bound_h"] = round(lower_bound(trace, cfg).avg_jct_slots * hours, 4)
        if lp:
            t0 = time.perf_counter()
            b = lp_lower_bound(trace, cfg, **({"max_buckets": lp_buckets} if adaptive else {}))
            out[f"{name}_lp_bound_h"] = round(b.avg_jct_slots * hours, 4)
            out[f"{name}_lp_s"] = round(time.perf_counter() - t0, 1)
    return {"workloads": folder, "workload": k, **({"load": load} if load is not None else {}), **out}


def latency(names: list[str], n_jobs: int, slots: int, preset: str, generations: int) -> list[dict]:
    """Decision time a slot of each policy at ``n_jobs`` jobs (module docstring)."""
    from dl2d.sim.cluster import T4_NODE, ClusterSpec  # noqa: PLC0415

    pool = [j for folder in FOLDERS for k in range(1, 9) for j in packaged_workload(k, FOLDERS[folder])]
    jobs = [replace(pool[i % len(pool)], name=f"job-{i}", arrival_s=0.0) for i in range(n_jobs)]
    cfg = replace(artifact_config(preset), cluster=ClusterSpec(max(n_jobs // 4, 1), **T4_NODE))
    out = []
    for name in names:
        policy, _, is_pollux = scheduler_of(name, 1, generations, settings(preset)["baseline_rules"])
        trace = from_workload(jobs, cfg.slot_seconds, seed=1, interference_sigma=0.0, adaptive=True)
        trace = pollux_trace(trace) if is_pollux else trace
        state = replace(E.SimState.initial(len(trace)), slot=int(trace.arrival_slot.min()))
        rng = np.random.default_rng(0)
        ms = []
        for _ in range(slots):
            view = E.view_of(trace, state, cfg)
            t0 = time.perf_counter()
            alloc = policy(view)
            ms.append(1000 * (time.perf_counter() - t0))
            state, _, _ = E.step(trace, state, alloc, cfg, rng, view=view)
        rest = np.asarray(ms[1:])
        out.append({"policy": name, "jobs": n_jobs, "nodes": cfg.cluster.num_servers, "slots": slots,
                    "first_ms": round(ms[0], 1), "median_ms": round(float(np.median(rest)), 1),
                    "p90_ms": round(float(np.percentile(rest, 90)), 1), "max_ms": round(float(rest.max()), 1)})
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=("reference", "dl2d"), default="reference")
    ap.add_argument("--policies", default="elastic,elastic+batch,elastic+goodput")
    ap.add_argument("--workloads", default="tuned:1-8,realistic:1-8")
    ap.add_argument("--generations", type=int, default=30, help="pollux: its genetic search's generations")
    ap.add_argument("--lp", action="store_true",
                    help=f"the time-indexed LP bounds too (the adaptive one in {ADAPTIVE_PHASES} parts; minutes each)")
    ap.add_argument("--lp-buckets", type=int, default=120, help="the adaptive LP bound's most buckets")
    ap.add_argument("--restart-s", type=float, default=None,
                    help="seconds a (re)start costs, in place of the preset's 30 (0: what restarts cost the policies)")
    ap.add_argument("--loads", default="1,2", help="the generated workloads' loads")
    ap.add_argument("--adaptive-keep-gain", type=float, default=None,
                    help="elastic's keep gain for jobs whose batch the scheduler chooses (default its own)")
    ap.add_argument("--latency", type=int, default=0, metavar="J", help="the decision time at J jobs instead")
    ap.add_argument("--latency-slots", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.adaptive_keep_gain is not None:
        if not args.adaptive_keep_gain >= 0:
            ap.error("--adaptive-keep-gain must be >= 0")
        srtf.ADAPTIVE_KEEP_GAIN = args.adaptive_keep_gain
    if args.latency:
        if args.latency_slots < 2:
            ap.error("--latency-slots must be >= 2")
        rows = latency([p for p in args.policies.split(",") if p], args.latency, args.latency_slots, args.preset,
                       args.generations)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"command": "python " + shlex.join(["bench/bench_goodput.py", *sys.argv[1:]]),
                           "preset": args.preset, "rows": rows}, f, indent=1)
        return
    sets = []
    for part in args.workloads.split(","):
        folder, _, ks = part.partition(":")
        if folder in GENERATED:
            sets += [(folder, k, float(load)) for load in args.loads.split(",") for k in seed_list(ks or "100-103")]
        elif folder in FOLDERS:
            sets += [(folder, k, None) for k in seed_list(ks or "1-8")]
        else:
            ap.error(f"--workloads: {folder!r} is not one of {', '.join([*FOLDERS, *GENERATED])}")
    chosen = settings(args.preset)
    cfg = artifact_config(args.preset)
    if args.restart_s is not None:
        if not args.restart_s >= 0:
            ap.error("--restart-s must be >= 0")
        cfg = replace(cfg, resize_overhead_s=args.restart_s)
    out = {"command": "python " + shlex.join(["bench/bench_goodput.py", *sys.argv[1:]]), "preset": args.preset,
           "settings": chosen, "cluster": "t4-16", "slot_seconds": cfg.slot_seconds,
           "restart_s": cfg.resize_overhead_s, "adaptive_keep_gain": srtf.ADAPTIVE_KEEP_GAIN, "rows": [], "means": {}}
    t0 = time.perf_counter()
    out["bounds"] = []
    for folder, k, load in sets:
        out["bounds"].append(bounds(folder, k, cfg, args.lp, args.lp_buckets, load))
        print(json.dumps(out["bounds"][-1]), flush=True)
    for name in [p for p in args.policies.split(",") if p]:
        rows = [run_one(name, folder, k, cfg, args.generations, chosen["baseline_rules"], load)
                for folder, k, load in sets]
        for r in rows:
            print(json.dumps(r), flush=True)
        out["rows"] += rows
        keys = ("avg_h", "p99_h", "decision_ms")
        by_set = {folder: means(mine, keys) for folder in [*FOLDERS, *GENERATED]
                  if (mine := [r for r in rows if r["workloads"] == folder])}
        out["means"][name] = {**by_set, "all": means(rows, keys)}
        print(json.dumps({"policy": name, "means": out["means"][name]}), flush=True)
    out["took_s"] = round(time.perf_counter() - t0, 1)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
