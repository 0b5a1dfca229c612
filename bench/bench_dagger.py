"""DAgger vs supervised imitation of a heuristic (default Optimus), validated on a held-out trace.

SL: fit on the teacher's own trajectories (training traces seeds 0..sl_traces-1). DAgger: then, per iteration,
roll the learner out on the next training trace (seeds sl_traces..), label the states it visits with the
teacher (dl2d/policy/dagger.py), aggregate and refit. Greedy validation avg JCT after SL and after every
iteration. Prints one JSON line per stage and writes them all to --out.

    python bench/bench_dagger.py --cluster small --jobs 40 --iterations 4 --labels set --out docs/bench/dagger_small.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

from dl2d.policy import dagger as D
from dl2d.policy import train as TR
from dl2d.policy.checkpoint import Checkpoint, save
from dl2d.policy.config import PolicyConfig
from dl2d.policy.nets import init_params
from dl2d.sim import cluster as C
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.policy.registry import make_heuristic


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", default="small")
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--teacher", default="optimus")
    ap.add_argument("--sl-traces", type=int, default=2)
    ap.add_argument("--sl-epochs", type=int, default=20)
    ap.add_argument("--max-slots", type=int, default=None, help="slots of each trace used (default: all)")
    ap.add_argument("--per-slot", type=int, default=64, help="samples kept per window and slot")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=10, help="epochs of each DAgger refit")
    ap.add_argument("--labels", choices=("action", "set"), default="set")
    ap.add_argument("--driver", choices=("greedy", "sample"), default="greedy")
    ap.add_argument("--val-seed", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON of every stage")
    ap.add_argument("--checkpoint", default=None, help="save the final policy here")
    args = ap.parse_args()
    t0 = time.time()
    stages = []

    def emit(**kw):
        kw["t_s"] = round(time.time() - t0, 1)
        stages.append(kw)
        print(json.dumps(kw), flush=True)
        if args.out:
            run_args = {k: v for k, v in vars(args).items() if k not in ("out", "checkpoint")}  # no local paths
            Path(args.out).write_text(json.dumps({"args": run_args, "stages": stages}, indent=2) + "\n")

    cfg = PolicyConfig()
    sim = E.SimConfig(cluster=C.preset(args.cluster), max_workers=cfg.max_workers, max_ps=cfg.max_ps)
    tc = T.TraceConfig(num_jobs=args.jobs)
    val = T.generate(tc, seed=args.val_seed)

    def val_jct(p):
        return round(TR.validate(cfg, p, val, sim).avg_jct_slots, 4)

    for name in (args.teacher, "drf"):
        emit(stage=name, val_jct=round(E.run(val, make_heuristic(name), sim, seed=0).avg_jct_slots, 4))
    params = init_params(cfg, jax.random.PRNGKey(args.seed))
    parts = [D.collect(cfg, params, T.generate(tc, seed=args.seed + i), sim, args.teacher, seed=args.seed + i,
                       driver="teacher", max_slots=args.max_slots, per_slot=args.per_slot)
             for i in range(args.sl_traces)]
    data = tuple(np.concatenate(x) for x in zip(*parts))
    params, _, losses = D.fit(cfg, params, data, args.sl_epochs, labels=args.labels, seed=args.seed)
    emit(stage="sl", samples=int(len(data[2])), loss=round(losses[-1], 4), set_acc=round(D.set_accuracy(cfg, params, data), 4),
         val_jct=val_jct(params))

    opt_state = None
    for it in range(args.iterations):
        s = args.seed + args.sl_traces + it
        new = D.collect(cfg, params, T.generate(tc, seed=s), sim, args.teacher, seed=s, driver=args.driver,
                        max_slots=args.max_slots, per_slot=args.per_slot)
        pre_acc = D.set_accuracy(cfg, params, new)  # how often the learner was on the teacher's path
        data = tuple(np.concatenate([a, b]) for a, b in zip(data, new))
        params, opt_state, losses = D.fit(cfg, params, data, args.epochs, labels=args.labels, seed=s,
                                          opt_state=opt_state)
        emit(stage=f"dagger{it + 1}", trace_seed=s, new_samples=int(len(new[2])), samples=int(len(data[2])),
             learner_on_path=round(pre_acc, 4), loss=round(losses[-1], 4), val_jct=val_jct(params))
    if args.checkpoint:
        save(args.checkpoint, Checkpoint(cfg, params, meta={"bench_dagger": vars(args)}))


if __name__ == "__main__":
    main()
