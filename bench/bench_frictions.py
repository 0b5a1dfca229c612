"""Where today's world's policies lose time on the Pollux workloads: the same runs with each of its frictions
turned off in turn (a resize's restart, the slot noise, the shared-node slowdown), and all of them at once.

Why: the target for a learned policy is 15 % below the best heuristic on the all-reduce world's workloads,
where the LP bound (bench/bench_lp_bound.py) leaves far more room than that; what the bound does not count
(restarts after the first, noise draws, placement) is paid by every schedule, so this says how much of a
policy's distance from the bound is those frictions and how much is its rule. Policies are the registry's; the
trace seed is the workload's number, as bench/bench_today.py.

    python bench/bench_frictions.py [--folder workloads] [--policies elastic,dl2-target] [--efficiencies 0.6,0.8]
        [--variants "as is,none of the three"] [--out FILE.jsonl]

``--efficiencies`` adds elastic at other efficiency thresholds (``0.8``; ``0.7n`` with whole nodes, as
bench/bench_styles.py names them): how good elastic's shape gets once the frictions are gone.
"""
from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time

import numpy as np

from dl2d.policy import registry
from dl2d.sim import engine as E
from dl2d.sim.trace import from_workload
from dl2d.sim.worlds import world
from dl2d.workload.workloads import FOLDERS, WORKLOADS, packaged_workload

from bench_today import MAX_SLOTS
from bench_styles import label, variant
from jsonl_rows import Rows


#: each variant's changes to today's SimConfig
VARIANTS = {
    "as is": {},
    "no restart cost": {"resize_overhead_s": 0.0},
    "no noise": {"slot_noise": 0.0},
    "no shared-node slowdown": {"shared_node_slowdown": 0.0},
    "none of the three": {"resize_overhead_s": 0.0, "slot_noise": 0.0, "shared_node_slowdown": 0.0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default="workloads", help=f"one of {', '.join(FOLDERS)}")
    ap.add_argument("--policies", default="elastic,dl2-target")
    ap.add_argument("--efficiencies", default="", help="elastic at these thresholds too (0.8, 0.7n: whole nodes)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"of: {', '.join(VARIANTS)}")
    ap.add_argument("--out", default=None, help="also write the JSON lines here")
    args = ap.parse_args()
    if args.folder not in FOLDERS:
        ap.error(f"--folder: {args.folder!r} is not one of {', '.join(FOLDERS)}")
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [n for n in names if n not in registry.names()]
    if unknown:
        ap.error(f"--policies: unknown {unknown}; registered: {', '.join(registry.names())}")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: {args.variants!r}: each must be one of {', '.join(VARIANTS)}")
    base = world("today").sim_config("t4-16", max_slots=MAX_SLOTS)
    makers = {n: (lambda n=n: registry.build(n)) for n in names}
    for text in (e.strip() for e in args.efficiencies.split(",") if e.strip()):
        try:
            rule = variant(text, base)
        except ValueError as e:
            ap.error(f"--efficiencies: {text!r}: {e}")
        makers[f"elastic@{label(text)}"] = lambda rule=rule: rule
    if not makers:
        ap.error("nothing to run: give --policies or --efficiencies")
    out = Rows(args.out)
    out.add({"command": shlex.join(["python", "bench/bench_frictions.py", *sys.argv[1:]]),
              "base": {k: getattr(base, k) for k in ("slot_seconds", "slot_noise", "resize_overhead_s",
                                                     "shared_node_slowdown", "allreduce_placement")}})
    for name_of_variant in variants:
        cfg = dataclasses.replace(base, **VARIANTS[name_of_variant])
        row = {"folder": args.folder, "variant": name_of_variant}
        t0 = time.perf_counter()
        for name, make in makers.items():
            jct = [E.run(from_workload(packaged_workload(k, args.folder), cfg.slot_seconds, seed=k),
                         make(), cfg, seed=k).avg_jct_hours for k in WORKLOADS]
            row[name] = round(float(np.mean(jct)), 3)
            row[f"{name}_per_workload"] = [round(float(j), 3) for j in jct]
        row["seconds"] = round(time.perf_counter() - t0, 1)
        out.add(row)
    out.close()


if __name__ == "__main__":
    main()
