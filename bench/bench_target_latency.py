"""The target-size policy (dl2-target): slot decision latency on a view of J jobs, by stage.

A view of J DL2 jobs (types round-robin, remaining work spread over 1-200 epochs) on the DL2 world's `dl2`
preset cut to max(J, 40) servers, with the pretrained checkpoint (or --checkpoint). Timed, median of
--repeats calls after the compiling first call: the observation from the view (NumPy), the jitted decision
(Optimus's allocation, the features, the network, the argmax; padded to a power of two), and the fill that
places every task on the servers (dl2d.policy.baselines.heuristics.AllocationBuilder), and the whole call.

    python bench/bench_target_latency.py [--jobs 40 200 1000] [--checkpoint FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[40, 200, 1000])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--checkpoint", default="")
    args = ap.parse_args()

    from dataclasses import replace

    from dl2d.core.contract import SlotView
    from dl2d.policy import registry
    from dl2d.policy.target import view as TV
    from dl2d.sim.cluster import preset
    from dl2d.workload.catalog import view_fields

    policy = registry.build("dl2-target", registry.PolicyOptions(checkpoint=args.checkpoint, world="dl2"))
    rng = np.random.default_rng(0)
    for J in args.jobs:
        spec = replace(preset("dl2"), num_servers=max(J, 40))
        cap = spec.empty()
        types = np.arange(J) % 8
        est = rng.uniform(1, 200, J)
        view = SlotView(slot=10, job_ids=np.arange(J), type_idx=types, arrival_slot=np.sort(rng.integers(0, 10, J)),
                        slots_run=rng.integers(0, 10, J), epochs_done=est * rng.uniform(0, 0.9, J), est_epochs=est,
                        prev_workers=np.zeros(J, int), prev_ps=np.zeros(J, int), free=cap.copy(), capacity=cap,
                        max_workers=16, max_ps=16, **view_fields(types, 16, 16))

        def timed(fn):
            fn()
            out = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
            return round(float(np.median(out)), 1)

        obs_ms = timed(lambda: TV.view_obs(policy.cfg, view))
        decide_ms = timed(lambda: policy.actions(view))
        total_ms = timed(lambda: policy(view))
        alloc = policy(view)
        print(json.dumps({"J": J, "servers": spec.num_servers, "view_obs_ms": obs_ms,
                          "decision_ms (obs + jitted)": decide_ms, "whole_slot_ms": total_ms,
                          "fill_ms (whole - decision)": round(total_ms - decide_ms, 1),
                          "tasks": int(alloc.workers.sum() + alloc.ps.sum()), "cores": os.cpu_count(),
                          "load_avg": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
