"""A better teacher than the planner on the measured speeds? One-slot lookahead over roundings of its plan, and
each job's speed measured from what it trained (DL2 world, `testbed`; what ships of it is `lp-lookahead`).

The lookahead (dl2d.policy.planning.lp_lookahead, the policy and why) against the planner it rounds anew, on the
measured table.

``--measured-factor``: each PS job's speeds are the table's times the mean over the slots it ran of what it
trained against what the table says for the pair it ran (its hidden interference, which any scheduler can
measure; the noise averages out). ``--view-factor``: the view's ``job_speed_factor`` instead, the mean of the
job's last 3 measured slots as the daemon and the simulator measure it (NaN, before one: 1). Without either the
planner believes the table as it stands. ``--in-bucket 8``: the planner's program (its own and the lookahead's)
with the bound's in-bucket term (dl2d.sim.lp_bound).

    python bench/bench_plan_lookahead.py --cluster testbed --jobs 30 --seeds 500-502 --candidates 8 --horizon 3
        [--measured-factor | --view-factor] [--in-bucket 8] [--starts 4 --shrinks 3 [--grows 3] [--move-rounds 3]]
        [--out FILE.jsonl]

``--starts`` / ``--shrinks`` / ``--grows``: local moves of the planner's rounding as candidates too
(lp_lookahead.moves); with ``--candidates 1`` they are the only ones, and the teacher is the same whatever the seed.
``--move-rounds``: moves of the best move in turn while one is better.

Prints a JSON line per seed: the planner's average JCT (slots) and the lookahead's, the slots where a
candidate beat the planner's own, and the seconds spent deciding.
"""
from __future__ import annotations

import argparse
import json

from dl2d.policy.planning import learned_speeds as LS
from dl2d.policy.planning import lp_plan as LP
from dl2d.policy.target import train as TT
from dl2d.policy.planning.lp_lookahead import Lookahead
from dl2d.sim import engine as E
from dl2d.workload.speed import speed_table
from dl2d.workload.seeds import seed_list


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="testbed")
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--seeds", default="500-502", help="trace seeds, LO-HI")
    ap.add_argument("--candidates", type=int, default=8)
    ap.add_argument("--horizon", type=int, default=3)
    ap.add_argument("--measured-factor", action="store_true", help="each job's speed: the mean over all its slots")
    ap.add_argument("--view-factor", action="store_true", help="each job's speed: the view's job_speed_factor")
    ap.add_argument("--no-planner", action="store_true", help="skip the planner's own run")
    ap.add_argument("--starts", type=int, default=0,
                    help="local moves: start each of the first N jobs the planner leaves waiting (lp_lookahead.moves)")
    ap.add_argument("--shrinks", type=int, default=0,
                    help="local moves: each of the N jobs with the most tasks one size smaller")
    ap.add_argument("--grows", type=int, default=0,
                    help="local moves: each of the first N jobs the planner runs one size larger")
    ap.add_argument("--move-rounds", type=int, default=1,
                    help="local moves of the best move in turn, while one is better (at most N-1 times)")
    ap.add_argument("--in-bucket", type=int, default=0,
                    help="the program's in-bucket term, its tangent lines (dl2d.sim.lp_bound; 0: without it)")
    ap.add_argument("--table", default=None,
                    help="plan on this learned table (dl2d.policy.planning.learned_speeds; 'shipped': the package's) instead "
                         "of the measured one; the planner's run too")
    ap.add_argument("--out", default=None, help="append the JSON lines here too")
    args = ap.parse_args()
    if (args.candidates < 1 or args.horizon < 1 or args.move_rounds < 1
            or min(args.in_bucket, args.starts, args.shrinks, args.grows) < 0):
        raise SystemExit("--candidates, --horizon and --move-rounds must be at least 1, "
                         "--in-bucket, --starts, --shrinks and --grows at least 0")
    if args.measured_factor and args.view_factor:
        raise SystemExit("--measured-factor and --view-factor are two sources of one estimate: name one")
    factor = "slots" if args.measured_factor else "view" if args.view_factor else None
    setup = TT.TrainSetup(world="dl2", cluster=args.cluster, jobs=args.jobs)
    cfg = TT.sim_config(setup)
    table = speed_table(cfg.speed_model)
    if args.table:
        try:
            table = LS.load(LS.SHIPPED if args.table == "shipped" else args.table)[0]
        except ValueError as e:
            raise SystemExit(str(e)) from None
    for seed in seed_list(args.seeds):
        trace = TT.make_trace(setup, cfg, seed)
        row = {"cluster": args.cluster, "jobs": args.jobs, "seed": seed, "candidates": args.candidates,
               "horizon": args.horizon, "measured_factor": factor, "in_bucket": args.in_bucket,
               **({"table": args.table} if args.table else {}),
               **({"starts": args.starts, "shrinks": args.shrinks} if args.starts or args.shrinks else {}),
               **({"grows": args.grows} if args.grows else {}),
               **({"move_rounds": args.move_rounds} if args.move_rounds > 1 else {})}
        if not args.no_planner:
            planner = LP.on_table(table, in_bucket=args.in_bucket)
            row["planner"] = round(float(E.run(trace, planner, cfg, seed=seed).jct_slots.mean()), 3)
        policy = Lookahead(table, args.candidates, args.horizon, factor, seed, args.in_bucket, args.starts,
                           args.shrinks, args.grows, args.move_rounds)
        row["lookahead"] = round(float(E.run(trace, policy, cfg, seed=seed).jct_slots.mean()), 3)
        row.update(changed_slots=policy.changed, slots=policy.slots, decide_s=round(policy.seconds, 1))
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
