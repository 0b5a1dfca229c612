"""Throughput of the JAX environment (dl2d/sim/jaxenv.py): simulated cluster-slots per second.

N clusters, each with its own trace (seeds 0..N-1) and noise key, step in one jitted `jax.vmap` of a
`jax.lax.scan` over --slots slots, with auto-reset (a cluster whose jobs all finished starts its trace over, so
every slot stepped is a useful one, as during training). The allocation comes from a trivial rule jitted with
the environment (`jaxenv.fair_share`: equal bundles for every active job within the aggregate capacity), so the
figure is the environment's cost plus a few array operations, not a policy's. The default setting is the one
of the RL training figure in docs/BENCHMARKS.md ("14.7 slots/s": the small preset, 40-job DL2 traces, J = 40).
Timed: the best of --repeats calls after a compiling one; one JSON line per N.

    python bench/bench_jaxenv.py                                  # DL2 world, small preset, J = 40
    python bench/bench_jaxenv.py --world today --clusters 1 64 256    # all-reduce jobs, t4-16, placement-aware
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

from dl2d.sim import jaxenv as X
from dl2d.sim import trace as T
from dl2d.sim.worlds import world
from dl2d.workload import philly


def traces_of(kind: str, n: int, jobs: int, gpus: int) -> list[T.Trace]:
    if kind == "dl2":
        return [T.generate(T.TraceConfig(num_jobs=jobs), seed=s) for s in range(n)]
    return [T.from_workload(philly.generate(jobs, load=1.0, cluster_gpus=gpus, seed=s), 60.0, seed=s)
            for s in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", choices=("dl2", "today"), default="dl2")
    ap.add_argument("--cluster", default=None, help="cluster preset (default: small for dl2, t4-16 for today)")
    ap.add_argument("--jobs", type=int, default=40, help="jobs per trace = J")
    ap.add_argument("--clusters", type=int, nargs="+", default=[1, 64, 256, 1024])
    ap.add_argument("--slots", type=int, default=200, help="slots per timed call")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    w = world(args.world)
    cfg = w.sim_config(args.cluster or ("small" if args.world == "dl2" else "t4-16"))
    gpus = int(cfg.cluster.capacity[0])
    run = jax.jit(jax.vmap(lambda p, s: X.rollout(p, s, X.fair_share, args.slots), in_axes=(None, 0)))
    for n in args.clusters:
        t0 = time.perf_counter()
        params, batch = X.from_traces(traces_of(args.world, n, args.jobs, gpus), cfg, args.jobs)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        batch, traj = jax.block_until_ready(run(params, batch))
        compile_s = time.perf_counter() - t0
        times, episodes, jcts = [], 0, []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            batch, traj = jax.block_until_ready(run(params, batch))
            times.append(time.perf_counter() - t0)
            done = np.asarray(traj["done"])
            episodes += int(done.sum())
            jcts.extend(np.asarray(traj["episode_jct"])[done].tolist())
        best = min(times)
        print(json.dumps({
            "world": args.world, "cluster": cfg.cluster.num_servers, "J": args.jobs, "clusters": n,
            "slots_per_call": args.slots, "cluster_slots_per_s": round(n * args.slots / best),
            "median_cluster_slots_per_s": round(n * args.slots / float(np.median(times))),
            "call_s": round(best, 4), "first_call_s": round(compile_s, 2), "build_s": round(build_s, 2),
            "episodes_finished": episodes, "mean_episode_jct_slots": round(float(np.mean(jcts)), 2) if jcts else None,
            "placement": params.placement, "device": jax.devices()[0].platform, "cores": os.cpu_count(),
            "load_avg": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
