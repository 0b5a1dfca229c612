"""How far below Optimus can any scheduler get on this simulator? The speed oracle's JCT bound per trace.

Runs the speed oracle (dl2d.policy.baselines.oracle: every job its fastest configuration on the simulator's own speed
table) beside Optimus and DRF on the same traces, with the configured slot noise and with none. Where the
oracle never had to give a job less than its fastest configuration ("binding job-slots" 0), its average JCT
is a lower bound for every scheduler on that trace, so "oracle vs Optimus" is the most any scheduler (DL2
included) could beat Optimus by there.

    python bench/bench_jct_bound.py [--cluster dl2] [--jobs 200] [--seeds 10000 10001 10002] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dl2d.policy.registry import make_heuristic
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.sim.cluster import preset
from dl2d.policy.baselines.oracle import SpeedOracle


def one_trace(cluster: str, jobs: int, seed: int, slot_noise: float) -> dict:
    cfg = E.SimConfig(cluster=preset(cluster), slot_noise=slot_noise)
    trace = T.generate(T.TraceConfig(num_jobs=jobs), seed=seed)
    oracle = SpeedOracle(cfg.speed_model)
    row = {"cluster": cluster, "jobs": jobs, "seed": seed, "slot_noise": slot_noise,
           "oracle": E.run(trace, oracle, cfg, seed=seed).avg_jct_slots, "binding_job_slots": oracle.short_job_slots}
    for name in ("optimus", "drf"):
        row[name] = E.run(trace, make_heuristic(name), cfg, seed=seed).avg_jct_slots
    row["oracle_vs_optimus_pct"] = 100 * (row["oracle"] / row["optimus"] - 1)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="dl2")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[10000, 10001, 10002])
    ap.add_argument("--noise", type=float, nargs="+", default=[E.SimConfig.slot_noise, 0.0],
                    help="slot noise levels to run (default: the simulator's default and none)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = ap.parse_args()
    console = Console(stderr=True)
    rows = []
    with console.status("simulating") as status:
        for noise in args.noise:
            for seed in args.seeds:
                status.update(f"{args.cluster}, {args.jobs} jobs, seed {seed}, slot noise {noise}")
                rows.append(one_trace(args.cluster, args.jobs, seed, noise))
    table = Table(title=f"JCT bound: {args.cluster} cluster, {args.jobs} jobs (avg JCT in slots)")
    for col in ("seed", "slot noise", "oracle", "binding job-slots", "optimus", "drf", "oracle vs optimus"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["seed"]), str(r["slot_noise"]), f"{r['oracle']:.2f}", str(r["binding_job_slots"]),
                      f"{r['optimus']:.2f}", f"{r['drf']:.2f}", f"{r['oracle_vs_optimus_pct']:+.1f}%")
    Console().print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command_args": vars(args) | {"out": args.out.name}, "rows": rows},
                                       indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
