"""Every policy in today's world: the Pollux workloads on 64 GPUs and a generated Philly workload on 512.

Part 1 runs the 16 packaged Pollux workloads (8 as Pollux's evaluation tuned them, `workloads/`, 8 as users
submitted them, `workloads-realistic/`; 160 jobs each, Philly-derived) on the measured cluster (t4-16: 16
nodes of 4 T4 GPUs) with today's settings (dl2d.sim.worlds: 60 s slots, 30 s restarts, 10 % shared-node
slowdown, slot noise, hidden interference). Part 2 draws a Philly workload at 2x load on 512 GPUs (t4-128).
For each: average and p99 JCT, makespan, GPU utilisation, resizes (allocation changes: starts, restarts,
preemptions), and the lower bound (dl2d.sim.bound). The trace seeds here (workload k uses seed k; the Philly
workload seed 2000) are used by no training and by no tuning (elastic's settings were chosen on Philly
seeds 100-103).

A policy named ``NAME+whole`` is NAME with the site's whole nodes for multi-node jobs (``policy.whole_nodes``).

    python bench/bench_today.py [--policies slurm,tiresias,...,elastic+whole,dl2-target@online[:T[:EXPLORE]]] [--folders workloads,...]
        [--philly-jobs 1280] [--skip-philly] [--allreduce-placement spread|pack] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console

from dl2d.core.contract import ALLREDUCE_PLACEMENTS
from dl2d.policy import registry
from dl2d.sim import engine as E
from dl2d.sim.bound import lower_bound
from dl2d.sim.trace import from_workload
from dl2d.sim.worlds import world
from dl2d.workload import philly
from dl2d.workload.workloads import FOLDERS, WORKLOADS, packaged_workload

MAX_SLOTS = 20_160  # 14 days of 60 s slots: a policy still running a 160-job workload then is reported as such
DEFAULT_POLICIES = ("slurm", "tiresias", "fifo", "srtf", "drf", "tetris", "optimus", "elastic", "optimus-oracle",
                    "oracle")


def contended_util(trace, res, gpus: float) -> tuple[float, float]:
    """(GPU utilisation over the slots in which the jobs present asked for at least the cluster's GPUs, the share
    of slots that were so). The plain mean over the makespan is dominated, on Philly's heavy tail, by the days
    one long job runs alone; this asks instead whether a policy leaves GPUs idle while jobs want them."""
    first = int(trace.arrival_slot.min())
    slots = first + np.arange(len(res.gpu_util))
    finish = trace.submitted + res.jct_slots
    asked = np.array([float(trace.requested[(trace.arrival_slot <= t) & (finish > t)].sum()) for t in slots])
    busy = asked >= gpus
    if not busy.any():
        return float("nan"), 0.0
    return float(np.mean(res.gpu_util[busy])), float(np.mean(busy))


def build(name: str, seed: int):
    """A registered policy; ``NAME@online`` (``NAME@online:T``, ``NAME@online:T:EXPLORE``): that learned policy
    learning online from the shipped checkpoint (sampling at temperature T, for the jobs EXPLORE says:
    ``policy.online_explore``), one learner per workload (dl2d.policy.target.online), as the daemon runs it with
    ``policy.online_rl``; ``NAME+whole``: with whole nodes for multi-node jobs (``policy.whole_nodes``)."""
    name, whole, rest = name.partition("+whole")
    if rest:
        raise ValueError(f"+whole ends a policy's name, got {name + whole + rest!r}")
    base, _, online = name.partition("@")
    if whole and "whole_nodes" not in registry.get(base).options:
        raise ValueError(f"{base} cannot give whole nodes (+whole)")
    if not online:
        return registry.build(name, registry.PolicyOptions(whole_nodes=bool(whole)))
    from dl2d.policy.target.online import as_scheduler

    _, _, rest = online.partition(":")
    temperature, _, explore = rest.partition(":")
    options = registry.PolicyOptions(online_rl=True, seed=seed, online_temperature=float(temperature or 1.0),
                                     online_explore=explore or registry.PolicyOptions.online_explore,
                                     whole_nodes=bool(whole))
    return as_scheduler(registry.build(base, options))


def one(trace, cfg, policies, seed: int, label: str, status, console) -> dict:
    bound = lower_bound(trace, cfg)
    h = cfg.slot_seconds / 3600
    row = {"workload": label, "jobs": len(trace), "bound_h": round(bound.avg_jct_slots * h, 4), "policies": {}}
    for name in policies:
        status.update(f"{label}: {name}")
        try:
            res = E.run(trace, build(name, seed), cfg, seed=seed)
        except RuntimeError:  # cfg.max_slots passed with jobs left: the policy did not finish the workload
            row["policies"][name] = {"unfinished": True}
            continue
        util_busy, busy_share = contended_util(trace, res, float(cfg.cluster.capacity[0]))
        console.log(f"{label}: {name} {res.avg_jct_hours:.3f} h avg JCT ({res.wall_s:.1f} s)")
        row["policies"][name] = {
            "avg_jct_h": round(res.avg_jct_hours, 4),
            "p99_jct_h": round(float(np.percentile(res.jct_slots, 99)) * h, 4),
            "makespan_h": round(res.makespan_slots * h, 3), "gpu_util": round(float(np.mean(res.gpu_util)), 4),
            "gpu_util_contended": round(util_busy, 4), "contended_share": round(busy_share, 4),
            "resizes": res.resizes, "decision_ms": round(res.decision_ms, 3), "wall_s": round(res.wall_s, 2)}
    return row


def mean_over(rows, policies) -> dict:
    out = {"bound_h": round(float(np.mean([r["bound_h"] for r in rows])), 3)}
    for p in policies:
        unfinished = sum(bool(r["policies"][p].get("unfinished")) for r in rows)
        if unfinished:
            out[p] = {"unfinished": unfinished, "of": len(rows)}
            continue
        out[p] = {k: round(float(np.mean([r["policies"][p][k] for r in rows])), 3)
                  for k in ("avg_jct_h", "p99_jct_h", "makespan_h", "gpu_util", "gpu_util_contended",
                            "contended_share", "resizes", "decision_ms")}
    return out


def markdown(title: str, summary: dict, policies, days: float) -> str:
    base = summary["slurm"].get("avg_jct_h") if "slurm" in summary else None
    lines = [f"**{title}** (lower bound on the average JCT: {summary['bound_h']:.2f} h)", "",
             "| policy | avg JCT h | vs slurm | p99 JCT h | makespan h | GPU util | util contended (share) | resizes "
             "| ms a slot |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in policies:
        s = summary[p]
        if "unfinished" in s:
            lines.append(f"| {p} | did not finish {s['unfinished']} of {s['of']} within {days:.0f} days | | | | | | | |")
            continue
        vs = f"{100 * (s['avg_jct_h'] / base - 1):+.0f}%" if base else ""
        lines.append(f"| {p} | {s['avg_jct_h']:.2f} | {vs} | {s['p99_jct_h']:.2f} | {s['makespan_h']:.1f} | "
                     f"{s['gpu_util']:.2f} | {s['gpu_util_contended']:.2f} ({s['contended_share']:.2f}) | "
                     f"{s['resizes']:.0f} | {s['decision_ms']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--philly-jobs", type=int, default=1280)
    ap.add_argument("--philly-seed", type=int, default=2000)
    ap.add_argument("--skip-philly", action="store_true")
    ap.add_argument("--folders", default=",".join(FOLDERS), help="the Pollux folders to run (none: '')")
    ap.add_argument("--out", type=Path, help="write every row as JSON here")
    ap.add_argument("--allreduce-placement", choices=ALLREDUCE_PLACEMENTS, default=None,
                    help="where all-reduce workers go (default: the world's)")
    args = ap.parse_args()
    placement = {} if args.allreduce_placement is None else {"allreduce_placement": args.allreduce_placement}
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:  # a bad name fails here, not after the first workload's runs
        try:
            registry.get(p.partition("+whole")[0].partition("@")[0])
            if "+whole" in p:
                build(p, 0)
        except ValueError as e:
            ap.error(f"--policies: {e}")
    today = world("today")
    console = Console(stderr=True)
    t0 = time.time()
    rows: dict[str, list] = {}
    with console.status("simulating") as status:
        cfg = today.sim_config("t4-16", max_slots=MAX_SLOTS, **placement)
        for folder in filter(None, args.folders.split(",")):
            if folder not in FOLDERS:
                ap.error(f"--folders: {folder!r} is not one of {', '.join(FOLDERS)}")
            for k in WORKLOADS:
                trace = from_workload(packaged_workload(k, folder), cfg.slot_seconds, seed=k)
                rows.setdefault(folder, []).append(one(trace, cfg, policies, k, f"{folder}/{k}", status, console))
        if not args.skip_philly:
            cfg = today.sim_config("t4-128", max_slots=MAX_SLOTS, **placement)
            gpus = int(cfg.cluster.capacity[0])
            jobs = philly.generate(args.philly_jobs, load=2.0, cluster_gpus=gpus, seed=args.philly_seed,
                                   max_gpus=today.max_workers)
            trace = from_workload(jobs, cfg.slot_seconds, seed=args.philly_seed)
            rows["philly-2x-512"] = [one(trace, cfg, policies, args.philly_seed, "philly 2x on 512 GPUs", status,
                                             console)]
    titles = {"workloads": "Pollux workloads (tuned), 8 x 160 jobs on 64 GPUs, means",
              "workloads-realistic": "Pollux workloads-realistic, 8 x 160 jobs on 64 GPUs, means",
              "philly-2x-512": f"Philly workload at 2x load, {args.philly_jobs} jobs on 512 GPUs"}
    report = {name: mean_over(r, policies) for name, r in rows.items()}
    for name, summary in report.items():
        print(markdown(titles[name], summary, policies, MAX_SLOTS * today.slot_seconds / 86400))
        print()
    took = time.time() - t0
    console.print(f"took {took:.0f} s")
    if args.out:
        command = "python bench/bench_today.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        args.out.write_text(json.dumps({"command": command, "took_s": round(took), "rows": rows, "means": report},
                                       indent=1))


if __name__ == "__main__":
    main()
