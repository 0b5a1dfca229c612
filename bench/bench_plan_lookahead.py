"""A better teacher than the planner on the measured speeds? One-slot lookahead over roundings of its plan, and
each job's speed measured from what it trained (DL2 world; issue 16's `testbed` bar).

The planner (dl2d.policy.lp_plan on the measured table) rounds its program's first bucket to one size a job:
the size it spends most of the bucket at, in alpha-point order. Where the program time-shares the first slot
between jobs, that rounding can be a poor slot. Here each slot:

* the candidates are the planner's own first slot and ``--candidates`` - 1 random roundings: each job draws a
  size with the probability of its share of the first bucket (or none with what is left), and the jobs are
  taken in alpha-point order jittered by up to two slots;
* each candidate is scored by ``--horizon`` slots simulated at the speeds the planner believes (the candidate,
  then the planner's own slots), plus the program's value from there (a lower bound on the rest);
* the best is carried out.

``--measured-factor``: each PS job's speeds are the table's times the mean over the slots it ran of what it
trained against what the table says for the pair it ran (its hidden interference, which any scheduler can
measure; the noise averages out). ``--view-factor``: the view's ``job_speed_factor`` instead, the mean of the
job's last 3 measured slots as the daemon and the simulator measure it (NaN, before one: 1). Without either the
planner believes the table as it stands. ``--in-bucket 8``: the planner's program (its own and the lookahead's)
with the bound's in-bucket term (dl2d.sim.lp_bound).

    python bench/bench_plan_lookahead.py --cluster testbed --jobs 30 --seeds 500-502 --candidates 8 --horizon 3
        [--measured-factor | --view-factor] [--in-bucket 8] [--out FILE.jsonl]

Prints a JSON line per seed: the planner's average JCT (slots) and the lookahead's, the slots where a
candidate beat the planner's own, and the seconds spent deciding.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy import lp_plan as LP
from dl2d.policy import target_train as TT
from dl2d.sim import engine as E
from dl2d.sim.bound import ps_rates
from dl2d.workload.speed import speed_table

from bench_plan import seed_range


class MeasuredFactor:
    """Each job's trained epochs against the table's for the (PS, workers) it ran, averaged over its slots."""

    def __init__(self, table: np.ndarray):
        self.table, self.last, self.total, self.count = table, {}, {}, {}

    def __call__(self, view: SlotView) -> np.ndarray:
        out = np.ones(len(view))
        for j, jid in enumerate(int(i) for i in view.job_ids):
            if jid in self.last and view.prev_workers[j] > 0 and not view.allreduce[j]:
                rate = ps_rates(int(view.type_idx[j]), self.table, view.max_ps, view.max_workers)
                expected = rate[int(view.prev_ps[j]), int(view.prev_workers[j])] * view.slot_seconds
                if expected > 0:
                    self.total[jid] = self.total.get(jid, 0.0) + (view.epochs_done[j] - self.last[jid]) / expected
                    self.count[jid] = self.count.get(jid, 0) + 1
            self.last[jid] = float(view.epochs_done[j])
            if self.count.get(jid):
                out[j] = self.total[jid] / self.count[jid]
        return out


def after_slot(view: SlotView, alloc: Allocation) -> tuple[SlotView | None, np.ndarray]:
    """The view one slot on if ``alloc`` trains every job at the speed the view believes (no arrivals; None: every
    job done), and the completion times (seconds from the slot's start) of the jobs it finishes."""
    rate = np.array([view.est_speed[j][int(alloc.ps[j]), int(alloc.workers[j])] for j in range(len(view))])
    trained = rate * view.slot_seconds
    left = np.maximum(np.asarray(view.remaining_epochs, float), 1e-6)
    done = trained >= left - 1e-9
    finished = view.slot_seconds * left[done] / trained[done]
    keep = np.flatnonzero(~done)
    if not len(keep):
        return None, finished
    nxt = view.subset(keep)
    nxt = replace(nxt, slot=view.slot + 1, epochs_done=nxt.epochs_done + trained[keep],
                  prev_workers=np.asarray(alloc.workers)[keep], prev_ps=np.asarray(alloc.ps)[keep])
    return nxt, finished


class Lookahead:
    """The policy of the module docstring."""

    def __init__(self, table, candidates: int, horizon: int, factor: str | None, seed: int, in_bucket: int = 0):
        self.table, self.candidates, self.horizon, self.in_bucket = table, candidates, horizon, in_bucket
        self.factor = {None: None, "slots": MeasuredFactor(table),
                       "view": LP.view_speed_factor}[factor]
        self.rng = np.random.default_rng(seed)
        self.name, self.changed, self.slots, self.seconds = "lp-plan-lookahead", 0, 0, 0.0

    def __call__(self, view: SlotView) -> Allocation:
        t0 = time.perf_counter()
        view = LP.measured_view(view, self.table, self.factor(view) if self.factor else None)
        p = LP.plan(view, in_bucket=self.in_bucket)
        candidates = [LP.first_slot(view, p)]
        for _ in range(self.candidates - 1):
            sizes = np.full(len(view), -1)
            for j, share in enumerate(p.first_share):
                if share.sum() > 1e-6:
                    w = np.clip(np.append(share, 1 - share.sum()), 0, None)
                    k = int(self.rng.choice(len(w), p=w / w.sum()))
                    sizes[j] = k if k < len(share) else -1
            jitter = p.alpha + self.rng.uniform(0, 2 * view.slot_seconds, len(view))
            order = np.lexsort((jitter, sizes < 0))
            candidates.append(LP.carry_out(view, [int(j) for j in order], np.where(sizes >= 0, sizes, p.most),
                                           p.options))
        best = int(np.argmin([self.value(view, a) for a in candidates]))
        self.changed += best != 0
        self.slots += 1
        self.seconds += time.perf_counter() - t0
        return candidates[best]

    def value(self, view: SlotView, alloc: Allocation) -> float:
        """The sum over the view's jobs of their completion times (seconds from now): ``alloc``, then the
        planner for ``horizon`` - 1 slots, simulated; then the program's lower bound for the jobs left."""
        total, v = 0.0, view
        for h in range(self.horizon):
            v, finished = after_slot(v, alloc)
            total += float(np.sum(finished + h * view.slot_seconds))
            if v is None:
                return total
            if h + 1 < self.horizon:
                alloc = LP.lp_plan(v, in_bucket=self.in_bucket)
        return total + len(v) * self.horizon * view.slot_seconds + LP.plan(v, in_bucket=self.in_bucket).value

    def applied(self, view, allocation, overridden: bool) -> None:
        pass

    def observe(self, reward: float) -> None:
        pass


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
    ap.add_argument("--in-bucket", type=int, default=0,
                    help="the program's in-bucket term, its tangent lines (dl2d.sim.lp_bound; 0: without it)")
    ap.add_argument("--out", default=None, help="append the JSON lines here too")
    args = ap.parse_args()
    if args.candidates < 1 or args.horizon < 1 or args.in_bucket < 0:
        raise SystemExit("--candidates and --horizon must be at least 1, --in-bucket at least 0")
    if args.measured_factor and args.view_factor:
        raise SystemExit("--measured-factor and --view-factor are two sources of one estimate: name one")
    factor = "slots" if args.measured_factor else "view" if args.view_factor else None
    setup = TT.TrainSetup(world="dl2", cluster=args.cluster, jobs=args.jobs)
    cfg = TT.sim_config(setup)
    table = speed_table(cfg.speed_model)
    for seed in seed_range(args.seeds):
        trace = TT.make_trace(setup, cfg, seed)
        row = {"cluster": args.cluster, "jobs": args.jobs, "seed": seed, "candidates": args.candidates,
               "horizon": args.horizon, "measured_factor": factor, "in_bucket": args.in_bucket}
        if not args.no_planner:
            planner = LP.on_measured_speeds(cfg, in_bucket=args.in_bucket)
            row["planner"] = round(float(E.run(trace, planner, cfg, seed=seed).jct_slots.mean()), 3)
        policy = Lookahead(table, args.candidates, args.horizon, factor, seed, args.in_bucket)
        row["lookahead"] = round(float(E.run(trace, policy, cfg, seed=seed).jct_slots.mean()), 3)
        row.update(changed_slots=policy.changed, slots=policy.slots, decide_s=round(policy.seconds, 1))
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
