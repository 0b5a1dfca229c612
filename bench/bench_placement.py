"""Placement benchmark: every baseline with its own placement, re-placed by plain load balancing
(the control), by DLTAP and by DLTAP with worker packing, and the dual-agent scheduler, on the same traces
with the cross-node communication model and heterogeneous, fluctuating servers on.

    python bench/bench_placement.py --jobs 40 --servers 20 --seeds 1 --out docs/bench/placement_bench.json
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from dl2d.policy.seeds.dual_agent import DualAgent
from dl2d.policy.seeds.dual_agent_train import train_ordering_cem
from dl2d.sim import engine as E
from dl2d.sim import hetero
from dl2d.policy.registry import make_heuristic, names as policy_names
from dl2d.sim.cluster import ClusterSpec
from dl2d.policy.seeds.dltap import with_dltap
from dl2d.sim.trace import TraceConfig, generate

VARIANTS = {
    "own": lambda s: s,
    "lb": lambda s: with_dltap(s, weight=0.0),
    "dltap": lambda s: with_dltap(s),
    "dltap-pack": lambda s: with_dltap(s, pack_workers=True),
}


def metrics(r: E.SimResult) -> dict:
    s = r.summary()
    return {k: s[k] for k in ("avg_jct_hours", "makespan_hours", "gpu_util", "cpu_util", "cross_node_gb_total",
                              "cross_node_fraction", "unplaced_tasks", "wall_s")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--servers", type=int, default=20)
    ap.add_argument("--arrivals", type=int, default=5, help="max arrivals per slot")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--walk-sigma", type=float, default=0.1)
    ap.add_argument("--cem-iters", type=int, default=0, help="CEM iterations for the ordering agent (0: SRTF theta)")
    ap.add_argument("--out", default="docs/bench/placement_bench.json")
    args = ap.parse_args(argv)

    cfg = E.SimConfig(cluster=ClusterSpec(args.servers), cross_node_comm=True,
                      server_speed_classes=hetero.THREE_GENERATIONS, speed_walk_sigma=args.walk_sigma)
    tcfg = TraceConfig(num_jobs=args.jobs, max_arrivals_per_slot=args.arrivals)
    t0 = time.perf_counter()
    theta, cem_hist = None, []
    if args.cem_iters:
        train = [generate(tcfg, seed=1000 + k) for k in range(2)]
        theta, _, cem_hist = train_ordering_cem(train, cfg, iters=args.cem_iters, population=6, elite=2,
                                                on_iter=lambda h: print("cem", h, flush=True))
    rows = []
    for seed in range(args.seeds):
        trace = generate(tcfg, seed=seed)
        run_cfg = E.SimConfig(**{**cfg.__dict__, "hetero_seed": seed})
        for name in policy_names(heuristic=True):
            for variant, wrap in VARIANTS.items():
                r = E.run(trace, wrap(make_heuristic(name)), run_cfg, seed=seed)
                rows.append({"seed": seed, "policy": name, "placement": variant, **metrics(r)})
                print(rows[-1], flush=True)
        agents = [("dual-agent (SRTF theta)", DualAgent())]
        if theta is not None:
            agents.append(("dual-agent (CEM theta)", DualAgent(theta)))
        for label, agent in agents:
            r = E.run(trace, agent, run_cfg, seed=seed)
            err = np.array(agent.errors)
            rows.append({"seed": seed, "policy": label, "placement": "rwgp", **metrics(r),
                         "rwgp_mae": round(float(err[:, 0].mean()), 4),
                         "last_value_mae": round(float(err[:, 1].mean()), 4)})
            print(rows[-1], flush=True)
    out = {
        "command": "python bench/bench_placement.py " + " ".join(argv or []),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "config": {"jobs": args.jobs, "servers": args.servers, "arrivals": args.arrivals, "seeds": args.seeds,
                   "speed_classes": list(hetero.THREE_GENERATIONS), "walk_sigma": args.walk_sigma,
                   "cross_node_comm": True, "cem_iters": args.cem_iters,
                   "cem_theta": None if theta is None else [round(float(x), 4) for x in theta],
                   "cem_history": cem_hist},
        "wall_s": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
