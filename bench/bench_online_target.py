"""The target-size policy learning online (dl2d.policy.target.online), in the NumPy simulator of today's world:
on held-out traces (never trained or validated on), one learner per trace from the shipped checkpoint,
sampling its pairs and updating every --window slots as the daemon does; beside it the shipped policy
greedy, the same sampling without updates, the fallback heuristic and --heuristics on the same trace and
seed. Reports the average JCTs, the updates and reverts, and the revert rule's score ratio (learning policy /
fallback, per slot).

    python bench/bench_online_target.py [--world today|dl2] [--seeds 30000-30004] [--jobs 40] [--window 8]
        [--fallback drf] [--allreduce-placement spread]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from dl2d.core.contract import ALLREDUCE_PLACEMENTS
from dl2d.policy.registry import ONLINE_EXPLORE


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="30000-30004")
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--world", default="today", choices=("today", "dl2"))
    ap.add_argument("--cluster", default=None, help="the world's cluster preset (default: its training cluster)")
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--margin", type=float, default=0.2)
    ap.add_argument("--temperature", type=float, default=None,
                    help="the learner samples at this temperature (default: the daemon's, policy.online_temperature)")
    ap.add_argument("--explore", default=None, choices=ONLINE_EXPLORE,
                    help="which jobs the learner samples for (default: the daemon's, policy.online_explore)")
    ap.add_argument("--fallback", default="drf")
    ap.add_argument("--heuristics", default="elastic,optimus", help="more heuristics to run on the same traces")
    ap.add_argument("--allreduce-placement", choices=ALLREDUCE_PLACEMENTS, default=None,
                    help="where all-reduce workers go (default: the world's)")
    args = ap.parse_args()

    from dl2d.policy import registry
    from dl2d.policy.target import train as TT
    from dl2d.policy.checkpoint import load_target
    from dl2d.policy.target.entry import pretrained
    from dl2d.policy.registry import PolicyOptions
    from dl2d.policy.target.online import as_scheduler
    from dl2d.sim import engine as E

    setup = TT.TrainSetup(world=args.world, jobs=args.jobs, **({"cluster": args.cluster} if args.cluster else {}))
    cfg = TT.sim_config(setup)
    if args.allreduce_placement is not None:
        import dataclasses

        cfg = dataclasses.replace(cfg, allreduce_placement=args.allreduce_placement)
    try:  # seeds the shipped checkpoint never trained or validated on
        seeds = TT.held_out_seeds(args.seeds, load_target(pretrained(args.world)).meta)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    temperature = PolicyOptions().online_temperature if args.temperature is None else args.temperature
    explore = PolicyOptions().online_explore if args.explore is None else args.explore
    rows = []
    for seed in seeds:
        trace = TT.make_trace(setup, cfg, seed)
        t0 = time.perf_counter()
        greedy = E.run(trace, registry.build("dl2-target", PolicyOptions(world=args.world)), cfg, seed=seed).jct_slots.mean()
        fallback = E.run(trace, registry.build(args.fallback), cfg, seed=seed).jct_slots.mean()
        others = {h: round(float(E.run(trace, registry.build(h), cfg, seed=seed).jct_slots.mean()), 2)
                  for h in filter(None, args.heuristics.split(","))}

        def daemon_like(window, trace=trace, seed=seed):
            learner = registry.build("dl2-target", PolicyOptions(online_rl=True, fallback=args.fallback, seed=seed, world=args.world,
                                                                 online_window=window, revert_margin=args.margin,
                                                                 online_temperature=temperature,
                                                                 online_explore=explore))
            ratios, scheduler = [], as_scheduler(learner)

            def decide(view):
                alloc = scheduler(view)
                ratios.append(learner._pending.score / max(learner._pending.fallback_score, 1e-12))
                return alloc

            return E.run(trace, decide, cfg, seed=seed).jct_slots.mean(), learner, ratios

        sampled, _, _ = daemon_like(10_000)  # sampling the pairs, never updating: what learning adds is the rest
        online, learner, ratios = daemon_like(args.window)
        row = {"seed": seed, "greedy": round(float(greedy), 2), "sampled": round(float(sampled), 2),
               "online": round(float(online), 2), args.fallback: round(float(fallback), 2), **others,
               "slots": len(ratios), "updates": learner.stats.updates,
               "reverts": learner.stats.reverts, "ratio_median": round(float(np.median(ratios)), 2),
               "ratio_p5": round(float(np.percentile(ratios, 5)), 2), "ratio_min": round(float(np.min(ratios)), 2),
               "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    names = ["greedy", "sampled", "online", args.fallback, *filter(None, args.heuristics.split(","))]
    print(json.dumps({**{f"mean_{n}": round(float(np.mean([r[n] for r in rows])), 2) for n in names},
                      "reverts": sum(r["reverts"] for r in rows), "updates": sum(r["updates"] for r in rows)}))


if __name__ == "__main__":
    main()
