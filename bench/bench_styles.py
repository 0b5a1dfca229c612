"""Does elastic's best efficiency threshold depend on how the jobs are configured? Elastic at several thresholds on
generated Philly workloads of both styles (as submitted, and as Pollux tuned its jobs) and on the Pollux workloads.

Why: elastic's settings were chosen on generated workloads as submitted (most jobs one GPU, small batches), and
the Pollux workloads include tuned ones (several GPUs and large batches each), where the same rule may
want other sizes. `philly.generate(style="tuned")` makes workloads of the tuned kind that are not the Pollux ones,
so a setting (or a policy) can be chosen on them and then read on the Pollux workloads, never chosen there. The
generated sets are elastic's own tuning set: 160 jobs on `t4-16`, loads 1 and 2, seeds 100-103; the Pollux
workloads' trace seed is the workload's number, as bench/bench_today.py. Average JCT in hours, as is.

    python bench/bench_styles.py [--efficiencies 0.5,0.6,0.7,0.8,0.85] [--seeds 100-103] [--loads 1,2]
        [--out FILE.jsonl]

An efficiency followed by ``n`` (``0.7n``) is elastic at it with whole nodes for multi-node jobs
(``elastic_srtf``'s ``node_workers``, a node's GPUs).
"""
from __future__ import annotations

import argparse
import functools
import shlex
import sys
import time

import numpy as np

from dl2d.policy.elastic.srtf import EFFICIENCY, elastic_srtf
from dl2d.workload.seeds import seed_list
from dl2d.sim import engine as E
from dl2d.sim.trace import from_workload
from dl2d.sim.worlds import world
from dl2d.workload import philly
from dl2d.workload.workloads import WORKLOADS, packaged_workload

from bench_today import MAX_SLOTS
from jsonl_rows import Rows

SETS = ("generated realistic", "generated tuned", "pollux tuned", "pollux as submitted")


def generated_trace(style: str, load: float, seed: int, slot_seconds: float):
    """A generated workload of the tuning set's kind: 160 Philly jobs of ``style`` on 64 GPUs at ``load``."""
    return from_workload(philly.generate(160, load=load, cluster_gpus=64, seed=seed, style=style), slot_seconds,
                         seed=seed)


def traces(name: str, seeds, loads, slot_seconds: float) -> list:
    """(trace, seed) of one of SETS."""
    if name.startswith("generated"):
        style = name.split()[1]
        return [(generated_trace(style, load, s, slot_seconds), s) for load in loads for s in seeds]
    folder = "workloads" if name == "pollux tuned" else "workloads-realistic"
    return [(from_workload(packaged_workload(k, folder), slot_seconds, seed=k), k) for k in WORKLOADS]


def variant(text: str, cfg):
    """elastic at the efficiency ``text`` names (``0.8``), with whole nodes of ``cfg``'s servers when it ends in
    ``n`` (``0.8n``; a node's GPUs, one a worker in today's world); ValueError naming what is wrong otherwise."""
    whole = text.endswith("n")
    efficiency = float(text[:-1] if whole else text)
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency {efficiency} is not in (0, 1]")
    node_workers = int(cfg.cluster.server_capacity[0]) if whole else 0
    return functools.partial(elastic_srtf, efficiency=efficiency, node_workers=node_workers)


def label(text: str) -> str:
    """A variant's name as the rows spell it: the efficiency as %g, then ``n`` for whole nodes."""
    return f"{float(text.rstrip('n')):g}" + ("n" if text.endswith("n") else "")


def numbers(text: str, kind, what: str, ap) -> list:
    try:
        if kind is int:
            return seed_list(text)
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--{what}: {text!r} is not a comma-separated list (or FIRST-LAST) of numbers")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--efficiencies", default="0.5,0.6,0.7,0.8,0.85", help="elastic's efficiency thresholds to run")
    ap.add_argument("--seeds", default="100-103", help="the generated workloads' seeds")
    ap.add_argument("--loads", default="1,2", help="the generated workloads' loads")
    ap.add_argument("--out", default=None, help="also write the JSON lines here")
    args = ap.parse_args()
    effs = [e.strip() for e in args.efficiencies.split(",") if e.strip()]
    seeds, loads = numbers(args.seeds, int, "seeds", ap), numbers(args.loads, float, "loads", ap)
    cfg = world("today").sim_config("t4-16", max_slots=MAX_SLOTS)
    try:
        policies = {e: variant(e, cfg) for e in effs}
    except ValueError as err:
        ap.error(f"--efficiencies: {err} (each an efficiency in (0, 1], optionally followed by n), "
                 f"got {args.efficiencies!r}")
    if not effs:
        ap.error("--efficiencies: at least one")
    if not seeds or not loads or any(x <= 0 for x in loads):
        ap.error("--seeds and --loads need at least one value each, loads > 0")
    head = {"command": "python " + shlex.join(["bench/bench_styles.py", *sys.argv[1:]]), "elastic_default": EFFICIENCY}
    out = Rows(args.out)
    out.add(head)
    for name in SETS:
        runs = traces(name, seeds, loads, cfg.slot_seconds)
        row = {"set": name, "traces": len(runs)}
        t0 = time.perf_counter()
        for e in effs:
            jct = [E.run(tr, policies[e], cfg, seed=s).avg_jct_hours for tr, s in runs]
            row[f"efficiency {label(e)}"] = round(float(np.mean(jct)), 4)
        best = min(effs, key=lambda e: row[f"efficiency {label(e)}"])
        row["best"] = label(best) if best.endswith("n") else float(best)
        default = row.get(f"efficiency {EFFICIENCY:g}")
        row["best_below_default_pct"] = round(100 * (1 - row[f"efficiency {label(best)}"] / default), 2) if default \
            else None
        row["seconds"] = round(time.perf_counter() - t0, 1)
        out.add(row)
    out.close()


if __name__ == "__main__":
    main()
