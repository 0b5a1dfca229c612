"""How far is the distilled target-size network from its teacher, and which of its disagreements cost JCT?
(DL2 world; issue 16's `testbed` bar.)

The network drives every slot; in the variants it does not decide alone, the planner on the measured speeds
(dl2d.policy.planning.lp_plan.on_measured_speeds, with the bound's in-bucket term: the teacher the shipped network
learned) labels the same slot, and the jobs of one kind of disagreement take the planner's pair instead of the
network's, placed by the network's own fill (TargetPolicy.place). The kinds, per job and slot:

* ``ps``: the same workers, other PS;
* ``start``: one of the two runs the job, the other leaves it waiting;
* ``size``: both run it, at other worker counts;
* ``all``: every disagreement (the network's fill carrying out the planner's pairs);
* ``none``: the network alone (no planner is run).

``teacher`` runs the planner itself (its own rounding and placement, dl2d.policy.planning.lp_plan.carry_out).

    python bench/bench_teacher_gap.py dl2d/policy/target/pretrained/target-dl2.msgpack --seeds 500-504,0-4 \
        --variants none,all,ps,start,size,teacher [--cluster testbed --jobs 30 --in-bucket 8 --workers 2]

Prints a JSON line per variant: the mean and per-trace average JCT (slots) and, where the planner labels, how
many job-slots fell in each kind (agree, ps, the network waits, the network runs, more workers, fewer).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from dl2d.policy.target import policy as T
from dl2d.policy.target import view as TV
from dl2d.policy.target import train as TT
from dl2d.policy.checkpoint import CheckpointError, load_target
from dl2d.policy.planning.lp_plan import on_measured_speeds
from dl2d.policy.planning.plan_distill import pair_labels
from dl2d.sim import engine as E

from bench_plan import seed_range

VARIANTS = ("none", "all", "ps", "start", "size", "teacher")
#: the kinds of a job-slot, in the order the counts are printed
KINDS = ("agree", "ps", "net_waits", "net_runs", "net_more_workers", "net_fewer_workers")


def kinds(action: np.ndarray, label: np.ndarray, ps_levels: int) -> np.ndarray:
    """[J] each job's kind (an index into KINDS) from the network's pair ``action`` and the planner's ``label``
    (pair indices: workers level x ``ps_levels`` + PS level; workers level 0: waits)."""
    aw, lw = action // ps_levels, label // ps_levels
    return np.select([action == label, aw == lw, (aw == 0) & (lw > 0), (aw > 0) & (lw == 0), aw > lw],
                     [0, 1, 2, 3, 4], 5)


#: which kinds a variant hands to the planner
TAKEN = {"all": (1, 2, 3, 4, 5), "ps": (1,), "start": (2, 3), "size": (4, 5)}


class Mixed:
    """The network's choices with one kind of disagreement (``variant``) taken from the planner's."""

    def __init__(self, tcfg: T.TargetConfig, params, planner, variant: str):
        self.net, self.planner, self.tcfg, self.variant = TV.TargetPolicy(tcfg, params), planner, tcfg, variant
        self.counts = np.zeros(len(KINDS), int)
        self.name = f"target-{variant}"

    def __call__(self, view):
        if not len(view) or self.variant == "none":
            return self.net(view)
        action, obs = self.net.actions(view)
        plan = self.planner(view)
        label = pair_labels(self.tcfg, plan.workers, plan.ps, view.allreduce)
        kind = kinds(action, label, len(self.tcfg.ps_levels))
        self.counts += np.bincount(kind, minlength=len(KINDS))
        return self.net.place(view, np.where(np.isin(kind, TAKEN[self.variant]), label, action), obs)

    def applied(self, view, allocation, overridden: bool) -> None:
        pass

    def observe(self, reward: float) -> None:
        pass


def _run(args):
    checkpoint, cluster, jobs, in_bucket, variant, seed = args
    setup = TT.TrainSetup(world="dl2", cluster=cluster, jobs=jobs)
    cfg = TT.sim_config(setup)
    planner = on_measured_speeds(cfg, in_bucket=in_bucket)
    if variant == "teacher":
        policy, counts = planner, None
    else:
        ck = load_target(checkpoint)
        policy = Mixed(ck.config, ck.params, planner, variant)
        counts = policy.counts
    jct = float(E.run(TT.make_trace(setup, cfg, seed), policy, cfg, seed=seed).jct_slots.mean())
    return variant, seed, jct, None if counts is None or variant == "none" else counts.tolist()


def seeds_of(text: str) -> list[int]:
    """``500-504,0-4`` -> [500, ..., 504, 0, ..., 4] (each part as bench_plan.seed_range reads it); a malformed one
    stops the run."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or int(hi or lo) < int(lo):
            raise SystemExit(f"--seeds is LO-HI[,LO-HI...] of whole numbers, got {text!r}")
        out += seed_range(part)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="a DL2-world target-size checkpoint")
    ap.add_argument("--seeds", default="500-504,0-4")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--cluster", default="testbed")
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--in-bucket", type=int, default=8, help="the planner's in-bucket tangents (0: without)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    variants = args.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {', '.join(bad)}; known: {', '.join(VARIANTS)}")
    if args.jobs < 1 or args.in_bucket < 0 or args.workers < 1:
        raise SystemExit("--jobs and --workers must be at least 1, --in-bucket at least 0")
    seeds = seeds_of(args.seeds)
    try:  # a bad checkpoint stops here, before any process starts
        load_target(args.checkpoint)
    except CheckpointError as e:
        raise SystemExit(str(e))
    work = [(args.checkpoint, args.cluster, args.jobs, args.in_bucket, v, s) for v in variants for s in seeds]
    with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
        done = list(pool.map(_run, work))
    for v in variants:
        rows = [r for r in done if r[0] == v]
        line = {"variant": v, "cluster": args.cluster, "jobs": args.jobs, "seeds": args.seeds,
                "mean": round(float(np.mean([r[2] for r in rows])), 3), "jct": [round(r[2], 3) for r in rows]}
        if rows[0][3] is not None:
            line["job_slots"] = dict(zip(KINDS, np.sum([r[3] for r in rows], axis=0).tolist()))
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
