"""DL2 policy: slot decision latency of the jitted slot loop, and simulated slots per second in RL training.

Latency: one window of J jobs (J = 40, 200, 1000 by default) on a cluster of J servers (2 GPUs, 8 cores,
48 GB each), full-size networks (hidden 256). The policy is a random initialisation with the void action
discouraged (output bias -5), so a slot keeps allocating until nothing more fits, as a trained policy does
on a busy cluster; every job gets its starting bundle and a few more tasks. Timed: `run_window` in sample
mode, without recording (deployment) and with recording (training; skipped where the record buffers
would be huge), median of --repeats calls after the compiling first call.

Throughput: `rl_episode` (sampling, exploration, replay, one A2C update per slot) on the small cluster
(40 servers, 40-job traces) and the DL2 scale (500 servers, 200-job traces, windows of 40).

    python bench/bench_policy_latency.py [--device cpu|gpu] [--jobs 40 200 1000] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--jobs", type=int, nargs="+", default=[40, 200, 1000])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--record-max-jobs", type=int, default=200, help="largest J also timed with recording")
    ap.add_argument("--rl-slots", type=int, default=30, help="timed RL slots per cluster (after a warm-up)")
    ap.add_argument("--skip-rl", action="store_true")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cuda" if args.device == "gpu" else "cpu")

    import jax
    import numpy as np

    from dl2d.policy.dl2.config import PolicyConfig
    from dl2d.policy.dl2.nets import init_params
    from dl2d.policy.dl2.slot import SAMPLE, pad_window, run_window
    from dl2d.sim.cluster import ClusterSpec
    from dl2d.workload.catalog import demand_fields

    dev = jax.devices()[0]
    print(f"device: {dev.platform} {dev.device_kind}; jax {jax.__version__}", file=sys.stderr)
    rows = []
    for J in args.jobs:
        cfg = PolicyConfig(max_jobs=J)
        params = init_params(cfg, jax.random.PRNGKey(0))
        params["policy"]["out"]["bias"] = params["policy"]["out"]["bias"].at[-1].set(-5.0)
        rng = np.random.default_rng(J)
        cap = ClusterSpec(J).empty()
        types = rng.integers(0, cfg.num_types, J)
        fields = demand_fields(types)
        win = pad_window(cfg, types, rng.integers(0, 50, J), rng.uniform(1, 300, J), cap, cap,
                         worker_demand=fields["worker_demand"], ps_demand=fields["ps_demand"])
        for record in (False, True):
            if record and J > args.record_max_jobs:
                continue
            t = time.perf_counter()
            out = jax.block_until_ready(run_window(cfg, params, jax.random.PRNGKey(0), win, mode=SAMPLE,
                                                   record=record))
            first = time.perf_counter() - t
            times, steps = [], []
            for i in range(args.repeats):
                t = time.perf_counter()
                out = jax.block_until_ready(run_window(cfg, params, jax.random.PRNGKey(i + 1), win, mode=SAMPLE,
                                                       record=record))
                times.append(time.perf_counter() - t)
                steps.append(int(out.n_steps))
            ms = 1000 * float(np.median(times))
            st = float(np.median(steps))
            tasks = int(np.sum(out.workers) + np.sum(out.ps))
            row = {"J": J, "servers": J, "record": record, "steps_per_slot": st, "tasks_last": tasks,
                   "ms_per_slot": round(ms, 3), "us_per_inference": round(1000 * ms / st, 2),
                   "compile_s": round(first - ms / 1000, 2)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    result = {"device": f"{dev.platform} {dev.device_kind}", "latency": rows}

    if not args.skip_rl:
        from dl2d.policy.dl2 import train as T
        from dl2d.policy.dl2 import learn as LN
        from dl2d.policy.checkpoint import make_optimizer
        from dl2d.sim.cluster import preset
        from dl2d.sim.engine import SimConfig
        from dl2d.sim.trace import TraceConfig, generate

        rl = []
        for name, jobs in (("small", 40), ("dl2", 200)):
            cfg = PolicyConfig()
            sim = SimConfig(cluster=preset(name))
            params = init_params(cfg, jax.random.PRNGKey(0))
            st = LN.RLState(params, make_optimizer(cfg.rl_lr).init(params), LN.Replay(cfg))
            t = time.perf_counter()
            T.rl_episode(cfg, st, generate(TraceConfig(num_jobs=jobs), seed=1), sim, seed=1, max_slots=10)
            warm = time.perf_counter() - t
            active = []
            trace = generate(TraceConfig(num_jobs=jobs), seed=2)
            steps0 = st.steps
            t = time.perf_counter()
            T.rl_episode(cfg, st, trace, sim, seed=2, max_slots=args.rl_slots,
                         on_slot=lambda n, r: active.append(n))
            dt = time.perf_counter() - t
            row = {"cluster": name, "servers": sim.cluster.num_servers, "jobs": jobs, "slots": len(active),
                   "updates": st.steps - steps0, "slots_per_s": round(len(active) / dt, 2),
                   "warmup_s": round(warm, 1)}
            rl.append(row)
            print(json.dumps(row), file=sys.stderr)
        result["rl"] = rl
    text = json.dumps(result, indent=2)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
