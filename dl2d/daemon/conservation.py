"""Work conservation, measured each slot (pure): the all-reduce jobs a slot's allocation leaves below a size that
would fit on the GPUs it leaves idle and that the speed model says trains faster.

A job is *below what it could use* when, after the slot's allocation, some larger size up to its own bound fits
on what the allocation leaves free plus what the job holds itself, and its speed there is at least ``min_gain``
faster. On Slurm (``even``) only the sizes a request holds exactly count (``--nodes=N --gres=gpu:G`` on the
fewest nodes: dl2d.daemon.plan.even_workers), each laid out as Slurm lays it out (N nodes with G workers' room
each). The daemon flags such a job in the slot's decision (``dl2ctl show``); the conformance harness counts the
flagged job-slots of each world, and the longest run of slots one job spent flagged, against the bound a policy
that claims work conservation keeps (dl2d.policy.registry: ``work_conserving``)."""
from __future__ import annotations

import functools
from typing import Callable, Mapping

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.core.jobs import JobKind
from dl2d.core.placement import even_spread, fit_counts, place_servers

#: How a decision's flag for such a job begins (dl2d.daemon.conform.compare counts these).
FLAG = "below what it could use: "

#: The most slots in a row a policy that claims work conservation leaves one job below what it could use beside
#: idle GPUs (plus the hysteresis' ``min_resize_slots`` where that is on): on Slurm the even-request rule cuts a size
#: its request cannot hold exactly (7 on 4-GPU nodes runs at 6), and the GPUs so freed wait for the job's next
#: change of size (DRF: up to 3 slots on the conformance traces).
CLAIM_SLOTS = 3

#: The least relative speed-up that counts as "could use" (a size that trains 2 % faster is not worth a restart).
MIN_GAIN = 0.05


def _nodes_with(fit: np.ndarray, per_node: int) -> np.ndarray:
    """[per_node + 1] how many nodes have room for at least p workers, by p."""
    return np.bincount(np.minimum(fit, per_node), minlength=per_node + 1)[::-1].cumsum()[::-1]


@functools.lru_cache(maxsize=64)
def _exact_layouts(per_node: int, most: int = 1024) -> dict[int, tuple[int, int]]:
    """size -> (nodes, workers on each) of every size up to ``most`` that Slurm's even request holds exactly."""
    out = {}
    for k in range(1, most + 1):
        nodes, per = even_spread(k, per_node)
        if nodes * per == k:
            out[k] = (nodes, per)
    return out


def could_use(view: SlotView, alloc: Allocation, bounds: Mapping[int, int], speed: Callable[[int, int], float],
              even: bool = False, min_gain: float = MIN_GAIN) -> dict[int, str]:
    """``{job id: why}`` for each all-reduce job that ``alloc`` leaves below what it could use (module doc).

    ``bounds``: each job's own most workers (the view's ``max_workers`` where a job has none); ``speed(j, w)``:
    the speed model's epochs/s of row j at w workers (the daemon's belief)."""
    n = len(view)
    if n == 0 or not len(view.capacity):
        return {}
    usage, _, _, worker_servers, _ = place_servers(view, alloc)
    free = view.free - usage
    idle = int(round(float(np.clip(free[:, 0], 0, None).sum())))
    if idle <= 0:
        return {}
    out: dict[int, str] = {}
    by_demand: dict[tuple[float, ...], tuple[np.ndarray, int]] = {}  # what the idle GPUs fit of a demand, per node
    waiting: dict[tuple[float, ...], np.ndarray] = {}  # _nodes_with of a demand for a job that holds nothing
    for j in range(n):
        demand = view.worker_demand[j]
        if view.kind[j] != JobKind.ALLREDUCE.value or demand[0] <= 0:
            continue
        job = int(view.job_ids[j])
        w = len(worker_servers[j])
        bound = min(int(bounds.get(job, view.max_workers)), view.max_workers)
        if w >= bound:
            continue
        key = tuple(float(x) for x in demand)
        if key not in by_demand:
            by_demand[key] = (fit_counts(free, demand), int(np.max(fit_counts(view.capacity, demand))))
        idle_fit, per_node = by_demand[key]
        most = min(bound, w + int(idle_fit.sum()))  # no layout holds more than its own and the idle GPUs
        if most <= w:
            continue
        if even:  # nodes with room for at least p of its workers, p = 0..per_node (its own count: its to move to)
            fit = idle_fit + np.bincount(np.asarray(worker_servers[j], int), minlength=len(free)) if w else idle_fit
            nodes_with = _nodes_with(fit, per_node) if w else waiting.get(key)
            if nodes_with is None:
                nodes_with = waiting[key] = _nodes_with(fit, per_node)
            layouts = _exact_layouts(per_node)
        now = speed(j, w) if w > 0 else 0.0
        for k in range(most, w, -1):
            if even:
                layout = layouts.get(k)
                if layout is None or nodes_with[layout[1]] < layout[0]:
                    continue
            faster = speed(j, k)
            if faster > 0 and faster >= now * (1.0 + min_gain):
                gain = f"{faster / now - 1:.0%} faster" if now > 0 else "it waits"
                out[job] = f"{FLAG}{k} workers fit on the {idle} GPUs left idle ({gain})"
                break
    return out
