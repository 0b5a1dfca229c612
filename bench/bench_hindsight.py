"""Can the target-size network learn which of elastic's settings suits the workload it is in? A hindsight teacher
distilled at the Pollux workloads' size, read on held-out generated traces and on the Pollux workloads.

Why: elastic's best efficiency threshold is 0.6 on workloads as submitted and 0.8 on tuned ones
(bench/bench_styles.py), and a scheduler is not told which kind it has; the network sees each job's efficiency at
every size and the cluster's demand, so it might tell. On each training trace (generated Philly workloads of 160
jobs, both styles: even seeds as submitted, odd tuned) elastic runs at every ``--efficiencies`` value and the best
on that trace is that trace's teacher (hindsight: known only after the run). The network (dl2-target's, its
teacher feature elastic's pair) is fitted to the teacher's pairs on every slot in ``--rounds`` rounds, the teacher
driving the first and the network the later ones (dl2d.policy.planning.plan_distill.collect, as the planner's
distillation), rows where the label departs from the feature's pair weighted ``--departure-weight``. It is then
run on held-out generated tuned traces and on the 16 Pollux workloads beside elastic at its default and at 0.8.
Seeded (the network's initialisation, the minibatches): the same arguments give the same figures on one machine.

    python bench/bench_hindsight.py [--traces 16] [--iters 3000] [--rounds 3] [--departure-weight 4]
        [--efficiencies 0.5,0.6,0.7,0.8,0.85] [--heldout 10001,10003,10005,10007] [--out FILE.jsonl]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import shlex
import sys
import time

import jax
import numpy as np

from dl2d.policy.planning import plan_distill as D
from dl2d.policy.target import policy as T
from dl2d.policy.target import train as TT
from dl2d.policy.target import view as TV
from dl2d.policy.elastic.srtf import EFFICIENCY, elastic_srtf
from dl2d.sim import engine as E
from dl2d.sim.trace import from_workload
from dl2d.workload.workloads import WORKLOADS, packaged_workload

from bench_today import MAX_SLOTS
from jsonl_rows import Rows

JOBS = 160  # the Pollux workloads' size


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=16, help="training traces, seeds 0..N-1 (both styles)")
    ap.add_argument("--iters", type=int, default=3000, help="Adam steps a round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of labelling (the first driven by the teacher)")
    ap.add_argument("--departure-weight", type=float, default=4.0,
                    help="weight of the rows whose label departs from the teacher feature's pair")
    ap.add_argument("--efficiencies", default="0.5,0.6,0.7,0.8,0.85", help="elastic's thresholds the teacher tries")
    ap.add_argument("--heldout", default="10001,10003,10005,10007", help="held-out generated tuned trace seeds")
    ap.add_argument("--out", default=None, help="also write the JSON lines here")
    args = ap.parse_args()
    try:
        effs = [float(x) for x in args.efficiencies.split(",") if x.strip()]
        heldout = [int(x) for x in args.heldout.split(",") if x.strip()]
    except ValueError:
        ap.error("--efficiencies and --heldout are comma-separated numbers")
    if args.traces < 1 or args.iters < 1 or args.rounds < 1 or args.departure_weight <= 0:
        ap.error("--traces, --iters and --rounds must be >= 1, --departure-weight > 0")
    if not effs or any(not 0 < e <= 1 for e in effs) or not heldout:
        ap.error("--efficiencies: each in (0, 1]; --heldout: at least one seed")
    if set(heldout) & set(range(args.traces)):
        ap.error(f"--heldout: {sorted(set(heldout) & set(range(args.traces)))} are training seeds")
    setup = TT.TrainSetup(jobs=JOBS, style="both", teacher="elastic", clusters=args.traces)
    cfg = dataclasses.replace(TT.sim_config(setup), max_slots=MAX_SLOTS)
    tc = TT.target_config(cfg, "elastic")
    head = {"command": "python " + shlex.join(["bench/bench_hindsight.py", *sys.argv[1:]])}
    out = Rows(args.out)
    emit = out.add
    emit(head)
    t0 = time.perf_counter()
    seeds = list(range(args.traces))
    traces = [TT.make_trace(setup, cfg, s) for s in seeds]
    best = {}
    for trace, seed in zip(traces, seeds):
        jct = {e: E.run(trace, functools.partial(elastic_srtf, efficiency=e), cfg, seed=seed).avg_jct_hours
               for e in effs}
        best[seed] = min(jct, key=jct.get)
        emit({"trace": seed, "style": trace.config["style"],
              "elastic_h": {f"{e:g}": round(v, 4) for e, v in jct.items()}, "teacher_efficiency": best[seed]})
        log(f"trace {seed}: best {best[seed]} ({time.perf_counter() - t0:.0f} s)")

    def teacher(seed: int):
        return functools.partial(elastic_srtf, efficiency=best[seed])

    params, data = T.init_params(tc, jax.random.PRNGKey(0)), None
    for rnd in range(args.rounds):
        new = D.collect(tc, cfg, traces, seeds, None if rnd == 0 else params, teacher=teacher)
        data = new if data is None else D.Samples.concat([data, new])
        params, loss = D.fit(tc, params, data, args.iters, lr=1e-3, seed=rnd, departure_weight=args.departure_weight)
        emit({"round": rnd + 1, "slots": len(data), "loss": round(loss, 4),
              "agreement": round(D.agreement(tc, params, data), 4)})
        log(f"round {rnd + 1}: {len(data)} slots ({time.perf_counter() - t0:.0f} s)")
    policies = {f"elastic {EFFICIENCY:g}": elastic_srtf, "elastic 0.8": functools.partial(elastic_srtf, efficiency=0.8),
                "fitted": TV.TargetPolicy(tc, params)}
    sets = {"generated tuned, held out": [(TT.make_trace(dataclasses.replace(setup, style="tuned"), cfg, s), s)
                                           for s in heldout]}
    for folder in ("workloads", "workloads-realistic"):
        sets[f"pollux {folder}"] = [(from_workload(packaged_workload(k, folder), cfg.slot_seconds, seed=k), k)
                                    for k in WORKLOADS]
    for name, runs in sets.items():
        row = {"set": name}
        for label, policy in policies.items():
            jct = [E.run(trace, policy, cfg, seed=seed).avg_jct_hours for trace, seed in runs]
            row[label] = round(float(np.mean(jct)), 4)
            row[f"{label} per trace"] = [round(j, 3) for j in jct]
        emit(row)
        log(f"{name} done ({time.perf_counter() - t0:.0f} s)")
    emit({"seconds": round(time.perf_counter() - t0, 1)})
    out.close()


if __name__ == "__main__":
    main()
