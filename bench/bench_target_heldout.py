"""A target-size policy checkpoint against the heuristics on held-out traces of the world it was trained in, in
the NumPy simulator (tasks placed on servers): the traces `dl2ctl train --policy dl2-target` draws (the
checkpoint's meta says which world, cluster, jobs and load), at seeds no training or validation used.

    python bench/bench_target_heldout.py dl2d/policy/target/pretrained/target-today.msgpack --seeds 20000-20004
        [--allreduce-placement spread]
    python bench/bench_target_heldout.py dl2d/policy/target/pretrained/target-today.msgpack --seeds validation
    python bench/bench_target_heldout.py dl2d/policy/target/pretrained/target-dl2.msgpack --seeds 0-4 --cluster testbed \
        --jobs 30     # another preset of the checkpoint's world than it trained on

The summary line gives the traces' LP lower bound on the average JCT (dl2d.sim.lp_bound: at nominal speed and at
the slot noise's upper end) and how far above its nominal value the learned policy and the best heuristic are.
Its buckets are whole slots unless `--bound-bucket-slots` says otherwise: the DL2 world's bounds in docs/BENCHMARKS.md use
quarter slots (`--bound-bucket-slots 0.25`, a tighter bound, 1-4 min a trace there).
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np

from dl2d.core.contract import ALLREDUCE_PLACEMENTS
from dl2d.policy import registry
from dl2d.policy.target import train as TT
from dl2d.policy.checkpoint import load_target
from dl2d.policy.target.view import TargetPolicy
from dl2d.sim import engine as E


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--seeds", default="20000-20004",
                    help="first-last trace seeds, never used in training or validation; or 'validation': the "
                         "checkpoint's own validation seeds (what its training chose by, so not held out)")
    ap.add_argument("--heuristics", default="slurm,tiresias,drf,optimus,elastic",
                    help="registered policies to run beside the checkpoint: heuristics, or learned policies that "
                         "ship their parameters (elastic-chooser); the summary's best heuristic is of the heuristics")
    ap.add_argument("--allreduce-placement", choices=ALLREDUCE_PLACEMENTS, default=None,
                    help="where all-reduce workers go (default: the world's)")
    ap.add_argument("--cluster", default=None, help="another cluster preset of the checkpoint's world (default: its own)")
    ap.add_argument("--jobs", type=int, default=None, help="jobs per trace (default: the checkpoint's)")
    ap.add_argument("--no-bound", action="store_true", help="skip the LP lower bound (minutes a trace in the DL2 world)")
    ap.add_argument("--bound-bucket-slots", type=float, default=None,
                    help="the LP bound's buckets, in slots (default: whole slots, as few as keep its program small)")
    args = ap.parse_args()
    if args.bound_bucket_slots is not None and not args.bound_bucket_slots > 0:
        ap.error(f"--bound-bucket-slots must be > 0, got {args.bound_bucket_slots}")
    ck = load_target(args.checkpoint)
    # checkpoints written by bench_ppo before the meta held the whole setup name its world, cluster and jobs
    setup = TT.TrainSetup(**ck.meta.get("setup", {k: ck.meta[k] for k in ("world", "cluster", "jobs") if k in ck.meta}))
    overrides = {k: v for k, v in (("cluster", args.cluster), ("jobs", args.jobs))
                 if v is not None and v != getattr(setup, k)}
    setup = dataclasses.replace(setup, **overrides)
    if args.seeds == "validation":
        lo, hi = ck.meta["validation_seeds"]
        seeds = range(int(lo), int(hi) + 1)
    else:
        try:
            seeds = TT.held_out_seeds(args.seeds, ck.meta)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    cfg = TT.sim_config(setup)
    if args.allreduce_placement is not None:
        cfg = dataclasses.replace(cfg, allreduce_placement=args.allreduce_placement)
    traces = [TT.make_trace(setup, cfg, s) for s in seeds]
    others = [n for n in args.heuristics.split(",") if n]
    options = registry.PolicyOptions(world=setup.world)
    for n in others:
        try:
            registry.build(n, options)
        except ValueError as e:  # PolicyBuildError included
            ap.error(f"--heuristics: {e}")
    makers = {n: (lambda n=n: registry.build(n, options)) for n in others}
    makers["learned"] = lambda: TargetPolicy(ck.config, ck.params)
    out = {}
    for name, make in makers.items():
        jcts = [round(float(E.run(t, make(), cfg, seed=s).jct_slots.mean()), 2) for s, t in zip(seeds, traces)]
        out[name] = {"per_trace": jcts, "mean": round(float(np.mean(jcts)), 2)}
        print(json.dumps({"policy": name, **out[name]}), flush=True)
    heuristics = [n for n in out if n != "learned" and registry.get(n).heuristic]
    best = min(heuristics, key=lambda n: out[n]["mean"], default=None)  # none: --heuristics "" or no heuristic
    bucket_s = None if args.bound_bucket_slots is None else args.bound_bucket_slots * cfg.slot_seconds
    bound = None if args.no_bound else TT.lower_bound(traces, cfg, bucket_s)
    print(json.dumps({"summary": True, "world": setup.world, "cluster": setup.cluster, "jobs": setup.jobs,
                      "not_the_training_setup": sorted(overrides), "seeds": [seeds[0], seeds[-1]],
                      "held_out": args.seeds != "validation", "allreduce_placement": cfg.allreduce_placement,
                      "best_heuristic": best,
                      "learned_vs_best": best and round(out["learned"]["mean"] / out[best]["mean"] - 1, 4),
                      "lower_bound": bound, "bound_bucket_slots": args.bound_bucket_slots,
                      "learned_vs_bound": bound and round(out["learned"]["mean"] / bound["nominal"] - 1, 4),
                      "best_vs_bound": bound and best and round(out[best]["mean"] / bound["nominal"] - 1, 4)}))


if __name__ == "__main__":
    main()
