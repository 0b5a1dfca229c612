"""The planning scheduler (`lp-plan`, dl2d.policy.planning.lp_plan) against the best heuristics and the LP bound, and the
same planner on the speeds the simulator trains with (a reference: what a scheduler that knew them would get).

In the DL2 world a scheduler believes a PS job's speed by its type's parametric fit (the view's est_speed); the
simulator trains it at the DL2 authors' measured table. In today's world the view's est_speed is the measured
curve at the packed placement and the registered planner fits its own from what it observes (as Optimus).

    python bench/bench_plan.py --world dl2 --cluster small --jobs 40 --seeds 0-4 [--bucket-slots 0.25]
        [--policies lp-plan,optimus-relative] [--no-bound] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

from dl2d.policy import registry
from dl2d.policy.target import train as TT
from dl2d.policy.baselines.optimus import FittedOptimus
from dl2d.policy.planning.lp_plan import lp_plan, on_measured_speeds
from dl2d.sim import engine as E
from dl2d.sim.lp_bound import lp_lower_bound


def seed_range(text: str) -> range:
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", default="dl2", choices=("dl2", "today"))
    ap.add_argument("--cluster", default=None, help="the world's preset (default: the training setup's)")
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--seeds", default="0-4", help="trace seeds, LO-HI")
    ap.add_argument("--policies", default="lp-plan,optimus-relative,optimus,elastic",
                    help="registered policies beside the planner on the measured speeds")
    ap.add_argument("--bucket-slots", type=float, default=1.0, help="the bound's buckets, in slots")
    ap.add_argument("--no-bound", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    setup = TT.TrainSetup(world=args.world, cluster=args.cluster, jobs=args.jobs)
    cfg = TT.sim_config(setup)
    seeds = seed_range(args.seeds)
    traces = [TT.make_trace(setup, cfg, s) for s in seeds]
    # lp-plan: the program every slot on the fitted Optimus's speeds (no longer registered: the relative Optimus
    # does better on testbed's held-out traces, docs/ARCHITECTURE.md)
    makers = {n: (lambda n=n: FittedOptimus(rule=lp_plan, name="lp-plan") if n == "lp-plan" else
                  registry.build(n, registry.PolicyOptions(world=args.world))) for n in args.policies.split(",") if n}
    makers["lp-plan-measured"] = lambda: on_measured_speeds(cfg)
    out = {}
    for name, make in makers.items():
        t0 = time.perf_counter()
        jcts = [round(float(E.run(t, make(), cfg, seed=s).jct_slots.mean()), 2) for s, t in zip(seeds, traces)]
        out[name] = {"per_trace": jcts, "mean": round(float(np.mean(jcts)), 3),
                     "seconds": round(time.perf_counter() - t0, 1)}
        print(json.dumps({"policy": name, **out[name]}), flush=True)
    if not args.no_bound:
        nominal = dataclasses.replace(cfg, slot_noise=0.0)
        per = [lp_lower_bound(t, nominal, bucket_s=args.bucket_slots * cfg.slot_seconds).avg_jct_slots
               for t in traces]
        out["lp_bound_nominal"] = {"per_trace": [round(b, 3) for b in per], "mean": round(float(np.mean(per)), 3)}
        print(json.dumps({"policy": "lp_bound_nominal", **out["lp_bound_nominal"]}), flush=True)
    summary = {"summary": True, "world": setup.world, "cluster": setup.cluster, "jobs": setup.jobs,
               "seeds": [seeds.start, seeds.stop - 1], "results": out}
    if "lp_bound_nominal" in out:
        summary["vs_bound"] = {n: round(out[n]["mean"] / out["lp_bound_nominal"]["mean"] - 1, 4)
                               for n in makers}
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
