"""The slot loop's logic, as pure functions: no database, no backend, no clock.

* :func:`build_view` — the policy's input (a ``dl2d.core.contract.SlotView``) from the DB's jobs and the backend's nodes;
* :func:`guard` — guardrails on the policy's output: NaN / out-of-range / over-capacity / starvation fall
  back to a heuristic, with the reason;
* :func:`plan_targets` — the allocation as per-job backend ``Target``s, only where the size changes,
  shrinks before grows;
* :func:`slot_reward` — DL2's reward (eq. 1): sum over jobs of epochs trained in the slot / total epochs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dl2d.core.contract import Allocation, CapacityError, SlotView
from dl2d.core.jobs import IntentKind, JobDemand, JobKind, demand_from_spec
from dl2d.core.limits import ALLREDUCE_MAX_WORKERS, MAX_PS, MAX_WORKERS
from dl2d.core.placement import even_spread, fit_counts, place
from dl2d.daemon import jobmodel
from dl2d.daemon.backend import JobStatus, NodeInfo, Target
from dl2d.workload import efficiency


@dataclass(frozen=True)
class JobRow:
    """What the planner needs of one active (not terminal) DB job.

    ``model`` is the job's model, kind, batch and request (dl2d.daemon.jobmodel.model_of: from its
    ``job_type`` and spec); ``demand`` its per-task demand from its spec (the model's default where the spec
    is silent): the one the Slurm backend sizes the job with."""

    id: int
    job_type: str
    total_epochs: float
    epochs_done: float = 0.0
    workers: int = 0
    ps: int = 0
    slots_run: int = 0  # slots this job has been in the system (allocation rows so far)
    max_workers: int = MAX_WORKERS
    max_ps: int = MAX_PS
    name: str = ""
    spec: Mapping[str, Any] = field(default_factory=dict)
    demand: JobDemand = None  # type: ignore[assignment]  # None: from the spec
    model: jobmodel.JobModel = None  # type: ignore[assignment]  # None: from the job type and spec
    batch_size: float = 0.0  # an adaptive job's total batch as dl2d last started it (0: its submitted one)
    noise: Mapping[str, Any] | None = None  # what dl2d learned of its gradient noise (efficiency.NoiseFit JSON)

    def __post_init__(self):
        if self.model is None:
            object.__setattr__(self, "model", jobmodel.model_of(self.job_type, self.spec))
        if self.demand is None:
            object.__setattr__(self, "demand", demand_from_spec(self.spec, jobmodel.default_demand(self.model)))
        if self.model.kind == JobKind.ALLREDUCE:
            object.__setattr__(self, "max_ps", 0)  # no parameter servers, whatever the limits say


def job_row(job_id: int, job_type: str, total_epochs: float, epochs_done: float, workers: int, ps: int,
            slots_run: int, spec: Mapping[str, Any], name: str = "") -> JobRow:
    """A JobRow whose limits, model and demand come from the job's submitted spec (an all-reduce job without
    max_workers may have up to core.limits.ALLREDUCE_MAX_WORKERS, a PS job DL2's 16)."""
    allreduce = jobmodel.spec_kind(job_type, spec) == JobKind.ALLREDUCE
    default_max = ALLREDUCE_MAX_WORKERS if allreduce else MAX_WORKERS
    return JobRow(job_id, job_type, total_epochs, epochs_done, workers, ps, slots_run,
                  int(spec.get("max_workers") or default_max), int(spec.get("max_ps") or MAX_PS), name, spec)


def batch_knowledge(jobs: Sequence[JobRow]) -> dict[str, np.ndarray] | None:
    """The view's ``batch_size``, ``adaptive``, ``batch_limits`` and ``grad_stats`` of ``jobs``; None when none is
    adaptive (the view of a cluster of fixed-batch jobs stays as it was). A job's batch is the one dl2d last
    started it at, else its submitted one; its gradient statistics are its model's at that batch and its epoch,
    fitted to its own reports (dl2d.workload.efficiency.job_stats), NaN where it has made none."""
    adaptive = np.array([bool((j.spec or {}).get("adaptive_batch")) for j in jobs], bool)
    if not adaptive.any():
        return None
    batch = np.array([j.batch_size or j.model.batch_size for j in jobs], float)
    limits = np.full((len(jobs), 2), np.nan)
    stats = np.full((len(jobs), 2), np.nan)
    for i in np.flatnonzero(adaptive):
        spec = jobs[i].spec
        limits[i] = [spec.get("max_batch_size") or np.nan, spec.get("max_local_batch") or np.nan]
        fit = efficiency.NoiseFit.from_json(jobs[i].noise)
        if fit.reports:
            stats[i] = efficiency.job_stats(jobs[i].model.name, batch[i], jobs[i].epochs_done, fit)
    return {"batch_size": batch, "adaptive": adaptive, "batch_limits": limits, "grad_stats": stats,
            "submitted_batch": np.array([j.model.batch_size for j in jobs], float)}


def scheduling_window(waiting: Sequence[bool], window: int) -> list[int]:
    """Which of the active jobs (in submission order; ``waiting[i]``: job i holds nothing and waits to start) the
    policy sees this slot: every job that holds something, and the first ``window`` waiting ones (0: all). However
    many jobs wait, a slot then costs what ``window`` of them cost; the rest keep their place in the queue."""
    if window <= 0:
        return list(range(len(waiting)))
    out, seen = [], 0
    for i, w in enumerate(waiting):
        if w:
            seen += 1
            if seen > window:
                continue
        out.append(i)
    return out


def view_max_workers(jobs: Sequence[JobRow], bound: int) -> int:
    """The view's worker limit: the largest of the jobs' own (their submissions'), at most ``bound`` (the
    daemon's ``max_workers``); DL2's 16 for no jobs. A cluster of DL2 PS jobs keeps DL2's 16, all-reduce jobs
    that may grow bring theirs."""
    return max(1, min(int(bound), max((j.max_workers for j in jobs), default=MAX_WORKERS)))


#: Where a job's tasks run, by node name: (its workers' nodes, its PS's nodes), one name per task.
Placement = tuple[tuple[str, ...], tuple[str, ...]]


def known_servers(jobs: Sequence[JobRow], nodes: Sequence[NodeInfo], placed: Mapping[int, Placement],
                  observed: Mapping[int, Sequence[str]] | None = None
                  ) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(workers' servers, PS's servers) of each job (in the order of ``jobs``), as node indices, for the view's
    ``prev_worker_servers`` / ``prev_ps_servers``: its recorded placement (``placed``: the nodes of the last target
    carried out for it) where that still describes the job, else () (not known: placed afresh, as a job that
    starts). A record describes it when it holds one node per task of the job's current size, every node is one
    of ``nodes``, and, where the backend reports the job's nodes (``observed``, JobStatus.nodes), all are among
    them (a backend that chose its own nodes, as Slurm does unless told the target's, makes the record wrong).

    Why: the policy places every task afresh each slot. Without where the running jobs are, its placement is of an
    empty cluster: a job whose size does not change is not moved (no target), yet the policy put another job's
    new workers on the servers it still holds (on 4 x 4 GPUs, a 3-worker start on the node a 4-worker job filled).
    The simulator's view has them (dl2d.sim.engine.view_of); the placement then keeps running jobs where they are
    and fills what is really free."""
    index = {n.name: i for i, n in enumerate(nodes)}
    workers, ps = [], []
    for j in jobs:
        rec = placed.get(j.id)
        seen = None if observed is None or j.id not in observed else set(observed[j.id])
        ok = rec is not None and len(rec[0]) == j.workers and len(rec[1]) == j.ps and \
            all(n in index and (seen is None or n in seen) for n in (*rec[0], *rec[1]))
        workers.append(tuple(index[n] for n in rec[0]) if ok else ())
        ps.append(tuple(index[n] for n in rec[1]) if ok else ())
    return tuple(workers), tuple(ps)


def build_view(slot: int, jobs: Sequence[JobRow], nodes: Sequence[NodeInfo],
               max_workers: int | None = None, max_ps: int = MAX_PS, *, slot_seconds: float = 1200.0,
               speed_factor: Mapping[int, float] | None = None,
               shared_gpu: Mapping[int, bool] | None = None,
               worker_bound: int = ALLREDUCE_MAX_WORKERS,
               placed: Mapping[int, Placement] | None = None,
               observed: Mapping[int, Sequence[str]] | None = None) -> SlotView:
    """Jobs in id (= submission) order; a drained or down node has its capacity but nothing free; a node's
    capacity is what is left of it once the GPUs held outside dl2d are taken (NodeInfo.gpus_other).

    The arrival slot is ``slot - slots_run`` (a job is in the system every slot since it arrived). Each job's
    demand, kind and requested workers are its own (``JobRow.demand`` / ``model``); its believed speed
    (``est_speed``) is the catalog's for a known model at its batch and GPUs per worker on the cluster's
    nodes, the stated prior for a model never seen (dl2d.daemon.jobmodel). ``max_workers`` None:
    :func:`view_max_workers` within ``worker_bound``. ``speed_factor`` / ``shared_gpu`` (by job id, from
    dl2d.daemon.jobstats) become the view's optional ``job_speed_factor`` (NaN for jobs not measured) /
    ``job_shared_gpu`` (False for jobs not seen). ``placed`` (by job id, the nodes of each job's last target
    carried out) and ``observed`` (the backend's nodes of each job) give the view each job's servers
    (:func:`known_servers`); None: none known."""
    jobs = sorted(jobs, key=lambda j: j.id)
    prev_w, prev_p = known_servers(jobs, nodes, placed, observed) if placed is not None else (None, None)
    if max_workers is None:
        max_workers = view_max_workers(jobs, worker_bound)
    # a node's GPUs that another user's Slurm job holds are not the cluster's to give: the view's node is smaller
    cap = np.array([[max(n.gpus - n.gpus_other, 0), n.cpus, n.mem_gb] for n in nodes], dtype=float).reshape(-1, 3)
    usable = np.array([n.usable for n in nodes], dtype=bool)
    free = cap * usable[:, None]
    slots_run = np.array([j.slots_run for j in jobs], int)
    models = [j.model for j in jobs]
    gpus_per_node = float(cap[:, 0].max()) if len(cap) else 1.0
    return SlotView(
        slot=slot, job_ids=np.array([j.id for j in jobs], int),
        type_idx=np.array([m.type_idx for m in models], int),
        arrival_slot=slot - slots_run, slots_run=slots_run,
        epochs_done=np.array([j.epochs_done for j in jobs], float),
        est_epochs=np.array([j.total_epochs for j in jobs], float),
        prev_workers=np.array([j.workers for j in jobs], int), prev_ps=np.array([j.ps for j in jobs], int),
        free=free, capacity=cap, max_workers=max_workers, max_ps=max_ps,
        job_speed_factor=None if speed_factor is None else
        np.array([speed_factor.get(j.id, np.nan) for j in jobs], float),
        job_shared_gpu=None if shared_gpu is None else np.array([bool(shared_gpu.get(j.id)) for j in jobs], bool),
        worker_demand=np.array([j.demand.worker.as_array() for j in jobs], float).reshape(-1, 3),
        ps_demand=np.array([j.demand.ps.as_array() for j in jobs], float).reshape(-1, 3),
        kind=tuple(j.demand.kind.value for j in jobs), node_names=tuple(n.name for n in nodes),
        est_speed=jobmodel.speed_estimate(models, [j.demand.worker.gpus for j in jobs], max_ps, max_workers,
                                          gpus_per_node),
        requested_workers=np.array([m.requested for m in models], int),
        slot_seconds=slot_seconds, prev_worker_servers=prev_w, prev_ps_servers=prev_p,
        **(batch_knowledge(jobs) or {}),
    )


def even_workers(workers: int, per_node: int) -> int:
    """The most workers, at most ``workers``, that Slurm's request for them holds exactly: ``--nodes=N
    --gres=gpu:G`` gives every node the same GPUs, so ``W`` workers on the fewest nodes of ``per_node`` workers
    each hold ``N x ceil(W / N)`` (10 on 4-worker nodes: 3 nodes of 4, 12 GPUs for 10 workers)."""
    for w in range(int(workers), 0, -1):
        nodes, per = even_spread(w, per_node)
        if nodes * per == w:
            return w
    return 0


def even_gres(view: SlotView, alloc: Allocation, bounds: Mapping[int, int] | None = None
              ) -> tuple[Allocation, dict[int, str]]:
    """The allocation with every all-reduce job's workers made a size Slurm's request holds exactly, and why each
    was changed (by job id): on a backend whose requests give each node of a job the same GPUs (Slurm's), a size
    in between would hold GPUs that dl2d counts free. A job is rounded up to the next such size where that size,
    laid out as Slurm lays it out, fits on its own GPUs and those the allocation leaves idle, within its bound
    (``bounds``: job id -> its most workers; the view's ``max_workers`` for the rest); else cut down to
    :func:`even_workers` (its last tasks dropped from a placement). Without ``bounds``, or without placements,
    every such job is cut."""
    if len(view) == 0 or not len(view.capacity):
        return alloc, {}
    w = np.asarray(alloc.workers, int).copy()
    ws = [list(x) for x in alloc.worker_servers] if alloc.worker_servers is not None else None
    node_gpus = float(view.capacity[:, 0].max())
    free = view.free - place(view, alloc)[0] if ws is not None and bounds is not None else None
    changed: dict[int, str] = {}
    for j in range(len(view)):
        gpw = float(view.worker_demand[j, 0])
        if view.kind[j] != JobKind.ALLREDUCE.value or w[j] <= 1 or gpw <= 0:
            continue
        per_node = int(node_gpus // gpw)
        even = even_workers(int(w[j]), per_node)
        if even >= w[j]:
            continue
        job, size = int(view.job_ids[j]), int(w[j])
        up = None
        if free is not None and ws is not None:
            bound = min(int(bounds.get(job, view.max_workers)), view.max_workers)
            up = _round_up(view, j, size, ws[j], free, per_node, bound)
        if up is not None:
            size_up, servers = up
            for srv in ws[j]:
                free[srv] += view.worker_demand[j]
            for srv in servers:
                free[srv] -= view.worker_demand[j]
            changed[job] = (f"sized {size}, run at {size_up} workers: Slurm gives each node of a job the same GPUs, "
                            f"so {size} would hold {size_up}'s, and they were idle")
            w[j], ws[j] = size_up, servers
            continue
        changed[job] = (f"sized {size}, run at {even} workers: Slurm gives each node of a job the same GPUs, "
                        f"and {size} would hold more than {size}")
        w[j] = even
        if ws is not None:
            if free is not None:
                for srv in ws[j][even:]:
                    free[srv] += view.worker_demand[j]
            ws[j] = ws[j][:even]
    if not changed:
        return alloc, {}
    return Allocation(w, np.asarray(alloc.ps, int).copy(), None if ws is None else tuple(tuple(x) for x in ws),
                      alloc.ps_servers), changed


def _round_up(view: SlotView, j: int, size: int, servers: Sequence[int], free: np.ndarray, per_node: int,
              bound: int) -> tuple[int, list[int]] | None:
    """The next size above ``size`` that Slurm's request holds exactly, where it is within ``bound`` and fits, laid out on
    N nodes of G workers each, on ``free`` plus row j's own ``servers``; the job's own servers first, then the
    roomiest. None where none fits."""
    demand = view.worker_demand[j]
    room = free.copy()
    for srv in servers:
        room[srv] += demand
    fit = fit_counts(room, demand, default=per_node)
    own = {srv: servers.count(srv) for srv in set(servers)}
    for k in range(size + 1, bound + 1):
        if even_workers(k, per_node) != k:
            continue
        nodes, per = even_spread(k, per_node)  # only the next such size: what Slurm would hold for ``size``
        fitting = [srv for srv in range(len(room)) if fit[srv] >= per]
        if len(fitting) < nodes:
            return None
        chosen = sorted(fitting, key=lambda srv: (-own.get(srv, 0), -int(fit[srv]), srv))[:nodes]
        return k, [srv for srv in sorted(chosen) for _ in range(per)]
    return None


def below_minimum(view: SlotView, alloc: Allocation, minimum: Mapping[int, int]) -> tuple[Allocation, dict[int, str]]:
    """The allocation with every job given fewer workers than its minimum (by job id: its submission's
    ``min_workers``, ``dl2ctl submit --workers MIN-MAX``) given none, and why (by job id): such a job waits
    rather than run at a size its program does not take."""
    w = np.asarray(alloc.workers, int).copy()
    p = np.asarray(alloc.ps, int).copy()
    ws = [list(x) for x in alloc.worker_servers] if alloc.worker_servers is not None else None
    ps = [list(x) for x in alloc.ps_servers] if alloc.ps_servers is not None else None
    cut: dict[int, str] = {}
    for j, job_id in enumerate(int(i) for i in view.job_ids):
        least = int(minimum.get(job_id, 1))
        if 0 < w[j] < least:
            cut[job_id] = f"pending: sized {int(w[j])}, below its minimum of {least} workers: it waits"
            w[j] = p[j] = 0
            if ws is not None:
                ws[j] = []
            if ps is not None:
                ps[j] = []
    if not cut:
        return alloc, {}
    return Allocation(w, p, None if ws is None else tuple(tuple(x) for x in ws),
                      None if ps is None else tuple(tuple(x) for x in ps)), cut


def view_digest_input(view: SlotView) -> dict[str, Any]:
    """The policy input as plain JSON (hashed into decisions.state_digest)."""
    return {"slot": int(view.slot), "jobs": view.job_ids.tolist(), "type": view.type_idx.tolist(),
            "kind": list(view.kind), "requested": view.requested.tolist(), "max_workers": int(view.max_workers),
            "slots_run": view.slots_run.tolist(), "epochs_done": np.round(view.epochs_done, 6).tolist(),
            "est": view.est_epochs.tolist(), "prev": [view.prev_workers.tolist(), view.prev_ps.tolist()],
            "free": view.free.tolist(), "demand": [view.worker_demand.tolist(), view.ps_demand.tolist()],
            **({"speed_factor": [None if np.isnan(x) else round(float(x), 6) for x in view.job_speed_factor]}
               if view.job_speed_factor is not None else {}),
            **({"shared_gpu": view.job_shared_gpu.tolist()} if view.job_shared_gpu is not None else {})}


# ------------------------------------------------------------------------------------------ guardrails

def check_allocation(view: SlotView, alloc: Any) -> str | None:
    """Why an allocation cannot be carried out, or None. Never raises."""
    n = len(view)
    try:
        w = np.asarray(alloc.workers, dtype=float)
        p = np.asarray(alloc.ps, dtype=float)
    except (TypeError, ValueError, AttributeError) as e:
        return f"malformed output ({type(e).__name__})"
    if w.shape != (n,) or p.shape != (n,):
        return f"output for {w.shape}/{p.shape} jobs, the view has {n}"
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(p))):
        return "NaN or infinite output"
    if np.any(w != np.round(w)) or np.any(p != np.round(p)):
        return "non-integer task counts"
    if np.any(w < 0) or np.any(p < 0) or np.any(w > view.max_workers) or np.any(p > view.max_ps):
        return f"task counts outside [0, {view.max_workers}] workers / [0, {view.max_ps}] PS"
    ws, ps_ = alloc.worker_servers, alloc.ps_servers
    if ws is not None or ps_ is not None:
        if ws is None or ps_ is None or len(ws) != n or len(ps_) != n:
            return "placement does not cover every job"
        servers = len(view.free)
        for j in range(n):
            if len(ws[j]) != w[j] or len(ps_[j]) != p[j]:
                return f"job {int(view.job_ids[j])}: placement has {len(ws[j])}/{len(ps_[j])} tasks, counts {int(w[j])}/{int(p[j])}"
            if any(not 0 <= s < servers for s in (*ws[j], *ps_[j])):
                return f"job {int(view.job_ids[j])}: placement on a server that does not exist"
    fixed = Allocation(w.astype(int), p.astype(int), ws, ps_)
    try:
        _, pw, pp = place(view, fixed)
    except CapacityError as e:
        return f"over capacity: {e}"
    if np.any(pw != fixed.workers) or np.any(pp != fixed.ps):
        return "over capacity: some tasks fit on no server"
    return None


def starving(view: SlotView, alloc: Allocation, starved: Mapping[int, int], limit: int) -> list[int]:
    """Jobs that would reach ``limit`` consecutive slots without a worker with this allocation."""
    return [int(j) for j, w in zip(view.job_ids, alloc.workers) if w == 0 and starved.get(int(j), 0) + 1 >= limit]


def update_starved(view: SlotView, alloc: Allocation, starved: Mapping[int, int]) -> dict[int, int]:
    """Consecutive slots without a worker, per active job (jobs that left are dropped)."""
    return {int(j): (starved.get(int(j), 0) + 1 if w == 0 else 0) for j, w in zip(view.job_ids, alloc.workers)}


@dataclass(frozen=True)
class Guarded:
    allocation: Allocation
    source: str  # "policy" | "fallback"
    reason: str | None = None


def guard(view: SlotView, policy: Callable[[SlotView], Allocation] | None, fallback: Callable[[SlotView], Allocation],
          starved: Mapping[int, int], starve_limit: int) -> Guarded:
    """Run the policy and keep its allocation unless a guardrail trips; then the fallback's (checked too).

    A policy that raises, returns NaN / out-of-range / over-capacity output, or would leave a job without
    a worker for ``starve_limit`` slots in a row while the fallback would run that job, is overridden."""
    if len(view) == 0:
        return Guarded(Allocation.empty(0), "policy")
    reason = None
    alloc = None
    if policy is None:
        reason = "no policy"
    else:
        try:
            alloc = policy(view)
        except Exception as e:  # any policy failure is a fallback, never a daemon crash
            reason = f"policy raised {type(e).__name__}: {e}"
    if reason is None:
        reason = check_allocation(view, alloc)
    fb: Allocation | None = None
    if reason is None:
        starved_jobs = starving(view, alloc, starved, starve_limit)
        if starved_jobs:
            fb = fallback(view)
            rescued = [j for j in starved_jobs if fb.workers[list(view.job_ids).index(j)] > 0]
            if rescued:
                reason = (f"policy starves job(s) {', '.join(map(str, rescued[:10]))} for {starve_limit} slots")
    if reason is None:
        return Guarded(alloc, "policy")
    fb = fb if fb is not None else fallback(view)
    problem = check_allocation(view, fb)
    if problem is not None:  # a heuristic bug: run nothing new rather than overflow the cluster
        return Guarded(Allocation.empty(len(view)), "fallback", f"{reason}; fallback invalid too ({problem})")
    return Guarded(fb, "fallback", reason)


# ------------------------------------------------------------------------------------------ targets

@dataclass(frozen=True)
class PlannedTarget:
    job_id: int
    kind: IntentKind
    target: Target
    prev: tuple[int, int]


def target_to_json(t: Target) -> dict[str, Any]:
    return {"workers": t.workers, "ps": t.ps, "worker_nodes": list(t.worker_nodes), "ps_nodes": list(t.ps_nodes),
            **({"batch_size": t.batch_size} if t.batch_size else {})}


def target_from_json(d: Mapping[str, Any]) -> Target:
    return Target(int(d["workers"]), int(d["ps"]), tuple(d.get("worker_nodes") or ()), tuple(d.get("ps_nodes") or ()),
                  float(d.get("batch_size") or 0.0))


def plan_targets(view: SlotView, alloc: Allocation, node_names: Sequence[str],
                 job_limits: Mapping[int, tuple[int, int]] | None = None) -> tuple[list[PlannedTarget], dict[int, tuple[int, int]]]:
    """(targets for jobs whose size changes, that move, or whose batch changes (an adaptive job's, the allocation's
    ``batch_size``: a restart); shrinks/stops and moves first; the final (workers, ps) of every job).

    Per-job limits from the submission (max_workers, max_ps) cap the policy's counts (extra tasks dropped). A
    job moves when it keeps its size but the allocation places it elsewhere than where the view says it runs
    (:func:`moves`)."""
    limits = job_limits or {}
    planned: list[PlannedTarget] = []
    sizes: dict[int, tuple[int, int]] = {}
    moved = moves(view, alloc)
    for j, job_id in enumerate(int(x) for x in view.job_ids):
        mw, mp = limits.get(job_id, (view.max_workers, view.max_ps))
        w, p = min(int(alloc.workers[j]), mw), min(int(alloc.ps[j]), mp)
        sizes[job_id] = (w, p)
        prev = (int(view.prev_workers[j]), int(view.prev_ps[j]))
        batch = float(alloc.batch_size[j]) if alloc.batch_size is not None and w > 0 else 0.0
        if batch and view.batch_limits is not None and np.isfinite(view.batch_limits[j, 0]):
            batch = min(batch, float(view.batch_limits[j, 0]))  # never above what the job accepts
        if batch and view.batch_size is not None and batch == float(view.batch_size[j]):
            batch = 0.0  # the batch it has
        if (w, p) == prev and not moved[j] and not batch:
            continue
        wn = tuple(node_names[s] for s in alloc.worker_servers[j][:w]) if alloc.worker_servers is not None else ()
        pn = tuple(node_names[s] for s in alloc.ps_servers[j][:p]) if alloc.ps_servers is not None else ()
        kind = IntentKind.SUBMIT if prev == (0, 0) else IntentKind.RESIZE
        planned.append(PlannedTarget(job_id, kind, Target(w, p, wn, pn, batch), prev))
    planned.sort(key=lambda t: (0 if t.target.workers <= t.prev[0] and t.target.ps <= t.prev[1] else 1, t.job_id))
    return planned, sizes


def moves(view: SlotView, alloc: Allocation) -> np.ndarray:
    """[jobs] whether the allocation moves a job that keeps its size: an all-reduce job whose servers the view
    knows (``prev_worker_servers``) placed on others (as a multiset), as dl2d.sim.allreduce.moved counts it.

    Why the daemon carries a move out: the simulator does (a checkpoint-restart, charged its restart cost), and
    the policy placed the other jobs around it. A move left undone leaves the job where it was while another
    job's new workers go to those servers (two jobs on one node's GPUs), and a spread job that the policy packs
    again stays spread, training slower (on 4 x 4 GPUs a 2-worker job held two nodes to its end and took 362
    slots against the simulator's 276). A PS job is not moved: its tasks are placed afresh every slot, with no
    restart for it in the simulator either."""
    n = len(view)
    prev = view.prev_worker_servers
    if prev is None or alloc.worker_servers is None:
        return np.zeros(n, bool)
    return np.array([bool(view.allreduce[j] and prev[j] and int(alloc.workers[j]) == len(prev[j])
                          and int(view.prev_workers[j]) == len(prev[j])
                          and sorted(alloc.worker_servers[j]) != sorted(prev[j])) for j in range(n)], bool)


def advice_record(policy: str, advised: Mapping[int, tuple[int, int]], ran: Mapping[int, tuple[int, int]],
                  speed: Callable[[int, int, int], float], rows: Mapping[int, int]) -> dict[str, Any]:
    """Advise mode: what ``policy`` would have done, for ``decisions.advice``. ``advised`` / ``ran``: each job's
    (workers, ps) by the policy and by what was carried out; ``speed(row, workers, ps)``: the speed model's
    epochs/s; ``rows``: job id -> its row in the view. Per job ``[id, workers, ps, advised epochs/s, epochs/s of
    what ran]``, the two speeds by the same model, so that comparing them isolates the policy's choice."""
    jobs = []
    for job_id, (w, p) in advised.items():
        j = rows[job_id]
        rw, rp = ran.get(job_id, (0, 0))
        jobs.append([int(job_id), int(w), int(p), round(speed(j, w, p) if w else 0.0, 9),
                     round(speed(j, rw, rp) if rw else 0.0, 9)])
    return {"policy": policy, "jobs": jobs}


def pending_reasons(view: SlotView, alloc: Allocation, usage: np.ndarray) -> dict[int, str]:
    """Why each job left without a worker waits, in Slurm's words: ``Resources`` (no usable node has a worker's
    GPUs, CPUs and memory free after this allocation) or ``Priority`` (one would fit: the policy ran others
    first, or holds the job back). ``usage``: what the allocation uses per server (:func:`place`)."""
    free = view.free - usage
    out: dict[int, str] = {}
    for j in np.flatnonzero(np.asarray(alloc.workers) == 0):
        d = view.worker_demand[j]
        gpus_free = int(round(float(free[:, 0].sum())))
        if np.any(np.all(free >= d - 1e-9, axis=1)):
            out[int(view.job_ids[j])] = (f"Priority: a worker would fit ({gpus_free} GPUs free) but the policy "
                                         "ran other jobs first")
        else:
            out[int(view.job_ids[j])] = (f"Resources: no node has a worker's {d[0]:g} GPU, {d[1]:g} CPU, "
                                         f"{d[2]:g} GB free ({gpus_free} GPUs free in all)")
    return out


def node_report(view: SlotView, nodes: Sequence[NodeInfo], usage: np.ndarray,
                agents: Mapping[str, str]) -> list[dict[str, Any]]:
    """Each node as `dl2ctl nodes` lists it: capacity, what this slot's allocation uses, its state (Slurm's
    words: idle, mixed, allocated, drained) and its agent (``ok``, ``stale``, or ``-`` without one).
    ``gpus_alloc`` is dl2d's, ``gpus_other`` what Slurm jobs not dl2d's hold; the state counts both, as Slurm's."""
    out = []
    for i, n in enumerate(nodes):
        used = usage[i] if i < len(usage) else np.zeros(3)
        gpus_used = float(used[0]) + n.gpus_other
        if not n.usable:
            state = "drained"
        elif gpus_used <= 0 and used[1] <= 0:
            state = "idle"
        elif gpus_used >= n.gpus and (n.gpus > 0 or used[1] >= n.cpus):
            state = "allocated"
        else:
            state = "mixed"
        out.append({"name": n.name, "state": state, "reason": n.reason, "gpus": n.gpus,
                    "gpus_alloc": int(round(float(used[0]))), "gpus_other": int(n.gpus_other), "cpus": n.cpus,
                    "cpus_alloc": round(float(used[1]), 2), "mem_gb": n.mem_gb,
                    "mem_gb_alloc": round(float(used[2]), 2), "agent": agents.get(n.name, "-")})
    return out


# ------------------------------------------------------------------------------------------ reward

def slot_reward(before: Mapping[int, float], after: Mapping[int, JobStatus], total_epochs: Mapping[int, float]) -> float:
    """DL2 eq. 1: sum over jobs of (epochs trained this slot) / (the job's total epochs)."""
    r = 0.0
    for job_id, done_before in before.items():
        st = after.get(job_id)
        total = total_epochs.get(job_id, 0.0)
        if st is None or total <= 0:
            continue
        r += max(st.epochs_done - done_before, 0.0) / total
    return r
