"""Fit the learned rule chooser ``elastic-chooser`` (dl2d.policy.elastic.chooser) to the lookahead's costs, choose its
regularisation on held-out generated workloads, and read it on the Pollux workloads.

Why: bench/bench_mpc.py chooses elastic's rule every 10 slots by simulating each rule ahead, at a second or two a
choice. ``--record`` there keeps every choice's cluster state (dl2d.policy.elastic.chooser.state_features) and each
rule's cost; this script fits a linear softmax of least expected regret to them (one per ``--l2``), runs each as
a policy (its rule kept 10 slots) on the validation workloads (generated, seeds never recorded: 104-105 by
default, both styles, loads 1 and 2), keeps the best, writes it (``--out``, with the validation figures in its
meta, which a test checks), and then, with ``--pollux``, runs it beside every fixed rule on the 16 Pollux
workloads, which no step here chose anything on. Average JCT in hours, as is.

    python bench/bench_chooser.py --records docs/bench/mpc_oracle_generated.npz
        [--l2 1e-4,1e-3,1e-2,1e-1] [--seeds 104-105] [--loads 1,2] [--out dl2d/policy/elastic/pretrained/chooser-today.json]
        [--pollux] [--rows FILE.jsonl] [--workers 2]
"""
from __future__ import annotations

import argparse
import multiprocessing
import shlex
import sys
import time

import numpy as np

from dl2d.policy.elastic import chooser as RC
from dl2d.sim import engine as E
from dl2d.sim.worlds import world

from bench_mpc import workload_trace
from bench_styles import numbers
from bench_today import MAX_SLOTS
from jsonl_rows import Rows

POLLUX = ("workloads", "workloads-realistic")


def run_one(job) -> dict:
    """One workload under the fixed rules and each chooser: {policy: JCT h}."""
    folder, k, rules, choosers = job
    cfg = world("today").sim_config("t4-16", max_slots=MAX_SLOTS)
    trace = workload_trace(folder, k, cfg)
    row = {"folder": folder, "workload": k}
    for rule in rules:
        row[rule] = round(E.run(trace, lambda v, r=rule: RC.apply_rule(v, r), cfg, seed=k).avg_jct_hours, 4)
    for name, d in choosers.items():
        policy = RC.ChooserPolicy(RC.Chooser.from_dict(d))
        t0 = time.perf_counter()
        row[name] = round(E.run(trace, policy, cfg, seed=k).avg_jct_hours, 4)
        row[f"{name} chosen"] = dict(zip(policy.chooser.rules, policy.counts))
        row[f"{name} s"] = round(time.perf_counter() - t0, 1)
    return row


def means(rows: list[dict], names: list[str]) -> dict:
    return {n: round(float(np.mean([r[n] for r in rows])), 4) for n in names}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", required=True, help="bench_mpc.py --record files, comma-separated")
    ap.add_argument("--l2", default="1e-4,1e-3,1e-2,1e-1")
    ap.add_argument("--seeds", default="104-105", help="validation: generated workloads' seeds")
    ap.add_argument("--loads", default="1,2", help="validation: their loads")
    ap.add_argument("--out", default=None, help="write the chosen chooser here (JSON)")
    ap.add_argument("--pollux", action="store_true", help="then run it on the 16 Pollux workloads")
    ap.add_argument("--rows", default=None, help="also write the JSON lines here")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    l2s = numbers(args.l2, float, "l2", ap)
    seeds, loads = numbers(args.seeds, int, "seeds", ap), numbers(args.loads, float, "loads", ap)
    if not l2s or any(x < 0 for x in l2s):
        ap.error(f"--l2: non-negative numbers, got {args.l2!r}")
    if not seeds or not loads or args.workers < 1:
        ap.error("--seeds and --loads need at least one each, --workers at least 1")
    xs, costs, recorded, rules = [], [], set(), None
    for path in (p for p in args.records.split(",") if p):
        try:
            d = np.load(path)
            x, c, run, r = d["x"], d["costs"], d["run"], tuple(str(v) for v in d["rules"])
        except (OSError, KeyError, ValueError) as e:
            ap.error(f"--records: cannot read {path}: {e}")
        if rules is not None and r != rules:
            ap.error(f"--records: {path} has rules {r}, another file {rules}")
        rules = r
        xs.append(x)
        costs.append(c)
        recorded |= {str(v) for v in run}
    if rules is None:
        ap.error("--records: no file given")
    val = [(f"generated {style} {load:g}", k) for style in ("tuned", "realistic") for load in loads for k in seeds]
    overlap = sorted({f"{f}/{k}" for f, k in val} & recorded)
    if overlap:
        ap.error(f"--seeds: {', '.join(overlap)} were recorded (fitted on); validate on others")
    x, c = np.concatenate(xs), np.concatenate(costs)
    command = "python " + shlex.join(["bench/bench_chooser.py", *sys.argv[1:]])
    choosers = {f"chooser l2={l2:g}": RC.fit(x, c, rules, l2=l2, meta={"records": args.records}).to_dict()
                for l2 in l2s}
    with Rows(args.rows) as out, multiprocessing.Pool(min(args.workers, len(val))) as pool:
        out.add({"command": command, "samples": int(len(x)), "rules": list(rules),
                 "fit": {n: {k: d["meta"][k] for k in ("expected_regret", "argmax_regret")} for n, d in choosers.items()}})
        rows = [out.add(r) for r in pool.imap(run_one, [(f, k, rules, choosers) for f, k in val])]
        val_means = means(rows, list(rules) + list(choosers))
        out.add({"validation mean": val_means})
        best = min(choosers, key=lambda n: val_means[n])
        chosen = dict(choosers[best])
        chosen["meta"] = {**chosen["meta"], "command": command, "validation": {
            "workloads": [f"{r['folder']}/{r['workload']}" for r in rows],
            "jct_h": [r[best] for r in rows], "mean_h": val_means[best],
            "fixed_rules_mean_h": {r: val_means[r] for r in rules}}}
        out.add({"chosen": best, "validation_mean_h": val_means[best]})
        if args.out:
            RC.Chooser.from_dict(chosen).save(args.out)
        if args.pollux:
            jobs = [(f, k, rules, {"elastic-chooser": chosen}) for f in POLLUX for k in range(1, 9)]
            prows = [out.add(r) for r in pool.imap(run_one, jobs)]
            for f in POLLUX:
                out.add({"folder": f, "mean": means([r for r in prows if r["folder"] == f],
                                                    list(rules) + ["elastic-chooser"])})


if __name__ == "__main__":
    main()
