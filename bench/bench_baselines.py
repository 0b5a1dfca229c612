"""DL2's baselines at the paper's simulation scale (DL2 section 6.2, Fig. 9), over several trace seeds.

Every baseline (DRF, Tetris, Optimus, FIFO, SRTF) runs on the same generated traces (200 jobs, daily arrival
pattern, at most 10 arrivals per slot, measured speeds, interference sigma 0.27, slot noise 0.1: the
defaults of `dl2ctl sim`) on the "dl2" cluster preset (500 servers of 2 GPUs / 8 cores / 48 GB). The
simulator's noise seed is the trace seed. A Tetris task-threshold sweep (bundles Tetris gives the chosen
job before it moves to the next one) runs on the same traces.

Reported per policy: average JCT (slots and hours), makespan, GPU and CPU utilisation (allocated / total,
mean over slots), the simulation's wall time and the scheduler's mean decision time per slot; per seed and
as mean and standard deviation over the seeds.

    python bench/bench_baselines.py [--seeds 10000 10001 10002] [--thresholds 1 2 4 8] [--out docs/bench]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dl2d.policy.baselines import heuristics as B
from dl2d.policy.registry import make_heuristic
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.sim.cluster import preset

METRICS = ("avg_jct_slots", "avg_jct_hours", "makespan_slots", "makespan_hours", "gpu_util", "cpu_util", "wall_s",
           "decision_ms")


def policies(thresholds) -> dict:
    out = {name: make_heuristic(name) for name in ("drf", "tetris", "optimus", "fifo", "srtf")}
    for k in thresholds:
        out[f"tetris(k={k})"] = functools.partial(B.tetris, task_threshold=k)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[10000, 10001, 10002])
    ap.add_argument("--cluster", default="dl2")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--thresholds", type=int, nargs="*", default=[1, 2, 4, 8],
                    help="Tetris task thresholds to sweep (the default Tetris uses the per-job maximum, 16)")
    ap.add_argument("--out", type=Path, default=Path("docs/bench"))
    args = ap.parse_args()

    spec = preset(args.cluster)
    cfg = E.SimConfig(cluster=spec)
    tcfg = T.TraceConfig(num_jobs=args.jobs)
    pols = policies(args.thresholds)
    console = Console(stderr=True)
    rows: list[dict] = []
    t0 = time.perf_counter()
    columns = (TextColumn("{task.description:>16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        overall = progress.add_task("all runs", total=len(args.seeds) * len(pols))
        for seed in args.seeds:
            trace = T.generate(tcfg, seed=seed)
            for name, policy in pols.items():
                task = progress.add_task(f"{name} s{seed}", total=len(trace))

                def on_slot(state, task=task):
                    progress.update(task, completed=int(np.sum(~np.isnan(state.finish_time))))

                res = E.run(trace, policy, cfg, seed=seed, on_slot=on_slot, name=name)
                progress.remove_task(task)
                progress.advance(overall)
                s = res.summary()
                rows.append({"seed": seed, **{k: s[k] for k in ("policy", *METRICS, "per_type_jct_hours")}})
                console.log(f"seed {seed} {name:>14}: avg JCT {s['avg_jct_slots']:.2f} slots, "
                            f"makespan {s['makespan_slots']:.1f}, GPU util {s['gpu_util']:.3f}, {s['wall_s']:.1f} s")

    summary = {}
    for name in pols:
        mine = [r for r in rows if r["policy"] == name]
        summary[name] = {k: {"mean": round(float(np.mean([r[k] for r in mine])), 4),
                             "std": round(float(np.std([r[k] for r in mine])), 4)} for k in METRICS}
    out = {
        "setting": {"cluster": args.cluster, "servers": spec.num_servers, "jobs": args.jobs, "seeds": args.seeds,
                    "trace": {k: v for k, v in vars(tcfg).items()}, "slot_seconds": cfg.slot_seconds,
                    "speed_model": cfg.speed_model, "slot_noise": cfg.slot_noise, "max_workers": cfg.max_workers,
                    "max_ps": cfg.max_ps},
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "total_wall_s": round(time.perf_counter() - t0, 1),
        "runs": rows,
        "summary": summary,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "baselines_bench.json"
    path.write_text(json.dumps(out, indent=1, default=list) + "\n")

    table = Table(title=f"{args.jobs} jobs on {spec.num_servers} servers, seeds {', '.join(map(str, args.seeds))} "
                        f"(mean ± std over seeds)")
    for col in ("policy", "avg JCT slots", "avg JCT h", "makespan slots", "GPU util", "CPU util", "sim wall s",
                "ms/slot"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, m in summary.items():
        f = lambda k, d=2: f"{m[k]['mean']:.{d}f} ± {m[k]['std']:.{d}f}"  # noqa: E731
        table.add_row(name, f("avg_jct_slots"), f("avg_jct_hours"), f("makespan_slots", 1), f("gpu_util", 3),
                      f("cpu_util", 3), f("wall_s", 1), f("decision_ms", 1))
    Console().print(table)
    console.print(f"wrote {path} ({out['total_wall_s']} s in all)")


if __name__ == "__main__":
    main()
