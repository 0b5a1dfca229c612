"""A tighter lower bound on the average JCT: a time-indexed linear program over every job's sizes.

Why: :func:`dl2d.sim.bound.lower_bound` takes the larger of two bounds that each ignore half of the problem: a
job alone at its fastest size (as if the cluster were its own), and the cluster as one machine doing each job's
least GPU work (as if every job could use the whole cluster at its best efficiency). On a lightly contended
workload the first binds and reads far below what is possible: every job's fastest size at once would need
several clusters. This bound keeps both facts in one program, so a job that runs fast pays in GPUs what the
others then lack.

The relaxation. Time is cut into buckets ``[t_b, t_b+1)``. For job j and size k (an all-reduce job's worker
count, a PS job's (PS, workers) pair) ``rho[j, k]`` is the fraction of the job one second at size k trains (its
true epochs at the speed's upper end, as lower_bound reads it: the best placement, the hidden interference
factor, the slot noise at ``1 + noise``) and ``d[j, k]`` the resources it holds [3]. The variables
``y[j, b, k] >= 0`` are the seconds job j spends at size k in bucket b. Any schedule the simulator can run
gives a feasible point:

* a job is at one size at a time, and not before its arrival plus its first start's restart:
  ``sum_k y[j, b, k] <= the part of bucket b after that``;
* the cluster holds what it has: ``sum_{j, k} y[j, b, k] d[j, k] <= capacity x |bucket b|`` per resource;
* every job finishes: ``sum_{b, k} y[j, b, k] rho[j, k] = 1``.

And what it minimises is below every schedule's total completion time: a job trained at a rate of at most
``rho_max[j]`` that ends at ``C_j`` has a mean busy time (the time at which the average part of it is trained)
of at most ``C_j - 1 / (2 rho_max[j])``; the mean busy time is at least the sum over buckets of the fraction
trained there times the bucket's (or the job's) start. So ``C_j >= sum_{b, k} y rho start_b + 1 / (2
rho_max[j])``.

The slow-part term. That last fact holds for a job trained at its fastest to the end; one held to slower
sizes ends further from its mean busy time, and the program knows which sizes it trains at. Sort the job's
sizes by rate, fastest first, ``r_1 >= r_2 >= ...``, and let ``u_k`` be the share of the job trained at
``r_k`` or slower (``u_1 = 1``). Whatever the order in time, ``C_j - M_j = integral of (C_j - t) r(t) dt`` is
least when the fastest part comes last, and then it is ``sum_k (1/r_k - 1/r_k-1) u_k^2 / 2`` (``1/r_0 = 0``;
the first term is the ``1 / (2 rho_max)`` above). A rate below ``r_k`` at size k (placement, noise below its
top) only adds to it. The program carries each ``u_k`` as a column and each ``u_k^2 / 2`` as a column held
above its tangent lines at 1/16, 2/16, ..., 1 (below the parabola, so still a bound): on a job that the
cluster holds to a slow size the term adds what the first fact misses (a test: a job of 100 s on one GPU and
60 s on two, alone on one GPU, is bounded at 100 s, where the first fact gave 80).

The in-bucket term. The program counts what a job trains in a bucket at the bucket's start, which loses up to
a bucket per job. But a job trains at most ``rho_max[j]``, so the share ``M`` of it trained in a bucket that
opens to it at ``t_b`` is trained no earlier than at that rate from ``t_b``: its part of the mean busy time is
at least ``t_b M + M^2 / (2 rho_max[j])``. The program carries a column per (job, bucket) held above the
parabola's tangent lines at M = rho_max x the bucket's width x (1/8, ..., 1) (below it, so still a bound),
costed in seconds. It adds to the slow-part term, which bounds the other half, ``C_j - M_j``. Exact for a job
alone at its fastest; jobs that share a bucket's resources each count from its start, so it recovers only part
of what the buckets lose there. Measured (DL2 world, seed 0, nominal speeds): whole-slot buckets with it
are about as tight as quarter-slot buckets without it at a tenth of the time (`testbed` 40.36 -> 40.72
against 40.72 in 62 s; `small` 25.71 -> 26.17 against 26.06), and quarter-slot ones gain 0.2-0.5 %
(40.82, 26.18). The planner (dl2d.policy.planning.lp_plan) solves the program without it unless asked (``in_bucket``):
with it, on `testbed`, 32.335 against 32.399 slots on held-out traces 0-4 and 34.229 against 34.275 on
validation traces 500-502, better on 6 of the 8.

Jobs whose batch the scheduler chooses (the trace's ``adaptive``). Such a job's rate at a size is its best
batch's there, and under the progress rule that moves with its epoch (:func:`adaptive_options`), so the job is
cut into parts of whole epochs, each with its own sizes and each trained to its share of the job (a row per part
in place of the job's one). The program may train a job's parts in any order, and a part's rate at a size is
its fastest epoch's: both relax what a job can do, so it stays a bound; more parts tighten it, and the program
grows with them (tuned Pollux workload 1, reference preset, 359 buckets: 1 part 0.220 h, below the simple
bound's 0.237 h, in 15 s; 4 parts 0.251 h in 5 min; 8 parts 0.261 h in 16 min; 8 parts on 120 buckets 0.256 h in
2.5 min). The other terms read a part's sizes as the job's own: the slow-part term's argument holds for any rate
the job trains at; the in-bucket term takes the job's fastest rate over all its parts.

Time-sharing between sizes inside a bucket is allowed (it only enlarges the feasible set), so
only the sizes on the upper concave hull of speed against resources matter; the others are dropped before the
program is built (for all-reduce jobs, whose resources all scale with the worker count; PS jobs keep their
Pareto-optimal pairs). That keeps the slow-part term a bound: a dropped size's seconds are replaced by the
same seconds at a time-share of two kept sizes (or by fewer at a dominating one), with the faster part last,
which trains as much with no more resources and leaves the job's last share trained no slower.

What it does not know, as lower_bound: which server a task lands on (placement contention, the shared-node
slowdown, a job spread when packed would be faster), restarts after the first, the noise's draws. Buckets
coarser than a slot lose up to a bucket per job (mass at a bucket's end is counted at its start; the in-bucket
term takes back part of that), so the result is the largest of this program and both of lower_bound's. Solved
with HiGHS (scipy's ``linprog``); a solve that does not reach optimality raises rather than report a number that
may not be a bound.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy import optimize, sparse

from dl2d.sim.bound import adaptive_rates, allreduce_rates, batch_adapting, epoch_progress, lower_bound, ps_rates
from dl2d.sim.engine import SimConfig
from dl2d.sim.trace import Trace
from dl2d.workload import catalog
from dl2d.workload.jobtypes import PS_DEMAND, WORKER_DEMAND
from dl2d.workload.speed import speed_table

#: At most this many buckets unless the caller says otherwise: the program has jobs x buckets x sizes columns.
DEFAULT_MAX_BUCKETS = 400
#: Tangent lines per (job, bucket) of the bound's in-bucket term (module docstring).
IN_BUCKET_TANGENTS = 8


@dataclass(frozen=True)
class LPBound:
    avg_jct_slots: float  # the largest of the program's and lower_bound's two
    lp_slots: float  # the program's own
    no_contention_slots: float
    capacity_slots: float
    bucket_s: float
    buckets: int
    columns: int
    tail_share: float  # of the work the program left after the last bucket (0: the horizon was long enough)
    solve_s: float


def upper_hull(points: np.ndarray) -> np.ndarray:
    """Indices of ``points`` [K, 2] (cost > 0, value) on the upper concave hull through the origin, cost
    ascending: the points no time-share of two others (or of one with doing nothing) beats."""
    order = np.lexsort((-points[:, 1], points[:, 0]))
    hull: list[int] = []
    for i in order:
        c, v = points[i]
        if v <= 0 or (hull and v <= points[hull[-1], 1]):
            continue  # slower than a cheaper size: never worth its cost
        while hull:
            c1, v1 = points[hull[-1]]
            c0, v0 = points[hull[-2]] if len(hull) > 1 else (0.0, 0.0)
            # the last point lies on or below the chord from the one before it to this one: drop it
            if (v1 - v0) * (c - c0) <= (v - v0) * (c1 - c0):
                hull.pop()
            else:
                break
        hull.append(int(i))
    return np.array(hull, int)


def pareto(rates: np.ndarray, demands: np.ndarray) -> np.ndarray:
    """Indices of the (rate, demand [3]) options no other option is at least as fast as with no more of any
    resource (one of the two strictly)."""
    keep = []
    for i in range(len(rates)):
        if rates[i] <= 0:
            continue
        better = (rates >= rates[i]) & np.all(demands <= demands[i], axis=1)
        strictly = (rates > rates[i]) | np.any(demands < demands[i], axis=1)
        if not np.any(better & strictly):
            keep.append(i)
    return np.array(keep, int)


def fits(demand: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """[K] which sizes' resources ``demand`` [K, 3] the whole cluster holds (a resource of capacity 0 is one the
    cluster does not count)."""
    return np.all((demand <= capacity) | (capacity <= 0), axis=1)


def grid_sizes(rate: np.ndarray, worker_demand: np.ndarray, ps_demand: np.ndarray,
               capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(PS [K], workers [K], epochs/s [K], resources [K, 3]) of the useful sizes of a job that trains at
    ``rate[p, w]`` epochs/s with p PS and w workers: at least one worker, held by the whole cluster
    (``capacity`` [3]), and no other size as fast with no more of any resource (the planner's and the bound's
    options of a PS job; an all-reduce job's row 0)."""
    p, w = np.meshgrid(np.arange(rate.shape[0]), np.arange(rate.shape[1]), indexing="ij")
    p, w, r = p.ravel(), w.ravel(), np.asarray(rate, float).ravel()
    demand = (w[:, None] * np.asarray(worker_demand, float)[None, :]
              + p[:, None] * np.asarray(ps_demand, float)[None, :])
    r = np.where((w >= 1) & fits(demand, capacity), r, 0.0)  # a size that never runs is no option
    keep = pareto(r, demand)
    return p[keep], w[keep], r[keep], demand[keep]


def hull_sizes(rate: np.ndarray, worker_demand: np.ndarray, capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rates [K], resources [K, 3]) of the all-reduce sizes 1..len(``rate``) workers of ``worker_demand`` [3] on
    the upper hull of rate against workers, among those the cluster (``capacity``) holds (the hull is taken after
    that: the largest size of a linear curve is no use where it does not fit)."""
    w = np.arange(1, len(rate) + 1, dtype=float)
    demand = w[:, None] * np.asarray(worker_demand, float)[None, :]
    fit = np.flatnonzero(fits(demand, capacity))
    keep = fit[upper_hull(np.stack([w[fit], rate[fit]], axis=1))] if len(fit) else fit
    return rate[keep], demand[keep]


def job_sizes(trace: Trace, cfg: SimConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per job: (epochs/s [K] before the job's own factors, resources [K, 3]) of its useful sizes among those
    the cluster holds (the hull or the Pareto set is taken after that: the largest size of a linear curve is
    no use where it does not fit)."""
    table = speed_table(cfg.speed_model)
    per_node = max(int(cfg.cluster.gpus), 1)
    capacity = np.asarray(cfg.cluster.capacity, float)
    names = trace.speed_names()
    cache: dict = {}
    out = []
    for i in range(len(trace)):
        t = int(trace.type_idx[i])
        if trace.allreduce[i]:
            g = max(int(round(catalog.WORKER_DEMAND[t, 0])), 1)
            key = ("ar", names[i], float(trace.batch_size[i]))
            if key not in cache:
                rate = allreduce_rates(names[i], key[2], cfg.max_workers, g, per_node, cfg.site_speeds,
                                       cfg.cluster.num_servers, cfg.speed_rules)
                cache[key] = hull_sizes(rate, catalog.WORKER_DEMAND[t], capacity)
        else:
            key = ("ps", t)
            if key not in cache:
                _, _, rate, demand = grid_sizes(ps_rates(t, table, cfg.max_ps, cfg.max_workers),
                                                WORKER_DEMAND[t], PS_DEMAND[t], capacity)
                cache[key] = (rate, demand)
        out.append(cache[key])
    return out


#: The parts an adaptive job's epochs are cut into under the progress rule (:func:`adaptive_options`).
ADAPTIVE_PHASES = 8


def adaptive_options(model: str, own_batch: float, epochs: float, worker_demand: np.ndarray, max_workers: int,
                     per_node: int, nodes: int, rules, capacity: np.ndarray, phases: int = ADAPTIVE_PHASES):
    """The sizes of a job of ``model`` whose batch the scheduler chooses, ``epochs`` long: (the share of the job one
    second trains [K], before the job's own factors; resources [K, 3]; the part of the job each size trains [K];
    each part's share of the job [P]).

    Why parts: the best batch, and so the rate, at a size moves with the job's epoch under the progress rule (the
    gradients get noisier, a larger batch is worth more), and a size fast late in a job is not that fast early.
    The job's epochs are cut into ``phases`` runs of whole epochs; a part's rate at a size is the highest of its
    epochs' (dl2d.sim.bound.adaptive_rates: over placements, the goodput candidates and the job's own batch), so
    no schedule trains a part faster than the program lets it, and the program may train the parts in any order
    (a relaxation, so still a bound). Under the iterations rule the job is one part."""
    g = max(int(round(worker_demand[0])), 1)
    key = (model, int(max_workers), g, int(per_node), int(nodes), rules)
    rates = np.maximum(adaptive_rates(*key, None), adaptive_rates(*key, float(own_batch)))  # [W, E]
    if rules.work == "progress":
        work = epoch_progress(model, epochs)
        used = np.flatnonzero(work > 0)
        blocks = [b for b in np.array_split(used, min(max(int(phases), 1), len(used))) if len(b)]
    else:
        work, blocks = np.array([float(epochs)]), [np.array([0])]
    total = float(sum(work[b].sum() for b in blocks))
    rate_out, demand_out, phase_out, shares = [], [], [], []
    for p, b in enumerate(blocks):
        rate, demand = hull_sizes(rates[:, b].max(axis=1) / total, worker_demand, capacity)  # of the job a second
        rate_out.append(rate)
        demand_out.append(demand)
        phase_out.append(np.full(len(rate), p))
        shares.append(float(work[b].sum()) / total)
    return np.concatenate(rate_out), np.concatenate(demand_out), np.concatenate(phase_out), np.array(shares)


def bucket_edges(release: np.ndarray, horizon: float, bucket_s: float) -> np.ndarray:
    """Edges from the first arrival to at least ``horizon``, ``bucket_s`` apart."""
    start = float(release.min())
    n = max(int(np.ceil((horizon - start) / bucket_s)), 1)
    return start + bucket_s * np.arange(n + 1)


@dataclass(frozen=True)
class Solution:
    """The program solved: its value (the least sum over jobs of the completion time's lower bound), and per
    column of the y variables its job, bucket (the number of closed buckets for the open one) and size (an
    index into the job's sizes as given), with its seconds ``y``."""

    value: float
    job: np.ndarray
    bucket: np.ndarray
    size: np.ndarray
    y: np.ndarray
    tail_share: float


def solve(rho: list[np.ndarray], demand: list[np.ndarray], start: np.ndarray, edges: np.ndarray,
          capacity: np.ndarray, tangents: int = 16, in_bucket: int = 0,
          phases: list[tuple[np.ndarray, np.ndarray]] | None = None) -> tuple[float, int, float]:
    """The program of the module docstring on the buckets ``edges`` (``tangents``: of each slow part's parabola;
    0 drops the slow-part term; ``in_bucket``: of each in-bucket term, 0 drops it), with one more bucket after
    the last edge that has no end and no capacity limit (what is trained there counts as trained at the last edge: a
    relaxation of every longer horizon, so the result is a bound whatever the horizon). Sizes that need more than
    ``capacity`` are dropped first. (The least sum over jobs of the completion time's lower bound, the number of
    columns, the share of the work left to the open bucket: above 0, a longer horizon would tighten the bound.)
    ``phases``: per job, (the phase of each of its sizes [K], each phase's share of the job [P]) where a job's
    parts train at rates of their own (:func:`adaptive_options`); None: every job one phase."""
    sol = solve_program(rho, demand, start, edges, capacity, tangents, in_bucket, phases)
    return sol.value, len(sol.y), sol.tail_share


def solve_program(rho: list[np.ndarray], demand: list[np.ndarray], start: np.ndarray, edges: np.ndarray,
                  capacity: np.ndarray, tangents: int = 16, in_bucket: int = 0,
                  phases: list[tuple[np.ndarray, np.ndarray]] | None = None) -> Solution:
    """:func:`solve` with the whole solution (a planner reads what the program does in its first bucket)."""
    if phases is None:
        phases = [(np.zeros(len(r), int), np.ones(1)) for r in rho]
    # a size that needs more than the cluster has never runs (the buckets' pooled capacity would let it)
    kept = [np.flatnonzero(fits(d, capacity)) for d in demand]
    phase = [np.asarray(p, int)[k] for (p, _), k in zip(phases, kept)]
    share = [np.asarray(s, float) for _, s in phases]
    if not all(len(np.unique(p)) == len(s) for p, s in zip(phase, share)):
        raise ValueError("a job has no size that fits the cluster (for one of its parts at least): "
                         "no schedule finishes it")
    rho, demand = [r[k] for r, k in zip(rho, kept)], [d[k] for d, k in zip(demand, kept)]
    n, nb = len(rho), len(edges) - 1
    lo = np.append(edges[:-1], edges[-1])
    hi = np.append(edges[1:], np.inf)
    cols_job, cols_bucket, cols_size = [], [], []
    for j in range(n):
        first = np.searchsorted(hi, start[j], side="right")  # the first bucket ending after the job may start
        b = np.arange(first, nb + 1)
        k = len(rho[j])
        cols_job.append(np.full(len(b) * k, j))
        cols_bucket.append(np.repeat(b, k))
        cols_size.append(np.tile(np.arange(k), len(b)))
    job, bucket, size = np.concatenate(cols_job), np.concatenate(cols_bucket), np.concatenate(cols_size)
    offsets = np.cumsum([0] + [len(r) for r in rho])
    rate = np.concatenate(rho)[offsets[job] + size]
    use = np.concatenate(demand)[offsets[job] + size]  # [columns, 3]
    cost = rate * np.maximum(lo[bucket], start[job])
    m = len(job)
    col = np.arange(m)
    closed = bucket < nb
    # one size at a time: a row per (job, closed bucket) it may use
    key = job[closed] * nb + bucket[closed]
    rows, row_index = np.unique(key, return_inverse=True)
    a_time = sparse.csr_matrix((np.ones(len(key)), (row_index, col[closed])), shape=(len(rows), m))
    b_time = hi[rows % nb] - np.maximum(lo[rows % nb], start[rows // nb])
    resources = [r for r in range(3) if capacity[r] > 0]
    r_rows, r_vals, r_cols = [], [], []
    for i, r in enumerate(resources):
        sel = closed & (use[:, r] > 0)
        r_rows.append(i * nb + bucket[sel])
        r_vals.append(use[sel, r])
        r_cols.append(col[sel])
    a_cap = sparse.csr_matrix((np.concatenate(r_vals), (np.concatenate(r_rows), np.concatenate(r_cols))),
                              shape=(len(resources) * nb, m))
    b_cap = np.concatenate([capacity[r] * (hi[:nb] - lo[:nb]) for r in resources])
    # every part of every job trains to its share: a row per (job, phase)
    firsts = np.cumsum([0] + [len(x) for x in share])
    n_parts = int(firsts[-1])
    a_eq = sparse.csr_matrix((rate, (firsts[job] + np.concatenate(phase)[offsets[job] + size], col)),
                             shape=(n_parts, m))
    slow_eq, slow_ub, b_slow, slow_cost = slow_part_rows(rho, job, size, rate, m, tangents)
    extra = slow_eq.shape[1] - m
    rho_max = np.array([float(r.max()) for r in rho])
    in_ub, b_in = in_bucket_rows(a_time @ sparse.diags(rate), b_time, rho_max[rows // nb], in_bucket)
    in_cols = in_ub.shape[1] - m
    a_ub = sparse.vstack([sparse.hstack([sparse.vstack([a_time, a_cap]),
                                         sparse.csr_matrix((a_time.shape[0] + a_cap.shape[0], extra + in_cols))]),
                          sparse.hstack([slow_ub, sparse.csr_matrix((slow_ub.shape[0], in_cols))]),
                          sparse.hstack([in_ub[:, :m], sparse.csr_matrix((in_ub.shape[0], extra)), in_ub[:, m:]])],
                         format="csr")
    a_eq = sparse.vstack([sparse.hstack([a_eq, sparse.csr_matrix((n_parts, extra + in_cols))]),
                          sparse.hstack([slow_eq, sparse.csr_matrix((slow_eq.shape[0], in_cols))])], format="csr")
    res = optimize.linprog(np.concatenate([cost, slow_cost, np.ones(in_cols)]), A_ub=a_ub,
                           b_ub=np.concatenate([b_time, b_cap, b_slow, b_in]), A_eq=a_eq,
                           b_eq=np.concatenate([*share, np.zeros(slow_eq.shape[0])]), bounds=(0, None),
                           method="highs")
    if res.status != 0:
        raise RuntimeError(f"the JCT bound's program did not reach optimality: {res.message}")
    y = res.x[:m]
    tail = float(np.sum(y[~closed] * rate[~closed])) / n
    original = np.concatenate(kept)[offsets[job] + size]
    return Solution(float(res.fun) + float(np.sum(0.5 / rho_max)), job, bucket, original, y, tail)


def in_bucket_rows(mass: sparse.csr_matrix, width: np.ndarray, rate_max: np.ndarray, tangents: int):
    """The rows and columns of the in-bucket term (module docstring): ``mass`` [P, m] gives the share of a job
    each of the P (job, closed bucket) pairs trains (``M``), ``width`` [P] how long the pair's bucket is open to
    the job and ``rate_max`` [P] the job's fastest rate. A column ``q >= M^2 / (2 rate_max)`` per pair, held
    there by ``tangents`` tangent lines at M = rate_max x width x (1/tangents ... 1), costs its value in seconds.
    (Inequality rows [.., m + P], their right-hand side; no rows or columns for ``tangents`` 0.)"""
    pairs, m = mass.shape
    if tangents <= 0:
        return sparse.csr_matrix((0, m)), np.zeros(0)
    blocks, rhs = [], []
    eye = sparse.identity(pairs, format="csr")
    for a in np.arange(1, tangents + 1) / tangents:
        # tangent at M0 = a x rate_max x width: (M0 / rate_max) M - q <= M0^2 / (2 rate_max)
        blocks.append(sparse.hstack([sparse.diags(a * width) @ mass, -eye]))
        rhs.append(rate_max * (a * width) ** 2 / 2)
    return sparse.vstack(blocks, format="csr"), np.concatenate(rhs)


def slow_part_rows(rho: list[np.ndarray], job: np.ndarray, size: np.ndarray, rate: np.ndarray, m: int,
                   tangents: int):
    """The rows and columns of the slow-part term (module docstring) after the program's ``m`` columns.

    Per job, its sizes sorted by rate, fastest first (rates r_1 >= r_2 >= ...): a column ``u_k`` (k >= 2) for
    the share of the job trained at the k-th rate or slower, defined by a chain of equalities ``u_k - u_k+1 -
    (what the sizes at position k train) = 0``; and a column ``z_k >= u_k^2 / 2``, held there by ``tangents``
    tangent lines ``a u_k - z_k <= a^2 / 2`` (a = 1/tangents ... 1: below the parabola, so still a bound),
    which costs ``(1/r_k - 1/r_k-1) z_k`` seconds. (Equality rows [.., m + extra], inequality rows, their
    right-hand side, the extra columns' costs.)"""
    eq_r, eq_c, eq_v, ub_r, ub_c, ub_v, b_ub, costs = [], [], [], [], [], [], [], []
    grid = np.arange(1, tangents + 1) / tangents
    n_eq = n_ub = 0
    nxt = m
    offsets = {}
    for j, r in enumerate(rho):
        order = np.argsort(-r, kind="stable")
        position = np.empty(len(r), int)
        position[order] = np.arange(len(r))
        k = len(r)
        if k < 2:
            continue
        u = nxt + np.arange(k - 1)  # u for positions 1 .. k-1 (0-based)
        z = nxt + k - 1 + np.arange(k - 1)
        nxt += 2 * (k - 1)
        offsets[j] = (n_eq, position)
        for p in range(1, k):
            row = n_eq + p - 1
            eq_r.append(row), eq_c.append(u[p - 1]), eq_v.append(1.0)
            if p + 1 < k:
                eq_r.append(row), eq_c.append(u[p]), eq_v.append(-1.0)
            for a in grid:
                ub_r += [n_ub, n_ub]
                ub_c += [u[p - 1], z[p - 1]]
                ub_v += [a, -1.0]
                b_ub.append(a * a / 2)
                n_ub += 1
        n_eq += k - 1
        rs = r[order]
        costs.append(np.concatenate([np.zeros(k - 1), np.maximum(1 / rs[1:] - 1 / rs[:-1], 0.0)]))
    # what each program column trains, in the row of its size's position (the fastest size has no row)
    for j, (first, position) in offsets.items():
        own = np.flatnonzero(job == j)
        sel = own[position[size[own]] > 0]
        eq_r.append(first + position[size[sel]] - 1)
        eq_c.append(sel)
        eq_v.append(-rate[sel])
    flat = lambda xs: np.concatenate([np.atleast_1d(np.asarray(x, float)) for x in xs]) if xs else np.zeros(0)
    shape_eq, shape_ub = (n_eq, nxt), (n_ub, nxt)
    a_eq = sparse.csr_matrix((flat(eq_v), (flat(eq_r).astype(int), flat(eq_c).astype(int))), shape=shape_eq)
    a_ub = sparse.csr_matrix((np.asarray(ub_v, float), (np.asarray(ub_r, int), np.asarray(ub_c, int))),
                             shape=shape_ub)
    return a_eq, a_ub, np.asarray(b_ub, float), (np.concatenate(costs) if costs else np.zeros(0))


def lp_lower_bound(trace: Trace, cfg: SimConfig, bucket_s: float | None = None,
                   max_buckets: int = DEFAULT_MAX_BUCKETS, in_bucket: int = IN_BUCKET_TANGENTS,
                   adaptive_phases: int = ADAPTIVE_PHASES) -> LPBound:
    """The bound of the module docstring for ``trace`` under ``cfg``. ``bucket_s``: the buckets' length
    (default: whole slots, as few as keep the horizon within ``max_buckets``); ``in_bucket``: the in-bucket
    term's tangent lines (0: without it); ``adaptive_phases``: the parts a job whose batch the scheduler chooses is
    cut into (:func:`adaptive_options`; more: tighter, a larger program). The horizon: the last start,
    plus the cluster doing every job's least GPU work, plus the longest job alone at its fastest; what the
    program trains after it counts as trained at its end, with no capacity limit (still a bound)."""
    if cfg.heterogeneous:
        raise ValueError("the LP bound assumes servers of speed 1; heterogeneous servers can be faster")
    trace.check_site(cfg.site_speeds)
    if bucket_s is not None and not bucket_s > 0:
        raise ValueError(f"bucket_s must be > 0, got {bucket_s}")
    simple = lower_bound(trace, cfg)
    sizes = job_sizes(trace, cfg)
    fastest = trace.speed_factor * (1 + cfg.slot_noise) / trace.true_epochs  # fraction of the job per epoch/s
    rho = [s[0] * fastest[j] for j, s in enumerate(sizes)]
    demand = [s[1] for s in sizes]
    phases = [(np.zeros(len(r), int), np.ones(1)) for r in rho]
    names = trace.speed_names()
    capacity = np.asarray(cfg.cluster.capacity, float)
    for i in batch_adapting(trace, cfg):  # the scheduler chooses its batch too
        rate, demand[i], part, share = adaptive_options(
            names[i], float(trace.batch_size[i]), float(trace.true_epochs[i]),
            catalog.WORKER_DEMAND[int(trace.type_idx[i])], cfg.max_workers, max(int(cfg.cluster.gpus), 1),
            cfg.cluster.num_servers, cfg.speed_rules, capacity, phases=adaptive_phases)
        rho[i] = rate * trace.speed_factor[i] * (1 + cfg.slot_noise)
        phases[i] = (part, share)
    release = trace.arrival_slot * cfg.slot_seconds
    start = release + cfg.resize_overhead_s
    rho_max = np.array([r.max() for r in rho])
    # a first horizon: the last arrival, plus the cluster doing every job's least work, plus the longest job alone
    gpus = max(float(cfg.cluster.capacity[0]), 1.0)
    longest = max((1 / rho_max).max(), simple.min_seconds.max())  # a part's rate is no job's whole speed
    horizon = float(start.max() + simple.gpu_seconds.sum() / gpus + longest)
    if bucket_s is None:
        slots = max(int(np.ceil((horizon - release.min()) / (max_buckets * cfg.slot_seconds))), 1)
        bucket_s = slots * cfg.slot_seconds
    t0 = time.perf_counter()
    edges = bucket_edges(release, horizon, bucket_s)
    completions, columns, tail = solve(rho, demand, start, edges, capacity, in_bucket=in_bucket, phases=phases)
    lp = (completions - trace.submitted.sum() * cfg.slot_seconds) / (len(trace) * cfg.slot_seconds)
    return LPBound(max(lp, simple.no_contention_slots, simple.capacity_slots), lp, simple.no_contention_slots,
                   simple.capacity_slots, float(bucket_s), len(edges) - 1, columns, tail, time.perf_counter() - t0)
