"""A one-slot lookahead over roundings of the planner's first slot (dl2d.policy.planning.lp_plan), on a speed table. On the
simulator's measured table, which no scheduler reads, it is a teacher for the target-size network in the DL2
world (bench/bench_distill.py ``--teacher lookahead``) and the subject of bench/bench_plan_lookahead.py; on a
table learned from what jobs trained (dl2d.policy.planning.learned_speeds), with the settings :data:`REGISTERED`, it is
the registered policy ``lp-lookahead``.

Why: the planner rounds its program's first bucket to one size a job (the size it spends most of the bucket at,
in alpha-point order). Where the program time-shares the first slot between jobs, that rounding can be a poor
slot. Each slot here:

* the candidates are the planner's own first slot and ``candidates`` - 1 random roundings: each job draws a size
  with the probability of its share of the first bucket (or none with what is left), and the jobs are taken in
  alpha-point order jittered by up to two slots;
* each candidate is scored by ``horizon`` slots simulated at the speeds the planner believes (the candidate, then
  the planner's own slots), plus the program's value from there (a lower bound on the rest);
* with ``starts`` / ``shrinks`` / ``grows``, local moves of the planner's own rounding are candidates too
  (:func:`moves`): a job it leaves waiting started first at its smallest size, one of its largest jobs one size
  smaller, one of its first jobs one size larger. Unlike the random roundings they are a function of the slot alone;
* the best is carried out; with ``rounds`` > 1, where it is a move, the moves of that move are tried in turn.

With 8 candidates, a horizon of 3 and the bound's in-bucket term (``in_bucket=8``) it is 3.02 % above the LP bound
on `testbed`'s held-out seeds 0-19 (the planner 3.7 %), reading nothing the network lacks but the measured table;
2-8 minutes a trace on the 2-core development CPU. The local moves alone (one candidate, ``starts=4``,
``shrinks=3``) beat the planner on each of `testbed`'s held-out seeds 0-19, by 0.63 % (3.07 % above the bound;
docs/BENCHMARKS.md); with ``grows=3``, ``rounds=3`` too, by 0.90 % (2.79 % above the bound, within 3 % of
it). Distilled into the target-size network, the moves' gain is lost as the random
roundings' was: being a function of the slot is not enough for this network to learn them.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.planning import learned_speeds as LS
from dl2d.policy.planning import lp_plan as LP
from dl2d.policy.baselines.optimus import FittedOptimus
from dl2d.policy.registry import IgnoresFeedback, PolicyOptions
from dl2d.sim.bound import ps_rates


class MeasuredFactor:
    """Each job's trained epochs against the table's for the (PS, workers) it ran, averaged over its slots (its
    hidden interference, which any scheduler can measure; the noise averages out)."""

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


def moves(p: LP.Plan, order: list[int], sizes: np.ndarray, alloc: Allocation, starts: int, shrinks: int,
          grows: int = 0) -> list[tuple[list[int], np.ndarray]]:
    """Local moves of a rounding (``order``, ``sizes``) of plan ``p`` for :func:`lp_plan.carry_out` (``alloc``:
    that rounding carried out), as (order, sizes) pairs: for each of the first ``starts`` jobs it leaves waiting
    (in its order), that job placed first at its smallest size with a worker; for each of the ``shrinks`` jobs
    given the most tasks (more than one), that job at its largest size with fewer tasks and a worker; for each of
    the first ``grows`` jobs it runs (in its order), that job at its smallest size with more tasks. Why: where the
    lookahead's random roundings beat the planner's (`testbed`), they mostly start a long job at one worker with a
    task taken from the shortest jobs' last ones (docs/BENCHMARKS.md); these moves try that on purpose, the same
    in every run of the same slot."""
    workers = np.asarray(alloc.workers)
    tasks = workers + np.asarray(alloc.ps)
    out = []

    def resized(j: int, k: int) -> np.ndarray:
        moved = sizes.copy()
        moved[j] = k
        return moved

    waiting = [j for j in order if workers[j] == 0 and len(p.options[j][2])]
    for k in waiting[:starts]:
        ps, w = p.options[k][0], p.options[k][1]
        ok = np.flatnonzero(w >= 1)
        if len(ok):
            out.append(([k] + [j for j in order if j != k], resized(k, int(ok[np.argmin((ps + w)[ok])]))))
    for j in [int(j) for j in np.argsort(-tasks, kind="stable")[:shrinks] if tasks[j] > 1]:
        total = p.options[j][0] + p.options[j][1]
        smaller = np.flatnonzero((total < tasks[j]) & (p.options[j][1] >= 1))
        if len(smaller):
            out.append((order, resized(j, int(smaller[np.argmax(total[smaller])]))))
    for j in [j for j in order if workers[j] > 0][:grows]:
        total = p.options[j][0] + p.options[j][1]
        larger = np.flatnonzero((total > tasks[j]) & (p.options[j][1] >= 1))
        if len(larger):
            out.append((order, resized(j, int(larger[np.argmin(total[larger])]))))
    return out


#: where each job's speed factor comes from: none (the table as it stands), its slots so far, the view's
#: job_speed_factor (the mean of its last 3 measured slots, as the daemon and the simulator measure it)
FACTORS = (None, "slots", "view")


class Lookahead(IgnoresFeedback):
    """The policy of the module docstring, on the measured ``table`` (dl2d.workload.speed.speed_table), its
    random roundings drawn from ``seed``. With ``rounds`` > 1, a slot whose best candidate is not the planner's
    own tries the local moves of that best in turn, while one of them is better (at most ``rounds`` - 1 times)."""

    def __init__(self, table, candidates: int = 8, horizon: int = 3, factor: str | None = None, seed: int = 0,
                 in_bucket: int = 8, starts: int = 0, shrinks: int = 0, grows: int = 0, rounds: int = 1):
        if candidates < 1 or horizon < 1 or in_bucket < 0 or rounds < 1:
            raise ValueError(f"candidates, horizon and rounds must be at least 1 and in_bucket at least 0, got "
                             f"{candidates}, {horizon}, {rounds}, {in_bucket}")
        if min(starts, shrinks, grows) < 0:
            raise ValueError(f"starts, shrinks and grows must be at least 0, got {starts}, {shrinks}, {grows}")
        if factor not in FACTORS:
            raise ValueError(f"factor must be one of {FACTORS}, got {factor!r}")
        self.table, self.candidates, self.horizon, self.in_bucket = table, candidates, horizon, in_bucket
        self.starts, self.shrinks, self.grows, self.rounds = starts, shrinks, grows, rounds
        self.factor = {None: None, "slots": MeasuredFactor(table), "view": LP.view_speed_factor}[factor]
        self.rng = np.random.default_rng(seed)
        self.name, self.changed, self.slots, self.seconds = "lp-plan-lookahead", 0, 0, 0.0

    def __call__(self, view: SlotView) -> Allocation:
        t0 = time.perf_counter()
        view = LP.measured_view(view, self.table, self.factor(view) if self.factor else None)
        p = LP.plan(view, in_bucket=self.in_bucket)
        roundings = [LP.own_rounding(p)]
        for _ in range(self.candidates - 1):
            sizes = np.full(len(view), -1)
            for j, share in enumerate(p.first_share):
                if share.sum() > 1e-6:
                    w = np.clip(np.append(share, 1 - share.sum()), 0, None)
                    k = int(self.rng.choice(len(w), p=w / w.sum()))
                    sizes[j] = k if k < len(share) else -1
            jitter = p.alpha + self.rng.uniform(0, 2 * view.slot_seconds, len(view))
            order = np.lexsort((jitter, sizes < 0))
            roundings.append(([int(j) for j in order], np.where(sizes >= 0, sizes, p.most)))
        seen: set[bytes] = set()

        def scored(pairs):  # (value, order, sizes, allocation) of each pair whose allocation is new
            out = []
            for order, sizes in pairs:
                a = LP.carry_out(view, order, sizes, p.options)
                key = np.concatenate([a.workers, a.ps]).astype(np.int64).tobytes()
                if key not in seen:
                    seen.add(key)
                    out.append((self.value(view, a), order, sizes, a))
            return out

        own = scored(roundings[:1])[0]
        pool = [own] + scored(roundings[1:])
        pool += scored(moves(p, *own[1:], self.starts, self.shrinks, self.grows))
        best = min(pool, key=lambda c: c[0])
        for _ in range(self.rounds - 1):
            if best is own:
                break
            better = min(scored(moves(p, *best[1:], self.starts, self.shrinks, self.grows)), key=lambda c: c[0],
                         default=None)
            if better is None or better[0] >= best[0]:
                break
            best = better
        self.changed += best is not own
        self.slots += 1
        self.seconds += time.perf_counter() - t0
        return best[3]

    def value(self, view: SlotView, alloc: Allocation) -> float:
        """:func:`horizon_value` at this lookahead's horizon and program."""
        return horizon_value(view, alloc, self.horizon, self.in_bucket)


def horizon_value(view: SlotView, alloc: Allocation, horizon: int, in_bucket: int) -> float:
    """The sum over the view's jobs of their completion times (seconds from now) at the speeds the view believes:
    ``alloc``, then the planner (its program with ``in_bucket`` tangent lines) for ``horizon`` - 1 slots,
    simulated; then the program's lower bound for the jobs left. Lower is better: the lookahead's score of a
    candidate, and what keeps a departure of ``dl2-plan-checked`` (dl2d.policy.planning.plan_net)."""
    total, v = 0.0, view
    for h in range(horizon):
        v, finished = after_slot(v, alloc)
        total += float(np.sum(finished + h * view.slot_seconds))
        if v is None:
            return total
        if h + 1 < horizon:
            alloc = LP.lp_plan(v, in_bucket=in_bucket)
    return total + len(v) * horizon * view.slot_seconds + LP.plan(v, in_bucket=in_bucket).value


#: The registered policy's settings: the wider local moves alone (no random rounding: the same slot gets the
#: same decision), 3 slots simulated, the program with the in-bucket term (docs/BENCHMARKS.md).
REGISTERED = {"candidates": 1, "horizon": 3, "in_bucket": 8, "starts": 4, "shrinks": 3, "grows": 3, "rounds": 3}


def on_learned_speeds(path=None) -> FittedOptimus:
    """The lookahead (:data:`REGISTERED`) on a learned speed table (dl2d.policy.planning.learned_speeds; the package's by
    default) for PS jobs; all-reduce jobs, and PS jobs of a type the table lacks, on the fitted Optimus's
    speeds, as the registered ``lp-plan``."""
    table = LS.load(LS.SHIPPED if path is None else path)[0]
    return FittedOptimus(rule=Lookahead(table, **REGISTERED), name="lp-lookahead")


def check(options: PolicyOptions) -> list[tuple[str, str]]:
    from dl2d.policy.planning.plan_net import DL2_WORLD_ONLY

    return [] if options.world == "dl2" else [("world", DL2_WORLD_ONLY.format(name="lp-lookahead"))]


def build(options: PolicyOptions) -> FittedOptimus:
    return on_learned_speeds()
