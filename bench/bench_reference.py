"""dl2d's twin against the Pollux artifact's own simulator, job by job, on the eight tuned Pollux workloads: its
Tiresias, Optimus+Oracle and (``--policies pollux``) Pollux.

Why: averages can agree while jobs do not (differences that offset). The artifact published each job's JCT at job
load 1.0 for Tiresias, Optimus+Oracle and Pollux (dl2d/workload/data/pollux/results-jobload-1.0/, credit there);
this runs dl2d's policy of the same name on the same workload in the twin's reference preset (dl2d.sim.presets:
16 nodes x 4 T4 GPUs, 60 s slots, a 30 s restart, no interference, the artifact's placement, batch and work rules
and its rules for the two baselines), or with ``--preset dl2d`` in today's world less its interference (how far
dl2d's own rules are from the artifact's), and reports, per workload and policy: both averages, their ratio,
the median per-job |ratio - 1| and the share of jobs within 5 %.

    python bench/bench_reference.py [--preset reference|dl2d] [--policies tiresias,optimus-oracle]
                                    [--workloads 1-8] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import replace
from importlib import resources

import numpy as np

from dl2d.policy import registry
from dl2d.sim import engine as E
from dl2d.sim import presets
from dl2d.sim.trace import from_workload
from dl2d.sim.worlds import world
from dl2d.workload.catalog import model_index
from dl2d.workload.seeds import seed_list
from dl2d.workload.workloads import packaged_workload

#: dl2d's policy -> the artifact's name for its results
REFERENCE = {"tiresias": "tiresias", "optimus-oracle": "optimus", "pollux": "pollux"}
MAX_SLOTS = 20_160


def published(name: str) -> dict:
    path = resources.files("dl2d.workload").joinpath("data/pollux/results-jobload-1.0", f"{name}.json")
    return json.loads(path.read_text())


def settings(preset: str) -> dict:
    """The preset's settings; dl2d's own with no interference of any kind (the artifact has none)."""
    none = {"interference": 0.0, "slot_noise": 0.0, "shared_node_slowdown": 0.0}
    return presets.resolve(preset, none if preset == "dl2d" else {})


def artifact_config(preset: str = "reference"):
    """Today's world on the artifact's cluster with the preset's settings."""
    return presets.sim_config(settings(preset), world("today").sim_config("t4-16", max_slots=MAX_SLOTS))


def means(rows: list[dict], keys) -> dict:
    """The mean of each of ``keys`` over ``rows``, rounded as the records keep them."""
    return {key: round(float(np.mean([r[key] for r in rows])), 4) for key in keys}


def compare(ours: dict[str, float], theirs: dict[str, float]) -> dict:
    """Agreement of two {job: JCT s} maps over the jobs both finished."""
    jobs = sorted(set(ours) & set(theirs))
    a = np.array([ours[j] for j in jobs])
    b = np.array([theirs[j] for j in jobs])
    r = a / b
    return {"jobs": len(jobs), "avg_s": round(float(a.mean()), 1), "reference_avg_s": round(float(b.mean()), 1),
            "avg_ratio": round(float(a.mean() / b.mean()), 4),
            "median_abs_ratio_minus_1": round(float(np.median(np.abs(r - 1))), 4),
            "within_5pct": round(float(np.mean(np.abs(r - 1) <= 0.05)), 4),
            "median_ratio": round(float(np.median(r)), 4)}


def pollux_trace(trace):
    """The artifact's Pollux jobs: every batch Pollux's to choose, but NCF's, fixed at 32 768."""
    ncf = trace.type_idx == model_index("ncf")
    return replace(trace, adaptive=trace.adaptive & ~ncf, batch_size=np.where(ncf, 32768.0, trace.batch_size))


def run_one(policy: str, k: int, cfg, baseline_rules: str = "reference", generations: int = 100
            ) -> tuple[dict[str, float], float]:
    """({job: JCT s}, decision ms a slot) of ``policy`` on tuned workload ``k``."""
    jobs = sorted(packaged_workload(k, "workloads"), key=lambda j: j.arrival_s)
    trace = from_workload(jobs, cfg.slot_seconds, seed=k, interference_sigma=0.0, adaptive=policy == "pollux")
    if policy == "pollux":
        from dl2d.policy.baselines.pollux import Pollux

        scheduler, trace = Pollux(seed=k, generations=generations), pollux_trace(trace)
    else:
        scheduler = registry.build(policy, registry.PolicyOptions(baseline_rules=baseline_rules))
    res = E.run(trace, scheduler, cfg, seed=k)
    return {j.name: float(t) * cfg.slot_seconds for j, t in zip(jobs, res.jct_slots)}, res.decision_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=tuple(presets.PRESETS), default="reference")
    ap.add_argument("--policies", default="tiresias,optimus-oracle")
    ap.add_argument("--workloads", default="1-8")
    ap.add_argument("--generations", type=int, default=100, help="pollux: its genetic search's generations")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in REFERENCE or p not in registry.names()]
    if unknown:
        ap.error(f"--policies: no published results or no such policy: {', '.join(unknown)}")
    workloads = seed_list(args.workloads)
    chosen = settings(args.preset)
    cfg = artifact_config(args.preset)
    out = {"command": "python " + shlex.join(["bench/bench_reference.py", *sys.argv[1:]]),
           "cluster": "t4-16", "slot_seconds": cfg.slot_seconds, "restart_seconds": cfg.resize_overhead_s,
           "preset": args.preset, "settings": chosen, "rows": [], "means": {}}
    t0 = time.perf_counter()
    for policy in policies:
        ref = published(REFERENCE[policy])
        rows = []
        for k in workloads:
            ours, ms = run_one(policy, k, cfg, chosen["baseline_rules"], args.generations)
            row = {"policy": policy, "workload": k, **compare(ours, ref["jcts"][f"workload-{k}"]),
                   "decision_ms": round(ms, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        out["rows"] += rows
        out["means"][policy] = means(rows, ("avg_s", "reference_avg_s", "avg_ratio", "median_abs_ratio_minus_1",
                                            "within_5pct", "median_ratio"))
        print(json.dumps({"policy": policy, "mean": out["means"][policy]}), flush=True)
    out["took_s"] = round(time.perf_counter() - t0, 1)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
