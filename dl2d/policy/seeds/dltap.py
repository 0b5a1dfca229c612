"""DLTAP placement (Qiao, Li, Wu: "DLTAP: a network-efficient scheduling method for distributed deep
learning workload in containerized cluster environment"), as a placement strategy for any allocation
policy (its translation into Slurm node selection: dl2d.daemon.slurm.mapping.slurm_node_selection).

The paper's method, per job (its section 3, Eq. 1-3, Algorithm 1):
1. every worker task goes to the node with the best default score (Eq. 1: the weighted default priority
   methods of the container scheduler; here the DL2 simulator's own one, load balancing:
   score = 1 - load / R, load = the sum over the R resources of the used fraction, so the best node is
   exactly the one `Placer` would pick);
2. every PS task then goes to the node with the best  score + weightOfDLTAP * priorityScoreOfDLTAP
   (Eq. 2), priorityScoreOfDLTAP = (this job's worker tasks on the node) / (this job's worker tasks)
   (Eq. 3, the "aggregation degree"). The paper gives no value of weightOfDLTAP; we use 1.0 (the range of
   the default score) unless told otherwise.
Ties: the paper picks a random one among equal best nodes; we take the lowest node index, so placement
is deterministic (reproducible runs).

Interleaving: by default a job's tasks are placed worker, PS, worker, PS, ... (the order of the engine's
default placement and of the baselines' bundles), each PS scored by Eq. 2 against the job's workers
placed so far, so that DLTAP changes only where a PS goes and re-placing a full allocation fails about
as rarely as the default placement. `workers_first=True` is the paper's literal two steps (all workers,
then all PS); on a packed cluster it leaves more tasks without room.

`pack_workers=True` is our extension, not the paper's: workers are scored with the same aggregation
bonus, (this job's tasks already on the node) / (this job's tasks placed so far), so a job's tasks land
on as few servers as fit. Jobs are placed in the view's order (arrival). A task that fits nowhere is
dropped (as the engine's default placement does), and a job left without a worker or without a PS gives
back what it holds, since it could not train.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from dl2d.core.contract import Allocation, Scheduler, SlotView
from dl2d.policy.registry import Policy, StatelessPolicy

EPS = 1e-9


def default_scores(free: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Eq. 1 here: 1 - (sum of used fractions) / (resources with capacity), in [0, 1] per server."""
    cap = np.asarray(capacity, float)
    has = cap > 0
    used = np.where(has, 1.0 - np.asarray(free, float) / np.where(has, cap, 1.0), 0.0)
    return 1.0 - used.sum(axis=1) / np.maximum(has.sum(axis=1), 1)


def aggregation_degree(servers_of_job: Sequence[int], num_servers: int, total: int | None = None) -> np.ndarray:
    """Eq. 3: per server, (this job's tasks on it) / total (default: the number of tasks listed)."""
    counts = np.bincount(np.asarray(servers_of_job, int), minlength=num_servers).astype(float)
    n = len(servers_of_job) if total is None else total
    return counts / n if n else counts


def dltap_scores(free, capacity, worker_servers: Sequence[int], num_workers: int | None = None,
                 weight: float = 1.0) -> np.ndarray:
    """Eq. 2: the score of every server for the job's next PS task."""
    free = np.asarray(free, float)
    return default_scores(free, capacity) + weight * aggregation_degree(worker_servers, len(free), num_workers)


def _best(free, capacity, demand, scores) -> int:
    fits = np.all(free >= np.asarray(demand, float) - EPS, axis=1)
    if not fits.any():
        return -1
    return int(np.argmax(np.where(fits, scores, -np.inf)))


def place_job(free: np.ndarray, capacity: np.ndarray, worker_demand, ps_demand, workers: int, ps: int,
              weight: float = 1.0, pack_workers: bool = False, workers_first: bool = False):
    """DLTAP for one job on `free` (updated in place): (worker servers, PS servers), maybe shorter than asked."""
    w_srv: list[int] = []
    p_srv: list[int] = []
    worker_demand, ps_demand = np.asarray(worker_demand, float), np.asarray(ps_demand, float)

    def add_worker() -> bool:
        scores = default_scores(free, capacity)
        if pack_workers and (w_srv or p_srv):
            scores = scores + weight * aggregation_degree(w_srv + p_srv, len(free))
        s = _best(free, capacity, worker_demand, scores)
        if s >= 0:
            free[s] -= worker_demand
            w_srv.append(s)
        return s >= 0

    def add_ps() -> bool:
        s = _best(free, capacity, ps_demand, dltap_scores(free, capacity, w_srv, len(w_srv), weight))
        if s >= 0:
            free[s] -= ps_demand
            p_srv.append(s)
        return s >= 0

    if workers_first:
        for _ in range(int(workers)):
            if not add_worker():
                break
        for _ in range(int(ps)):
            if not add_ps():
                break
    else:
        w_ok = p_ok = True
        for k in range(max(int(workers), int(ps))):
            if w_ok and k < workers:
                w_ok = add_worker()
            if p_ok and k < ps:
                p_ok = add_ps()
    if not w_srv or not p_srv:  # cannot train: give everything back
        for s in w_srv:
            free[s] += worker_demand
        for s in p_srv:
            free[s] += ps_demand
        return [], []
    return w_srv, p_srv


def dltap_allocation(view: SlotView, workers, ps, weight: float = 1.0, pack_workers: bool = False,
                     order: Sequence[int] | None = None, workers_first: bool = False) -> Allocation:
    """Place `workers`/`ps` per job of the view with DLTAP. The Allocation keeps the asked counts, so
    the engine reports tasks that did not fit as unplaced; the servers never exceed any capacity."""
    free = np.array(view.free, float)
    cap = np.asarray(view.capacity, float)
    n = len(view)
    w_srv: list[tuple[int, ...]] = [()] * n
    p_srv: list[tuple[int, ...]] = [()] * n
    for j in (range(n) if order is None else order):
        if workers[j] > 0 and ps[j] > 0:
            a, b = place_job(free, cap, view.worker_demand[j], view.ps_demand[j], workers[j], ps[j],
                             weight, pack_workers, workers_first)
            w_srv[j], p_srv[j] = tuple(a), tuple(b)
    return Allocation(np.asarray(workers, int).copy(), np.asarray(ps, int).copy(), tuple(w_srv), tuple(p_srv))


class DLTAP:
    """Wrap any scheduler: keep its (workers, PS) per job, re-place every task with DLTAP.

    trim=False (the simulator): the Allocation keeps the inner counts, so tasks that did not fit are
    reported as unplaced. trim=True (the daemon): the counts are the tasks placed, so the allocation is
    exactly what a cluster can start (the daemon's guardrails reject counts without servers)."""

    def __init__(self, inner: Scheduler, weight: float = 1.0, pack_workers: bool = False,
                 workers_first: bool = False, trim: bool = False):
        name = getattr(inner, "name", type(inner).__name__)
        self.inner: Policy = inner if isinstance(inner, Policy) else StatelessPolicy(inner, name)
        self.weight = weight
        self.pack_workers = pack_workers
        self.workers_first = workers_first
        self.trim = trim
        suffix = "dltap-pack" if pack_workers else ("lb" if weight == 0 else "dltap")
        self.name = f"{name}+{suffix}"

    def __call__(self, view: SlotView) -> Allocation:
        a = self.inner(view)
        out = dltap_allocation(view, a.workers, a.ps, self.weight, self.pack_workers, workers_first=self.workers_first)
        if self.trim:
            out = Allocation.from_servers(out.worker_servers, out.ps_servers)
        return out

    def applied(self, view: SlotView, allocation: Allocation, overridden: bool) -> None:
        """Passed on to the wrapped policy."""
        self.inner.applied(view, allocation, overridden)

    def observe(self, reward: float):
        return self.inner.observe(reward)


def with_dltap(scheduler, weight: float = 1.0, pack_workers: bool = False, workers_first: bool = False,
               trim: bool = False) -> DLTAP:
    """`scheduler` with its tasks re-placed by DLTAP (weight 0: plain load balancing, the control)."""
    return DLTAP(scheduler, weight, pack_workers, workers_first, trim)
