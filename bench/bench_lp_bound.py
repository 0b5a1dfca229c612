"""How far below "Slurm as it is" can any scheduler get in today's world? The LP bound (dl2d.sim.lp_bound) on the
workloads of bench_today.py, at the slot noise's upper end (a bound for every run) and at nominal speed (what
bounds the expected average JCT over the noise's draws), beside the policies' figures of a bench_today JSON.

Why two: the noise multiplies a job's speed by 1 + noise x U(-1, 1) every slot, independently. A bound for every
draw must assume 1 + noise throughout. In expectation, a job of W epochs trained at most r (1 + e_t) in slot t
for time_t, a decreasing function of e_t (a high draw can end it early), has E[e_t time_t] <= 0, so W <= r E[T]:
each job alone at its fastest nominal speed bounds its expected JCT; the program at nominal speed is that bound
too, up to each job's last slot (docs/BENCHMARKS.md says how to read it).

    python bench/bench_lp_bound.py [--results docs/bench/today_every_policy.json]
        [--folders workloads,workloads-realistic] [--skip-philly] [--out docs/bench/lp_bound_pollux.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console

from dl2d.sim.lp_bound import lp_lower_bound
from dl2d.sim.trace import from_workload
from dl2d.sim.worlds import world
from dl2d.workload import philly
from dl2d.workload.workloads import FOLDERS, WORKLOADS, packaged_workload

PHILLY = "philly-2x-512"


def bounds(trace, cfg, max_buckets: int) -> dict:
    """The LP bound in hours at the configured noise and at nominal speed, with how it was solved."""
    h = cfg.slot_seconds / 3600
    out = {}
    for label, c in (("noise", cfg), ("nominal", dataclasses.replace(cfg, slot_noise=0.0))):
        b = lp_lower_bound(trace, c, max_buckets=max_buckets)
        out[label] = {"bound_h": round(b.avg_jct_slots * h, 4), "lp_h": round(b.lp_slots * h, 4),
                      "no_contention_h": round(b.no_contention_slots * h, 4),
                      "capacity_h": round(b.capacity_slots * h, 4), "bucket_s": b.bucket_s,
                      "columns": b.columns, "tail_share": round(b.tail_share, 6), "solve_s": round(b.solve_s, 1)}
    return out


def policy_rows(results: Path | None) -> dict:
    """{workload label: {policy: avg JCT h}} from a bench_today JSON (empty without one)."""
    if results is None:
        return {}
    data = json.loads(results.read_text())
    return {r["workload"]: {p: v["avg_jct_h"] for p, v in r["policies"].items() if "avg_jct_h" in v}
            for rows in data["rows"].values() for r in rows}


def summary(rows: list[dict]) -> dict:
    out = {"bound_noise_h": round(float(np.mean([r["noise"]["bound_h"] for r in rows])), 3),
           "bound_nominal_h": round(float(np.mean([r["nominal"]["bound_h"] for r in rows])), 3),
           "alone_nominal_h": round(float(np.mean([r["nominal"]["no_contention_h"] for r in rows])), 3)}
    if all("slurm_h" in r for r in rows):
        out["slurm_h"] = round(float(np.mean([r["slurm_h"] for r in rows])), 3)
        out["target_h"] = round(out["slurm_h"] / 2, 3)  # the target of 50 % below Slurm as it is
        out["bound_noise_vs_slurm"] = round(out["bound_noise_h"] / out["slurm_h"] - 1, 3)
        out["bound_nominal_vs_slurm"] = round(out["bound_nominal_h"] / out["slurm_h"] - 1, 3)
        best = min((p for p in rows[0]["policies"] if p not in ("slurm",)),
                   key=lambda p: np.mean([r["policies"].get(p, np.inf) for r in rows]))
        out["best_policy"] = best
        out["best_h"] = round(float(np.mean([r["policies"][best] for r in rows])), 3)
        out["best_vs_nominal_bound"] = round(out["best_h"] / out["bound_nominal_h"] - 1, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="docs/bench/today_every_policy.json",
                    help="a bench_today.py JSON whose policies' figures go beside the bounds ('' for none)")
    ap.add_argument("--folders", default=",".join(FOLDERS))
    ap.add_argument("--skip-philly", action="store_true")
    ap.add_argument("--philly-jobs", type=int, default=1280)
    ap.add_argument("--philly-seed", type=int, default=2000)
    ap.add_argument("--max-buckets", type=int, default=400, help="the Pollux workloads' time buckets")
    ap.add_argument("--philly-buckets", type=int, default=100, help="the Philly workload's (1280 jobs)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = Path(args.results) if args.results else None
    if results is not None and not results.is_file():
        ap.error(f"--results: no file {results} (bench/bench_today.py --out makes one; '' for none)")
    known = policy_rows(results)
    today = world("today")
    console = Console(stderr=True)
    t0 = time.time()
    rows: dict[str, list] = {}

    def add(group: str, label: str, trace, cfg, buckets: int) -> None:
        row = {"workload": label, "jobs": len(trace), **bounds(trace, cfg, buckets)}
        if label in known:
            row["policies"] = known[label]
            if "slurm" in known[label]:
                row["slurm_h"] = known[label]["slurm"]
        console.log(f"{label}: bound {row['noise']['bound_h']:.3f} h, nominal {row['nominal']['bound_h']:.3f} h"
                    + (f", slurm {row['slurm_h']:.3f} h" if "slurm_h" in row else ""))
        rows.setdefault(group, []).append(row)

    cfg = today.sim_config("t4-16")
    for folder in filter(None, args.folders.split(",")):
        if folder not in FOLDERS:
            ap.error(f"--folders: {folder!r} is not one of {', '.join(FOLDERS)}")
        for k in WORKLOADS:
            add(folder, f"{folder}/{k}", from_workload(packaged_workload(k, folder), cfg.slot_seconds, seed=k), cfg,
                args.max_buckets)
    if not args.skip_philly:
        cfg = today.sim_config("t4-128")
        jobs = philly.generate(args.philly_jobs, load=2.0, cluster_gpus=int(cfg.cluster.capacity[0]),
                               seed=args.philly_seed, max_gpus=today.max_workers)
        add(PHILLY, "philly 2x on 512 GPUs", from_workload(jobs, cfg.slot_seconds, seed=args.philly_seed), cfg,
            args.philly_buckets)
    # the command as typed (quoted so that it runs again as it stands: an empty --results stays '')
    out = {"command": "python bench/bench_lp_bound.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
           "rows": rows, "summary": {g: summary(r) for g, r in rows.items()}, "wall_s": round(time.time() - t0)}
    print(json.dumps(out["summary"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
