"""A planning scheduler: solve the JCT bound's linear program from where the cluster stands, every slot, and
do what its plan does now (model-predictive control on dl2d.sim.lp_bound's program).

Why: the program (a time-indexed relaxation over every job's sizes, dl2d.sim.lp_bound) knows what the greedy
rules do not: which jobs should finish first, and at which sizes the cluster's resources are best spent over
the whole horizon, not for the next task. The planner (``lp-plan`` when it was registered) reads only what a real
scheduler has: each job's speeds as the fitted Optimus believes them (fitted from what it observes of an all-reduce
job; a PS job's type's parametric fit) and its estimated remaining epochs, and plans again each slot from what
happened.
How good the plan is depends on that belief. On the DL2 world's held-out traces (docs/BENCHMARKS.md) the
planner on the parametric fit is the relative Optimus's equal (1 % behind it), and on the measured speeds
the simulator trains with (:func:`on_measured_speeds`, a reference and a teacher: no real scheduler has them)
it is 1.8 % (`small`) and 4.1 % (`testbed`) above the LP bound where the relative Optimus is 7.9 % and 11.5 %
above. One program a slot: 0.1-0.3 s at 40 jobs, growing with jobs x sizes.

The plan, per slot: every job's useful sizes (the (PS, workers) pairs, or worker counts, no other size beats
in speed with no more of any resource), each as the share of the job's remaining epochs it trains per second;
buckets one slot long at first, then doubling; the program solved (the slow-part term included: it keeps jobs
off sizes that are slow for what they hold). Each job's priority is the time by which the plan trains half of
what it has left (its alpha point). In that order each job planned to run in the first bucket gets the size
it spends most of that bucket at, as far as the cluster fits it; then the jobs planned for later get their
most used size from what is left.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.baselines.heuristics import AllocationBuilder
from dl2d.policy.baselines.optimus import FittedOptimus
from dl2d.policy.registry import StatelessPolicy
from dl2d.sim.lp_bound import grid_sizes, solve_program

#: bucket lengths in slots, from now; what the program trains after them counts at their end (the open bucket)
BUCKET_SLOTS = (1, 1, 1, 1, 2, 2, 4, 4, 8, 8, 16, 16, 32, 32, 64, 64)


def job_options(view: SlotView, j: int, capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                      np.ndarray]:
    """(PS [K], workers [K], epochs/s [K], resources [K, 3]) of job j's useful sizes in the view's belief, those
    the whole cluster (``capacity`` [3], its servers' sum) holds (none: the job is not planned)."""
    return grid_sizes(np.asarray(view.est_speed[j], float), view.worker_demand[j], view.ps_demand[j], capacity)


class Plan(NamedTuple):
    """The program solved from a view (:func:`plan`), per job: its priority (alpha point, seconds from now; inf:
    not planned), the size index it spends most of the first bucket at (-1: none), its most used size overall
    (-1: not planned), its options (job_options, those the cluster holds), and the share of the first bucket it
    spends at each of its sizes (a rounding other than "the most used" reads them; empty: not planned); and the
    program's value, the least sum over the planned jobs of their completion times' lower bounds, in seconds
    from now (what a lookahead scores a slot's end by)."""

    alpha: np.ndarray
    now: np.ndarray
    most: np.ndarray
    options: list
    first_share: list
    value: float = 0.0


def plan(view: SlotView, bucket_slots=BUCKET_SLOTS, in_bucket: int = 0) -> Plan:
    """The program from the view (:class:`Plan`); ``in_bucket``: the bound's in-bucket term's tangent lines
    (dl2d.sim.lp_bound; 0, the default: without it)."""
    n = len(view)
    capacity = np.asarray(view.capacity, float).sum(axis=0)
    options = [job_options(view, j, capacity) for j in range(n)]
    alpha = np.full(n, np.inf)
    now = np.full(n, -1)
    most = np.full(n, -1)
    share = [np.zeros(0) for _ in range(n)]
    planned = [j for j in range(n) if len(options[j][2])]
    if not planned:
        return Plan(alpha, now, most, options, share)
    remaining = np.maximum(np.asarray(view.remaining_epochs, float), 1e-6)
    rho = [options[j][2] / remaining[j] for j in planned]
    demand = [options[j][3] for j in planned]
    edges = view.slot_seconds * np.concatenate([[0.0], np.cumsum(bucket_slots)])
    sol = solve_program(rho, demand, np.zeros(len(planned)), edges, capacity, in_bucket=in_bucket)
    lo = np.append(edges[:-1], edges[-1])
    width = np.append(np.diff(edges), view.slot_seconds)
    work = sol.y * np.concatenate(rho)[np.cumsum([0] + [len(r) for r in rho])[sol.job] + sol.size]
    for i, j in enumerate(planned):
        mine = sol.job == i
        b, k, wk, y = sol.bucket[mine], sol.size[mine], work[mine], sol.y[mine]
        per_bucket = np.bincount(b, weights=wk, minlength=len(edges))
        cum = np.cumsum(per_bucket)
        h = int(np.searchsorted(cum, 0.5 * cum[-1] - 1e-12))  # the bucket in which half of it is trained
        before = cum[h] - per_bucket[h]
        alpha[j] = lo[h] + width[h] * (0.5 * cum[-1] - before) / max(per_bucket[h], 1e-12)
        most[j] = int(np.argmax(np.bincount(k, weights=wk, minlength=len(rho[i]))))
        first = b == 0
        share[j] = np.bincount(k[first], weights=y[first], minlength=len(rho[i])) / width[0]
        if y[first].sum() > 1e-6 * view.slot_seconds:
            now[j] = int(k[first][np.argmax(y[first])])
    return Plan(alpha, now, most, options, share, sol.value)


def lp_plan(view: SlotView, bucket_slots=BUCKET_SLOTS, in_bucket: int = 0) -> Allocation:
    """The plan's first slot on the view's servers (module docstring): a job's first bundle, its workers, its
    PS. (Placing a PS job's tasks as bundles while it wants both changed nothing on `testbed`: 36.005 slots
    against 35.995 on two validation traces.)"""
    if len(view) == 0:
        return AllocationBuilder(view).allocation()
    return first_slot(view, plan(view, bucket_slots, in_bucket))


def own_rounding(p: Plan) -> tuple[list[int], np.ndarray]:
    """The plan's own rounding of its first bucket, as (order, sizes) for :func:`carry_out`: the jobs planned for
    this slot first, each group by alpha point, each at the size it spends most of the bucket at (a job planned
    for later: its most used size)."""
    return [int(j) for j in np.lexsort((p.alpha, p.now < 0))], np.where(p.now >= 0, p.now, p.most)


def first_slot(view: SlotView, p: Plan) -> Allocation:
    """The plan's own rounding of its first bucket (:func:`own_rounding`) on the view's servers."""
    order, sizes = own_rounding(p)
    return carry_out(view, order, sizes, p.options)


def carry_out(view: SlotView, order: list[int], sizes: np.ndarray, options: list) -> Allocation:
    """Each job in ``order`` its size ``sizes[j]`` (an index into ``options[j]``; -1: none) on the view's
    servers, as far as they hold it: an all-reduce job its workers; a PS job its first bundle, then its workers
    and PS."""
    b = AllocationBuilder(view)
    for j in order:
        k = sizes[j]
        if k >= 0:
            b.add_sizes(j, int(options[j][1][k]), int(options[j][0][k]))
    return b.allocation()


def measured_view(view: SlotView, table: np.ndarray, factor: np.ndarray | None = None) -> SlotView:
    """The view with every PS job's believed speeds replaced by its type's row of the speed ``table`` (the one the
    simulator trains with, or one learned: dl2d.policy.planning.learned_speeds), times ``factor`` [jobs] where given (an
    estimate of each job's own speed against the table); all-reduce jobs keep theirs (their measured curve
    already), and so does a PS job of a type the table has no speed for."""
    from dl2d.sim.bound import ps_rates

    est = np.array(view.est_speed, float, copy=True)
    for j in np.flatnonzero(~np.asarray(view.allreduce)):
        t = int(view.type_idx[j])
        if not 0 <= t < len(table) or not table[t].any():  # a type the table does not know: the view's belief
            continue
        est[j] = ps_rates(t, table, view.max_ps, view.max_workers)
        if factor is not None:
            est[j] *= factor[j]
    return replace(view, est_speed=est)


def on_measured_speeds(cfg, view_factor: bool = False, in_bucket: int = 0) -> StatelessPolicy:
    """The planner on the speeds the simulator (``cfg``: a dl2d.sim.engine.SimConfig) trains a PS job with, its
    type's measured table, less the job's hidden interference and the noise (:func:`measured_view`); with
    ``view_factor``, times each job's measured speed (the view's ``job_speed_factor``; 1 before it is measured),
    what a scheduler learns of the interference by watching the job: a reference and a teacher
    (dl2d.policy.planning.plan_distill), never a scheduler (no real one reads the simulator's table). ``in_bucket``:
    :func:`plan`'s (on `testbed`, 8 tangents: 32.335 against 32.399 slots on held-out traces 0-4, 34.229
    against 34.275 on validation traces 500-502; better on 6 of the 8)."""
    from dl2d.workload.speed import speed_table

    return on_table(speed_table(cfg.speed_model), view_factor, in_bucket)


def on_table(table: np.ndarray, view_factor: bool = False, in_bucket: int = 0,
             name: str = "lp-plan-measured") -> StatelessPolicy:
    """The planner on a speed ``table`` [types, PS, workers] for PS jobs (:func:`measured_view`): the simulator's
    own (:func:`on_measured_speeds`) or one learned from observations (dl2d.policy.planning.learned_speeds); with
    ``view_factor`` as :func:`on_measured_speeds` says (its name then ends in ``-factor``)."""
    if not view_factor:
        return StatelessPolicy(lambda view: lp_plan(measured_view(view, table), in_bucket=in_bucket), name)
    return StatelessPolicy(lambda view: lp_plan(measured_view(view, table, view_speed_factor(view)),
                                                in_bucket=in_bucket), f"{name}-factor")


def view_speed_factor(view: SlotView) -> np.ndarray:
    """[jobs] each job's measured speed against the model (the view's ``job_speed_factor``), 1 where it is not
    measured (yet, or by this backend)."""
    if view.job_speed_factor is None:
        return np.ones(len(view))
    return np.nan_to_num(np.asarray(view.job_speed_factor, float), nan=1.0)



