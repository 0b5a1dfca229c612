"""Elastic shortest-remaining-work-first: dl2d's hand-written policy for clusters of all-reduce jobs.

Every slot it re-decides each job's size from the view's speed estimate ``c_j(k)`` (epochs per second on k
workers; for a PS job k workers with k PS):

1. **Order**: jobs by remaining work, the epochs left over their one-worker speed (shortest first: what
   minimises the average JCT when the cluster is the bottleneck);
2. **Efficient sizes first**: in that order, each job gets its *efficient size*, the largest k whose speed
   is at least ``efficiency`` x k x c_j(1) and faster than every smaller size, or what is left;
3. **Then speed**: GPUs still free go, one at a time, to the job whose remaining time they shorten the
   most (marginal gain, as Optimus), never past a job's fastest size;
4. **Few restarts**: a running job keeps its size when the new one would save it less than
   ``keep_gain`` of its remaining time, since a resize restarts it (tens of seconds lost), and keeps its
   servers (the placement prefers them).

Nothing here is learned: the efficiency and keep thresholds are settings with stated defaults, chosen on
generated Philly workloads (seeds 100-103), never on the Pollux workloads the benchmark reports.

**A job whose batch the scheduler chooses** (the view's ``adaptive``; its believed speeds are its best batch's at
each size, dl2d.policy.elastic.goodput) has a speed curve that is not concave: a batch that fits one node, then
a larger one over nodes that pays off only some GPUs further. For such a job step 3 jumps to the size ahead that
saves the most time per GPU (not only the next one), a job kept at its size still grows into GPUs left over where
that saves ``ADAPTIVE_KEEP_GAIN`` of its time, it keeps its size against a larger gain (its best batch, and so its
curve, moves every few epochs), and it is ordered by the GPU-seconds it needs at the size step 2 gives it (its
one-GPU time overstates a job whose batch grows with its GPUs). The gain was chosen, like the others, on
generated workloads (both styles, loads 1 and 2, seeds 100-103, every job adaptive, the reference preset).

``node_workers``: a job of more workers than a node holds takes whole nodes' worth (a multiple of
``node_workers``), as a site that gives multi-node jobs whole nodes would. A multi-node all-reduce job sharing a
node with another is slowed (dl2d.sim.allreduce), which whole nodes avoid where the placement finds them free.
The registered policy does this when the site asks for it (``PolicyOptions.whole_nodes``, the daemon's
``policy.whole_nodes``; off by default), each job's node size read from the view (:func:`node_workers`).
bench/bench_mpc.py chooses between the two rules slot by slot.
"""
from __future__ import annotations

import heapq

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.baselines.heuristics import AllocationBuilder, remaining_time_estimate
from dl2d.policy.registry import PolicyOptions, StatelessPolicy

EFFICIENCY = 0.6
KEEP_GAIN = 0.3
ADAPTIVE_KEEP_GAIN = 0.8


def size_curves(view: SlotView) -> np.ndarray:
    """[jobs, max_workers + 1] estimated speed with k workers (and k PS for a PS job, up to max_ps)."""
    k = np.arange(view.max_workers + 1)
    ps = np.minimum(k, view.max_ps)
    rows = np.arange(len(view))[:, None]
    return np.where(view.allreduce[:, None], view.est_speed[:, 0, :], view.est_speed[rows, ps[None, :], k[None, :]])


def efficient_sizes(curves: np.ndarray, efficiency) -> np.ndarray:
    """[jobs] the largest k with c(k) >= efficiency * k * c(1) that is faster than every smaller k (>= 1);
    ``efficiency``: a number, or one per job [jobs]."""
    k = np.arange(curves.shape[1])
    best_before = np.maximum.accumulate(curves, axis=1)
    faster = np.concatenate([np.ones((len(curves), 1), bool), curves[:, 1:] > best_before[:, :-1]], axis=1)
    eff = np.asarray(efficiency, float).reshape(-1, 1)
    good = (curves >= eff * k[None, :] * curves[:, 1:2]) & faster & (k[None, :] >= 1)
    return np.where(good.any(axis=1), np.where(good, k[None, :], 0).max(axis=1), 1)


def allowed_sizes(max_workers: int, node_workers: int = 0) -> np.ndarray:
    """[max_workers + 1] which worker counts a job may take: every one, or (``node_workers`` > 0) every count
    up to a node's and multiples of it above."""
    k = np.arange(max_workers + 1)
    return (k <= node_workers) | (k % node_workers == 0) if node_workers > 0 else np.ones(max_workers + 1, bool)


def node_workers(view: SlotView) -> np.ndarray:
    """[jobs] the workers of each job a node holds: the GPUs of the cluster's most common server over the job's
    GPUs per worker (0 for a job whose workers need no GPU: no whole-node rule for it)."""
    gpus = np.asarray(view.capacity, float)[:, 0] if len(view.capacity) else np.zeros(1)
    values, counts = np.unique(gpus, return_counts=True)
    node = float(values[np.argmax(counts)])  # the most common server (the largest among equally common)
    per_worker = np.asarray(view.worker_demand, float)[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(per_worker > 0, np.floor(node / np.where(per_worker > 0, per_worker, 1.0)), 0).astype(int)


def whole_nodes_of(workers: int, node: int) -> int:
    """The most workers up to ``workers`` that :func:`allowed_sizes` allows: cut down to whole nodes of ``node``
    workers when above one node (as they are otherwise, or with ``node`` 0)."""
    return int(workers) if node <= 0 or workers <= node else int(workers) // int(node) * int(node)


def next_sizes(allowed: np.ndarray) -> np.ndarray:
    """[len(allowed)] the smallest allowed count above each count (len(allowed) where none is)."""
    out, nxt = np.empty(len(allowed), int), len(allowed)
    for k in range(len(allowed) - 1, -1, -1):
        out[k] = nxt
        if allowed[k]:
            nxt = k
    return out


def elastic_srtf(view: SlotView, efficiency=EFFICIENCY, keep_gain=KEEP_GAIN, node_workers=0) -> Allocation:
    """The policy (module docstring). The two thresholds may be given one per job [jobs]. ``node_workers``: whole
    nodes for multi-node jobs (module docstring), a number or one per job [jobs] (:func:`node_workers`); 0, the
    registered policy's default: off."""
    b = AllocationBuilder(view)
    curves = size_curves(view)
    per_job = np.broadcast_to(np.asarray(node_workers, int), (len(view),))
    sizes = {n: allowed_sizes(curves.shape[1] - 1, n) for n in set(per_job.tolist())}  # once per node size
    steps = {n: next_sizes(a) for n, a in sizes.items()}
    allowed = np.array([sizes[n] for n in per_job.tolist()], bool).reshape(len(view), curves.shape[1])
    step_to = np.array([steps[n] for n in per_job.tolist()], int).reshape(allowed.shape)
    allowed_curves = np.where(allowed, curves, 0.0)  # a count not allowed is never wanted nor fastest
    rem = view.remaining_epochs
    rows = np.arange(len(view))
    adaptive = np.zeros(len(view), bool) if view.adaptive is None else np.asarray(view.adaptive, bool)
    keep_gain = np.where(adaptive, ADAPTIVE_KEEP_GAIN, keep_gain)
    want = efficient_sizes(allowed_curves, efficiency)
    fastest = allowed_curves.argmax(axis=1)
    prev = view.prev_workers
    with np.errstate(divide="ignore", invalid="ignore"):
        t_prev = np.where(curves[rows, prev] > 0, rem / curves[rows, prev], np.inf)
        t_want = rem / curves[rows, want]
        times = np.where(allowed_curves > 0, rem[:, None] / np.where(allowed_curves > 0, allowed_curves, 1.0), np.inf)
    keep = (prev > 0) & (t_prev <= t_want * (1 + keep_gain))
    want = np.where(keep, prev, want)
    work = remaining_time_estimate(view)
    if adaptive.any():  # GPU-seconds at the size it is to get (module docstring)
        work = np.where(adaptive, np.nan_to_num(times[rows, want] * want, nan=np.inf), work)
    order = np.lexsort((view.arrival_slot, work))
    for j in (int(j) for j in order):
        while b.workers(j) < want[j] and b.add(j, "bundle", want[j] - b.workers(j)):
            pass
        k = whole_nodes_of(b.workers(j), per_job[j])
        if k != b.workers(j):  # what was left is not whole nodes: the whole nodes in it
            b.shrink_to(j, k, k)
    heap = []

    def push(j: int, room: int | None = None) -> None:
        k = b.workers(j)
        if not 0 < k < fastest[j]:
            return
        if adaptive[j]:  # the size ahead that saves the most per GPU, within ``room`` more
            top = fastest[j] if room is None else min(int(fastest[j]), k + room)
            ahead = np.flatnonzero(allowed[j, k + 1:top + 1]) + k + 1
            bar = times[j, k] / (1 + keep_gain[j]) if keep[j] and k == prev[j] else times[j, k]
            ahead = ahead[times[j, ahead] < bar]
            if len(ahead):
                gains = (times[j, k] - times[j, ahead]) / (ahead - k)
                i = int(np.argmax(gains))
                heapq.heappush(heap, (-float(gains[i]), j, int(ahead[i])))
        elif not keep[j]:
            up = step_to[j, k]  # k + 1 unless whole nodes are asked for
            gain = (rem[j] / curves[j, k] - rem[j] / curves[j, up]) / (up - k)
            if gain > 0:
                heapq.heappush(heap, (-gain, j, int(up)))

    for j in range(len(view)):
        push(j)
    while heap:
        _, j, up = heapq.heappop(heap)
        k = b.workers(j)
        if b.add_gang(j, up - k, up - k):  # one bundle, the rest of a node, or (adaptive) the size ahead
            push(j)
        elif adaptive[j] and up - k > 1:  # not room for it: the best of what is nearer
            push(j, up - k - 1)
    return b.allocation()


def elastic_whole_nodes(view: SlotView) -> Allocation:
    """The registered rule with whole nodes for multi-node jobs, each job's node size read from the view."""
    return elastic_srtf(view, node_workers=node_workers(view))


def build(options: PolicyOptions) -> StatelessPolicy:
    return StatelessPolicy(elastic_whole_nodes if options.whole_nodes else elastic_srtf, "elastic")
