"""The batch with the GPUs: any policy's allocation, and each job that lets the scheduler choose its total batch
(the view's ``adaptive``) given, whenever it (re)starts, the batch of the highest goodput on the GPUs it gets
(dl2d.workload.goodput: throughput x statistical efficiency, Pollux's objective for one job).

A job takes a new batch only at a restart (it reads its batch when it starts, as the job contract gives it): a job
restarting anyway gets the best batch for its new GPUs; one that keeps its GPUs is restarted for a new batch only
where that trains at least :data:`WORTH` faster than its own (a job's best batch grows as its gradients get
noisier, epoch by epoch). The gradient statistics are the view's (``grad_stats``: the daemon's fit of the job's own
reports), else its model's at the epoch it is in (what the job itself would measure, in the twin); a job's own
limits (``batch_limits``) bound the batches tried. The step times are the
measured tables' (dl2d.workload.batching), the scheduler's belief of the cluster; where an allocation does not
name its servers, the packed placement.

The inner policy sizes the jobs on a view whose adaptive jobs' believed speeds are those of the best batch at each
size (:func:`goodput_speeds`): it gives a job the GPUs its growing batch uses well, then the job gets that batch.
The curve's shape is the job's goodput in the epoch it is in, anchored at its believed one-GPU speed: early in
training a large batch is worth little, and a job may then train slower on more GPUs than on one (yolov3's first
epoch: a third as fast on 9 GPUs), which a curve scaled from its speed at the submitted batch (a mean over all
its epochs) hides. Searching sizes and batches together over the whole cluster is the ``pollux`` baseline's work.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.registry import Policy, StatelessPolicy
from dl2d.workload import goodput, throughput
from dl2d.workload.catalog import ALLREDUCE_MODELS, MODEL_NAMES, packed


def placement_of(servers, gpus_per_worker: float, workers: int, per_node: int) -> throughput.Placement:
    """GPUs per node of a job's workers on ``servers`` (packed when the allocation names none)."""
    if servers:
        return throughput.placement_on(servers, gpus_per_worker)
    return packed(workers * max(int(round(gpus_per_worker)), 1), per_node)


def job_batch_knowledge(view: SlotView, j: int) -> tuple[tuple[float, float] | None, float | None, float | None]:
    """(gradient statistics, largest total batch, most samples a GPU takes) of row ``j`` as the view has them;
    None for each the view does not know (the model's own)."""
    def known(values) -> tuple[float, ...] | None:
        return None if values is None or not np.all(np.isfinite(values[j])) else tuple(float(x) for x in values[j])
    stats, lim = known(view.grad_stats), view.batch_limits
    top = float(lim[j, 0]) if lim is not None and np.isfinite(lim[j, 0]) else None
    local = float(lim[j, 1]) if lim is not None and np.isfinite(lim[j, 1]) else None
    return stats, top, local


#: the epochs a believed speed curve is kept for (from the start of each block of this many: the statistical
#: efficiency moves slowly from epoch to epoch, and each curve is 50 goodputs at each size to compute)
EPOCH_STEP = 5
#: the step of the log noise scale a job's own gradient statistics are rounded to before its speeds are looked up
#: (5 %: the speeds are kept across slots while its fit moves less)
NOISE_STEP = 0.05


def _rounded(stats: tuple[float, float] | None) -> tuple[float, float] | None:
    """(1, noise scale rounded in log steps of NOISE_STEP): the gain depends on var / sqr alone."""
    if stats is None or not stats[0] > 0 or not stats[1] > 0:
        return stats
    return 1.0, float(np.exp(np.round(np.log(stats[1] / stats[0]) / NOISE_STEP) * NOISE_STEP))


@functools.lru_cache(maxsize=4096)
def speedups(model: str, gpus_per_worker: int, per_node: int, workers: int, epoch: int, batch: float,
             stats: tuple[float, float] | None, max_total: float | None, max_local: float | None) -> np.ndarray:
    """[workers + 1] how many times a job of ``model`` on one worker at ``batch`` it trains, during ``epoch``, on
    w workers (packed) at the best batch there: its best goodput there over its goodput on one worker at ``batch``
    (0 at 0 workers; 1 where the one-worker goodput is not defined)."""
    out = np.ones(workers + 1)
    out[0] = 0.0
    one = goodput.goodput(model, packed(gpus_per_worker, per_node), batch, epoch, stats, max_local=max_local)
    if not one > 0:
        return out
    for w in range(1, workers + 1):
        _, best = goodput.best_batch(model, packed(w * gpus_per_worker, per_node), epoch, stats, max_total,
                                     max_local=max_local)
        out[w] = best / one
    return out


def goodput_speeds(view: SlotView) -> SlotView:
    """``view`` with each adaptive job's believed speed at every size that of the best batch there: its believed
    one-worker speed (``est_speed``) times :func:`speedups`, so the curve has the shape of its goodput in the
    epoch it is in (module docstring). A policy then sizes a job knowing its batch grows with its GPUs, as
    Pollux's search does, in blocks of :data:`EPOCH_STEP` epochs. Sizes beyond what the cluster holds keep the
    largest it holds'."""
    if view.adaptive is None or not np.any(view.adaptive) or not len(view):
        return view
    est = np.array(view.est_speed, copy=True)
    per_node = max(int(view.capacity[:, 0].max()), 1) if len(view.capacity) else 1
    for j in np.flatnonzero(np.asarray(view.adaptive, bool)):
        model = MODEL_NAMES[int(view.type_idx[j])]
        if model not in ALLREDUCE_MODELS:
            continue
        gpw = max(int(round(view.worker_demand[j, 0])), 1)
        fits = int(min(view.max_workers, max(view.capacity[:, 0].sum() // gpw, 1)))
        stats, top, local = job_batch_knowledge(view, j)
        epoch = int(view.epochs_done[j]) // EPOCH_STEP * EPOCH_STEP
        base = view.batch_size if view.submitted_batch is None else view.submitted_batch  # est_speed's batch
        up = speedups(model, gpw, per_node, fits, epoch, float(base[j]), _rounded(stats), top, local)
        one = est[j, 0, 1]
        est[j, 0, :fits + 1] = one * up
        est[j, 0, fits + 1:] = one * up[-1]
    return replace(view, est_speed=est)


#: how much more goodput a new batch must give a job that keeps its GPUs to be worth a restart
WORTH = 0.2


def goodput_batches(view: SlotView, a: Allocation) -> np.ndarray:
    """[jobs] the batch each adaptive job restarting under ``a`` takes (0: it keeps its own)."""
    out = np.zeros(len(view))
    per_node = max(int(view.capacity[:, 0].max()), 1) if len(view.capacity) else 1
    prev = view.prev_worker_servers
    for j in np.flatnonzero(np.asarray(view.adaptive, bool) & (np.asarray(a.workers) > 0)):
        model = MODEL_NAMES[int(view.type_idx[j])]
        if model not in ALLREDUCE_MODELS:
            continue
        servers = a.worker_servers[j] if a.worker_servers is not None else None
        moved = servers is not None and prev is not None and sorted(servers) != sorted(prev[j])
        placement = placement_of(servers, view.worker_demand[j, 0], int(a.workers[j]), per_node)
        epoch = int(view.epochs_done[j])
        stats, top, local = job_batch_knowledge(view, j)
        best, g_best = goodput.best_batch(model, placement, epoch, stats, top, max_local=local)
        if best <= 0:
            continue
        if a.workers[j] == view.prev_workers[j] and not moved:  # it would run on as it is
            now = float(view.batch_size[j])
            if g_best < (1 + WORTH) * goodput.goodput(model, placement, now, epoch, stats, max_local=local):
                continue
        out[j] = best
    return out


class GoodputBatch:
    """Wraps a policy (module docstring)."""

    def __init__(self, inner):
        name = getattr(inner, "name", type(inner).__name__)
        self.inner: Policy = inner if isinstance(inner, Policy) else StatelessPolicy(inner, name)
        self.name = f"{name}+goodput"

    def __call__(self, view: SlotView) -> Allocation:
        if view.adaptive is None or not np.any(view.adaptive) or not len(view):
            return self.inner(view)
        a = self.inner(goodput_speeds(view))
        return replace(a, batch_size=goodput_batches(view, a))

    def applied(self, view: SlotView, allocation: Allocation, overridden: bool) -> None:
        self.inner.applied(view, allocation, overridden)

    def observe(self, reward: float):
        return self.inner.observe(reward)


def with_goodput_batch(policy) -> GoodputBatch:
    return GoodputBatch(policy)
