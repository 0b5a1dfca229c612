"""What one solve of the planner's program costs as the jobs grow (dl2d.policy.planning.lp_plan.plan, the in-bucket term
on): J jobs of the DL2 world all waiting at once (the worst slot: every job planned from scratch), on the
learned speed table (dl2d.policy.planning.learned_speeds), the `small` cluster up to 100 jobs and the `dl2` one above.
What a network that reads the program's first slot as features would pay each slot.

    python bench/bench_plan_scale.py --jobs 40 100 200 400 1000
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

from dl2d.policy.planning import learned_speeds as LS
from dl2d.policy.planning import lp_plan as LP
from dl2d.sim import engine as E
from dl2d.sim.cluster import preset
from dl2d.sim.trace import TraceConfig, generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[40, 100, 200, 400])
    args = ap.parse_args()
    if min(args.jobs) < 1:
        raise SystemExit("--jobs must be at least 1")
    table = LS.load()[0]
    for jobs in args.jobs:
        trace = generate(TraceConfig(num_jobs=jobs, max_arrivals_per_slot=jobs), seed=1)
        cluster = "dl2" if jobs > 100 else "small"
        cfg = E.SimConfig(cluster=preset(cluster))
        state = replace(E.SimState.initial(len(trace)), slot=int(trace.arrival_slot.max()))
        view = LP.measured_view(E.view_of(trace, state, cfg), table)
        t0 = time.perf_counter()
        plan = LP.plan(view, in_bucket=8)
        t1 = time.perf_counter()
        LP.first_slot(view, plan)
        print(json.dumps({"jobs": jobs, "active": len(view), "cluster": cluster,
                          "solve_s": round(t1 - t0, 2), "rounding_s": round(time.perf_counter() - t1, 3)}), flush=True)


if __name__ == "__main__":
    main()
