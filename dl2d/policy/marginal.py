"""Optimus's allocation rule as a pure JAX function of arrays: greedy marginal gain per unit of dominant share.

The same rule as :class:`dl2d.policy.optimus.Optimus` (every eligible job first gets one bundle, in arrival
order; then, one task at a time, the job whose next task, a worker or a PS, cuts its estimated remaining time
the most per unit of the task's dominant share of the cluster takes it; a job whose best task no longer fits
gets nothing more; it stops when no task gains), on aggregate capacity instead of servers. Why here: the
learned target-size policy (dl2d.policy.target) runs it inside its jitted slot, both as what a job would get
from the best heuristic (a feature) and as its fill, so it must be a function of arrays, vmappable over
clusters; on a view it runs on the view's arrays (aggregate capacity), so both sides compute the same.

How, without a step per task: a job's gain depends only on its own allocation, so each job's sequence of moves
(its chain: what it would take were it always chosen) is computed for all jobs at once, a scan of W + P steps.
The NumPy rule's heap merges the chains by their heads; replacing each chain's utilities by their running
minimum makes every chain non-increasing and leaves that merge unchanged, so it becomes one sort. Capacity is
then checked in rounds (cumulative demand along the sorted moves): the moves before the first that does not
fit are taken, that move's job gets no more (the heap rule), and the next round starts after it; at most
J + 1 rounds. A test checks it against the NumPy Optimus where one server is the whole cluster.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

#: Slack when comparing a demand with what is free (float sums).
_EPS = 1e-6


def optimus_counts(speed, remaining, worker_demand, ps_demand, allreduce, eligible, arrival, capacity):
    """(workers [J], PS [J]) Optimus gives the ``eligible`` jobs.

    ``speed`` [J, P + 1, W + 1] estimated epochs/s at (PS, workers) (an all-reduce job's in row 0),
    ``remaining`` [J] epochs, ``worker_demand``/``ps_demand`` [J, 3], ``allreduce`` [J] bool, ``eligible`` [J]
    bool, ``arrival`` [J] (the bundle order), ``capacity`` [3] the cluster's total. Pure.
    """
    J, P1, W1 = speed.shape
    f = speed.dtype
    bundle = worker_demand + jnp.where(allreduce[:, None], 0.0, ps_demand)
    order = jnp.argsort(jnp.where(eligible, arrival, jnp.iinfo(jnp.int32).max), stable=True)

    def give_bundle(free, j):
        ok = eligible[j] & jnp.all(bundle[j] <= free + _EPS) & (W1 > 1) & (allreduce[j] | (P1 > 1))
        return free - jnp.where(ok, bundle[j], 0.0), ok

    free, got = jax.lax.scan(give_bundle, jnp.asarray(capacity, f), order)
    w = jnp.zeros(J, jnp.int32).at[order].set(got.astype(jnp.int32))
    p = jnp.where(allreduce, 0, w)
    cap = jnp.asarray(capacity, f)
    share = lambda d: jnp.max(jnp.where(cap > 0, d / jnp.where(cap > 0, cap, 1.0), 0.0), axis=1)  # noqa: E731
    share_w, share_p = jnp.maximum(share(worker_demand), 1e-9), jnp.maximum(share(ps_demand), 1e-9)
    rows = jnp.arange(J)

    def remaining_time(pp, ww):
        s = speed[rows, jnp.clip(pp, 0, P1 - 1), jnp.clip(ww, 0, W1 - 1)]
        return jnp.where(s > 0, remaining / jnp.where(s > 0, s, 1.0), jnp.inf)

    def best_moves(w, p):
        """[J] the best task's utility (-inf: none) and whether it is a PS."""
        now = remaining_time(p, w)
        gain_w = now - remaining_time(p, w + 1)
        gain_p = now - remaining_time(p + 1, w)
        gain_w = jnp.where(jnp.isnan(gain_w), 0.0, gain_w)  # inf - inf: no speed either way
        gain_p = jnp.where(jnp.isnan(gain_p), 0.0, gain_p)
        u_w = jnp.where(w + 1 < W1, gain_w / share_w, -jnp.inf)
        u_p = jnp.where(~allreduce & (p + 1 < P1), gain_p / share_p, -jnp.inf)
        return jnp.maximum(u_w, u_p), u_p > u_w  # the worker first on a tie, as the NumPy rule

    # Each job's chain: the moves it would make if it were always the one chosen (its utilities depend on its
    # own allocation only), at most W + P of them; -inf once it has none.
    def chain_step(c, _):
        w_, p_ = c
        util, is_ps = best_moves(w_, p_)
        util = jnp.where(w_ > 0, util, -jnp.inf)  # no bundle, no more
        moves = jnp.isfinite(util)
        return (w_ + (moves & ~is_ps), p_ + (moves & is_ps)), (util, is_ps)

    _, (util, is_ps) = jax.lax.scan(chain_step, (w, p), None, length=(W1 - 1) + (P1 - 1))  # [S, J]
    # The heap's greedy merges the chains by their heads; with each chain's running minimum in place of its
    # utilities every chain is non-increasing, and the same merge is one sort (descending; ties: the lower job,
    # then the earlier move, as the heap pops them).
    util = jax.lax.cummin(util, axis=0)
    S = util.shape[0]
    job = jnp.broadcast_to(rows[None, :], (S, J)).ravel()
    step = jnp.broadcast_to(jnp.arange(S)[:, None], (S, J)).ravel()
    order = jnp.lexsort((step, job, -util.ravel()))
    u_s, j_s, ps_s = util.ravel()[order], job[order], is_ps.ravel()[order]
    need = jnp.where(ps_s[:, None], ps_demand[j_s], worker_demand[j_s])
    idx = jnp.arange(S * J)
    positive = u_s > 0  # sorted descending: the greedy stops at the first that gains nothing

    # Walk the sorted moves in rounds: every move up to the first that does not fit is taken; that one's job
    # gets no more this slot (the heap rule); the next round starts after it. At most J + 1 rounds.
    def cond(c):
        return c[4]

    def body(c):
        taken, closed, free, pos, _ = c
        cand = positive & (idx >= pos) & ~closed[j_s]
        cum = jnp.cumsum(jnp.where(cand[:, None], need, 0.0), axis=0)
        over = cand & jnp.any(cum > free[None, :] + _EPS, axis=1)
        failed = jnp.any(over)
        first = jnp.where(failed, jnp.argmax(over), S * J)
        take = cand & (idx < first)
        free = free - jnp.sum(jnp.where(take[:, None], need, 0.0), axis=0)
        closed = closed.at[j_s[jnp.minimum(first, S * J - 1)]].set(closed[j_s[jnp.minimum(first, S * J - 1)]] | failed)
        return taken | take, closed, free, first + 1, failed

    taken, *_ = jax.lax.while_loop(cond, body, (jnp.zeros(S * J, bool), jnp.zeros(J, bool), free, 0,
                                                jnp.asarray(True)))
    w = w + jnp.zeros(J, jnp.int32).at[j_s].add((taken & ~ps_s).astype(jnp.int32))
    p = p + jnp.zeros(J, jnp.int32).at[j_s].add((taken & ps_s).astype(jnp.int32))
    return w, p
