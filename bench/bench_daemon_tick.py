"""Daemon tick time on the simulated backend: 1000 nodes / 200 jobs by default, or a flood of waiting jobs
(``--nodes 16 --jobs 3000``), with the policy seeing every waiting job or a window of them (``--windows``).

A tick is everything of a slot but the backend's real work and the wait: reconcile against the backend,
build the view, decide (policy + guardrails), plan, journal (slot, allocations, decision, intents) in
SQLite, and per intent mark_issued -> apply -> mark_done. Agents are not polled here (bench/bench_poll.py
times a 1000-agent poll round). DL2 runs with UNTRAINED parameters (timing only: the network's cost does not
depend on its weights). The first slot starts all 200 jobs (200 intents); later slots resize only the jobs
whose size changes.

    python bench/bench_daemon_tick.py [--slots 10] [--policies drf,dl2]
    python bench/bench_daemon_tick.py --nodes 16 --jobs 3000 --slots 5 --policies drf --windows 0,256
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from dl2d.daemon.config import build_config
from dl2d.daemon.main import build_loop
from dl2d.db.engine import session_scope
from dl2d.db.jobs import submit_job
from dl2d.workload.jobtypes import JOB_TYPES


def bench(policy: str, nodes: int, jobs: int, slots: int, window: int = 256) -> dict:
    d = tempfile.mkdtemp(prefix="dl2d-bench-")
    pol = {"name": policy, "allow_untrained": True} if policy == "dl2" else {"name": policy}
    cfg = build_config({"state_dir": d, "sim": {"cluster": "dl2", "servers": nodes, "noise": 0.1},
                        "metrics": {"enabled": False}, "policy": pol,
                        "limits": {"pending_window": window}}, {})
    loop = build_loop(cfg)
    with session_scope(loop.engine) as s:
        for i in range(jobs):
            t = JOB_TYPES[i % len(JOB_TYPES)]
            submit_job(s, {"name": f"b{i}", "owner": "bench", "job_type": t.name, "total_epochs": 1e5,
                           "command": "x", "worker": dict(zip(("gpus", "cpus", "mem_gb"), t.worker_demand)),
                           "ps": {"cpus": t.ps_demand[1], "mem_gb": t.ps_demand[2]}})
    ticks, decides, intents = [], [], []
    for _ in range(slots):
        t0 = time.perf_counter()
        out = loop.tick()
        ticks.append(1000 * (time.perf_counter() - t0))
        decides.append(out.decide_ms)
        intents.append(out.intents)
        loop.backend.end_slot(cfg.slot_seconds)
        loop.close_slot(loop._slot_id, out.tick_ms)
    steady = ticks[2:] or ticks
    return {"policy": policy, "nodes": nodes, "jobs": jobs, "window": window, "first_tick_ms": round(ticks[0], 1),
            "first_intents": intents[0], "steady_tick_ms_median": round(statistics.median(steady), 1),
            "steady_tick_ms_max": round(max(steady), 1), "steady_decide_ms_median": round(statistics.median(decides[2:] or decides), 1),
            "steady_intents_mean": round(statistics.mean(intents[2:] or intents), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--slots", type=int, default=10)
    ap.add_argument("--policies", default="drf,dl2")
    ap.add_argument("--windows", default="256", help="limits.pending_window values, comma-separated (0: all)")
    a = ap.parse_args()
    for p in a.policies.split(","):
        for w in a.windows.split(","):
            r = bench(p, a.nodes, a.jobs, a.slots, int(w))
            print(" ".join(f"{k}={v}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
