"""Learn the DL2 world's speed table from simulated runs (dl2d.policy.planning.learned_speeds) and write the artefact the
registered ``lp-lookahead`` plans on.

    python bench/bench_learned_speeds.py --cluster testbed --jobs 30 --traces 1600 --first-seed 3000 \
        --processes 2 --out dl2d/policy/planning/pretrained/speeds-dl2.npz

Each trace (seeds FIRST .. FIRST + TRACES - 1: none of the held-out 0-19 nor the validation 500-504) is run once
under the explorer (every job a random pair every slot), and the speed each PS job trained at in each slot it ran
is an observation; the table is fitted from them all. Prints the fit against the simulator's measured table (a
reference only: the fit never reads it) and how many slots the cells rest on; the file records the planner's
JCT on the table on validation trace 501 (a test checks the shipped table against it).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np

from dl2d.policy.planning import learned_speeds as LS
from dl2d.policy.planning import lp_plan as LP
from dl2d.policy.target import train as TT
from dl2d.sim import engine as E
from dl2d.workload.speed import speed_table


#: the validation trace whose JCT under the planner on the table the artefact records
VALIDATION_SEED = 501


def _collect(args: tuple) -> LS.Observations:
    cluster, jobs, seeds = args
    setup = TT.TrainSetup(world="dl2", cluster=cluster, jobs=jobs)
    cfg = TT.sim_config(setup)
    return LS.observe(cfg, [(seed, TT.make_trace(setup, cfg, seed)) for seed in seeds])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="testbed")
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--traces", type=int, default=1600)
    ap.add_argument("--first-seed", type=int, default=3000)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", required=True, help="the .npz to write")
    args = ap.parse_args()
    if args.traces < 1 or args.processes < 1 or args.jobs < 1:
        raise SystemExit("--traces, --jobs and --processes must be at least 1")
    if not Path(args.out).resolve().parent.is_dir():
        raise SystemExit(f"--out {args.out}: its folder does not exist")
    seeds = list(range(args.first_seed, args.first_seed + args.traces))
    if set(seeds) & (set(range(20)) | set(range(500, 505))):
        raise SystemExit("the seeds overlap the held-out traces 0-19 or the validation traces 500-504")
    setup = TT.TrainSetup(world="dl2", cluster=args.cluster, jobs=args.jobs)  # a bad preset stops here
    cfg = TT.sim_config(setup)
    t0 = time.perf_counter()
    per = -(-len(seeds) // 16)  # 16 chunks in seed order whatever the processes: the same file from any
    chunks = [seeds[i:i + per] for i in range(0, len(seeds), per)]
    obs_parts = []
    with mp.get_context("spawn").Pool(args.processes) as pool:
        for i, part in enumerate(pool.imap(_collect, [(args.cluster, args.jobs, c) for c in chunks if c])):
            obs_parts.append(part)
            print(f"chunk {i + 1}/{len(chunks)}: {len(part.rate)} observations, {time.perf_counter() - t0:.0f} s",
                  flush=True)
    obs = LS.Observations.concat(obs_parts)
    table, counts = LS.fit_for(cfg, obs)
    size = table.shape[1]
    command = (f"python bench/bench_learned_speeds.py --cluster {args.cluster} --jobs {args.jobs} --traces "
               f"{args.traces} --first-seed {args.first_seed}")
    # what a test checks the shipped table against: the planner on it, on one validation trace (seconds)
    trace = TT.make_trace(setup, cfg, VALIDATION_SEED)
    jct = float(E.run(trace, LP.on_table(table, in_bucket=8), cfg, seed=VALIDATION_SEED).jct_slots.mean())
    LS.save(args.out, table, counts, {"world": "dl2", "cluster": args.cluster, "jobs": args.jobs,
                                       "seeds": [seeds[0], seeds[-1]], "observations": int(len(obs.rate)),
                                       "command": command,
                                       "source": "fitted from simulated runs of the DL2 world, whose speeds are "
                                                 "the DL2 authors' testbed measurements (dl2d/workload/data)",
                                       "validation": {"policy": "lp-plan on this table, in_bucket 8",
                                                      "seed": VALIDATION_SEED, "jct_slots": round(jct, 4)}})
    true = speed_table(cfg.speed_model)[:, :size, :size]
    seen = counts > 0
    rel = table[seen] / true[seen] - 1
    print(json.dumps({"validation_jct": round(jct, 4), "observations": int(len(obs.rate)), "cells": int(seen.sum()),
                      "cells_with_speed": int((true > 0).sum()), "missed": int(((true > 0) & ~seen).sum()),
                      "median_count": float(np.median(counts[seen])), "rel_err_mean": round(float(rel.mean()), 4),
                      "rel_err_abs_mean": round(float(np.abs(rel).mean()), 4),
                      "rel_err_abs_p95": round(float(np.quantile(np.abs(rel), 0.95)), 4),
                      "seconds": round(time.perf_counter() - t0, 1), "out": args.out}))


if __name__ == "__main__":
    main()
