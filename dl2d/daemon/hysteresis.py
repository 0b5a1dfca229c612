"""Resize hysteresis: the plan, not each policy, keeps jobs from being resized back and forth. Pure.

On Slurm every growth is a checkpoint-restart, so a policy that flips a job's PS count 1 -> 2 -> 1 -> 2 on
successive slots costs real training time. Two guardrails (``[guardrails]`` in the config, both off by default):

* ``min_resize_slots`` = N: a running job whose size changed at slot t keeps it until slot t + N;
* ``min_resize_gain`` = g: a running job grows only if the speed model predicts at least a fraction g more
  speed at the new size.

A job held by either keeps its current size instead of the policy's. Starting a waiting job is never held.
Holding a job at a larger size than the policy gave it (a shrink or a stop held) needs room: its extra tasks
are placed, least-loaded first, on what the rest of the allocation leaves free; where they do not fit, the
policy's size stands, so the guardrails never overflow a node. A held growth keeps the servers the job runs on
(the view's ``prev_worker_servers``) where the rest of the allocation leaves them room, else the first of the
policy's servers for it: the daemon carries out a same-size job placed elsewhere as a move, a restart, which is
what holding it is to spare it (dl2d.daemon.plan.moves).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.core.placement import Placer, place_servers


@dataclass(frozen=True)
class Hysteresis:
    min_slots: int = 0  # slots a new size is kept before the next change (0: off)
    min_gain: float = 0.0  # least predicted relative speed-up for a growth (0: off)

    @property
    def active(self) -> bool:
        return self.min_slots > 0 or self.min_gain > 0


def _hold_reason(h: Hysteresis, slot: int, last_change: int | None, prev: tuple[int, int], new: tuple[int, int],
                 gain: float | None) -> str | None:
    if new == prev or prev == (0, 0):
        return None
    if h.min_slots > 0 and last_change is not None and slot - last_change < h.min_slots:
        return f"held: resized {slot - last_change} slot(s) ago (min_resize_slots {h.min_slots})"
    grows = new[0] >= prev[0] and new[1] >= prev[1]
    if h.min_gain > 0 and grows and gain is not None and gain < h.min_gain:
        return f"held: predicted speed-up {gain:.1%} < min_resize_gain {h.min_gain:.0%}"
    return None


def damp(view: SlotView, alloc: Allocation, last_change: Mapping[int, int], h: Hysteresis,
         speed: Callable[[int, int, int], float] | None = None) -> tuple[Allocation, dict[int, str]]:
    """The allocation with held jobs kept at their current size, and why each was held (by job id).

    ``last_change``: the slot of each job's last size change; ``speed(j, workers, ps)``: the speed model's
    prediction for row j (needed for ``min_gain``). ``alloc`` must carry placements (the guardrails' output
    does)."""
    if not h.active or len(view) == 0:
        return alloc, {}
    n = len(view)
    if alloc.worker_servers is None:  # a policy that left placement to the cluster: place it as the engine would
        _, pw, pp, wsrv, psrv = place_servers(view, alloc)
        alloc = Allocation(pw, pp, wsrv, psrv)
    w, p = np.asarray(alloc.workers, int).copy(), np.asarray(alloc.ps, int).copy()
    ws = [list(s) for s in alloc.worker_servers]
    ps = [list(s) for s in alloc.ps_servers]
    held: dict[int, str] = {}
    wanted: list[int] = []
    stay: list[int] = []  # growths held, to go back where they run if that has room
    for j in range(n):
        prev, new = (int(view.prev_workers[j]), int(view.prev_ps[j])), (int(w[j]), int(p[j]))
        gain = None
        if h.min_gain > 0 and speed is not None and prev != (0, 0) and new != prev:
            before = speed(j, *prev)
            gain = speed(j, *new) / before - 1.0 if before > 0 else None
        reason = _hold_reason(h, view.slot, last_change.get(int(view.job_ids[j])), prev, new, gain)
        if reason is None:
            continue
        if prev[0] <= new[0] and prev[1] <= new[1]:  # a growth held: keep part of the policy's placement
            w[j], p[j] = prev
            ws[j], ps[j] = ws[j][:prev[0]], ps[j][:prev[1]]
            stay.append(j)
        else:
            wanted.append(j)  # needs room for its extra tasks: placed below, on what is left
        held[int(view.job_ids[j])] = reason
    known = view.prev_worker_servers
    for j in stay if known is not None else ():
        if len(known[j]) != w[j] or sorted(known[j]) == sorted(ws[j]):
            continue
        others = [(k, s) for k in range(n) if k != j for s in ws[k]]
        if fits_on(view, others, [(j, s) for s in known[j]], [(k, s) for k in range(n) for s in ps[k]]):
            ws[j] = list(known[j])
    if wanted:
        used = np.zeros_like(view.free)
        for j in range(n):
            for s in ws[j]:
                used[s] += view.worker_demand[j]
            for s in ps[j]:
                used[s] += view.ps_demand[j]
        placer = Placer(view.free - used, view.capacity)
        for j in wanted:
            job = int(view.job_ids[j])
            prev = (int(view.prev_workers[j]), int(view.prev_ps[j]))
            extra = [("w", view.worker_demand[j])] * max(prev[0] - len(ws[j]), 0) + \
                    [("p", view.ps_demand[j])] * max(prev[1] - len(ps[j]), 0)
            placed: list[tuple[str, int]] = []
            for role, demand in extra:
                s = placer.add(demand)
                if s < 0:
                    break
                placed.append((role, s))
            if len(placed) < len(extra):  # no room to keep it: the policy's size stands
                for (role, s), (_, demand) in zip(placed, extra):
                    placer.remove(s, demand)
                held.pop(job)
                continue
            keep_w, keep_p = ws[j][:prev[0]], ps[j][:prev[1]]
            ws[j] = keep_w + [s for r, s in placed if r == "w"]
            ps[j] = keep_p + [s for r, s in placed if r == "p"]
            w[j], p[j] = prev
    return Allocation(w, p, tuple(map(tuple, ws)), tuple(map(tuple, ps))), held


def fits_on(view: SlotView, workers, extra, ps) -> bool:
    """Whether ``extra`` workers (job row, server) fit beside ``workers`` and ``ps`` (the same), each taking its
    job's demand, on the view's free resources. Pure."""
    used = np.zeros_like(view.free, dtype=float)
    for j, s in (*workers, *extra):
        used[s] += view.worker_demand[j]
    for j, s in ps:
        used[s] += view.ps_demand[j]
    return bool(np.all(used <= view.free + 1e-9))
