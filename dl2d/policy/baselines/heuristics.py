"""DL2's baseline schedulers (section 6.2): DRF, Tetris, FIFO and SRTF (Optimus: dl2d.policy.baselines.optimus).

Each is a function of a `SlotView` returning an `Allocation`, re-deciding every job's workers and PS every
slot, with every task placed on a server through `AllocationBuilder` so capacity can never be exceeded.
They add a worker and a PS together (a "bundle"), as in the DL2 authors' simulator. An all-reduce job has no
PS: its bundle is one worker, and its workers go to the servers it held last slot, then to servers it already
has, so it neither moves (a restart) nor spreads without need. Each is registered in dl2d.policy.registry under its
name, as a heuristic (a guardrail fallback and a supervised-warm-up teacher).
"""
from __future__ import annotations

import functools
import heapq

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.core.placement import Placer
from dl2d.policy.registry import PolicyOptions, StatelessPolicy
from dl2d.workload.jobtypes import BATCHES_PER_EPOCH, LOCAL_COMP_TIME

KINDS = ("worker", "ps", "bundle")


class AllocationBuilder:
    """Adds tasks to jobs of a view one at a time, placing each on a server; refuses what does not fit."""

    def __init__(self, view: SlotView):
        self.view = view
        self.placer = Placer(view.free, view.capacity)
        self.worker_servers: list[list[int]] = [[] for _ in range(len(view))]
        self.ps_servers: list[list[int]] = [[] for _ in range(len(view))]
        cap = view.total_capacity
        inv = np.where(cap > 0, 1.0 / np.where(cap > 0, cap, 1), 0.0)
        self._w_share, self._p_share = view.worker_demand * inv, view.ps_demand * inv
        self.allreduce = view.allreduce
        self._prev = view.prev_worker_servers
        self._pack = view.allreduce_placement == "pack"
        self._afresh: set[int] = set()  # all-reduce jobs resized this slot: placed without last slot's servers
        self._stay: set[int] = set()  # jobs that go back where they were (add_gang's stay): never re-packed

    def workers(self, j: int) -> int:
        return len(self.worker_servers[j])

    def ps(self, j: int) -> int:
        return len(self.ps_servers[j])

    def _demands(self, j: int, kind: str):
        w, p = self.view.worker_demand[j], self.view.ps_demand[j]
        return {"worker": (w,), "ps": (p,), "bundle": (w, p)}[kind]

    def within_limits(self, j: int, kind: str) -> bool:
        ok_w = self.workers(j) < self.view.max_workers
        if self.allreduce[j]:
            return kind != "ps" and ok_w
        ok_p = self.ps(j) < self.view.max_ps
        return {"worker": ok_w, "ps": ok_p, "bundle": ok_w and ok_p}[kind]

    def add(self, j: int, kind: str, want: int | None = None) -> bool:
        """Add one task of ``kind`` to job j, if it fits. ``want``, where the caller knows it: the workers the job
        is still to be given, this one included. An all-reduce job packed goes to the server those workers will
        fill, and a job given a new size (a restart whatever its servers) is placed afresh rather than beside
        last slot's workers (:meth:`_preferred_servers`)."""
        if not self.within_limits(j, kind):
            return False
        if self.allreduce[j]:  # one worker, where the job was or already is
            if self._pack and want is not None and not self.worker_servers[j] and self._moves_to_pack(j, want):
                self._afresh.add(j)
            s = self.placer.add_preferring(self.view.worker_demand[j], self._preferred_servers(j),
                                           (want or 1) if self._pack else 0)
            if s < 0:
                return False
            self.worker_servers[j].append(s)
            return True
        servers = self.placer.add_bundle(*self._demands(j, kind))
        if servers is None:
            return False
        targets = {"worker": (self.worker_servers,), "ps": (self.ps_servers,),
                   "bundle": (self.worker_servers, self.ps_servers)}[kind]
        for lst, s in zip(targets, servers):
            lst[j].append(s)
        return True

    def add_up_to(self, j: int, kind: str, count: int) -> int:
        """Add up to ``count`` workers or PS (``kind``) to job j, as that many `add` calls would, stopping at the
        first that does not fit; returns how many were added."""
        if self.allreduce[j] or kind not in ("worker", "ps"):
            n = 0
            while n < count and self.add(j, kind, count - n):
                n += 1
            return n
        held, limit = (self.worker_servers, self.view.max_workers) if kind == "worker" else \
            (self.ps_servers, self.view.max_ps)
        room = min(count, limit - len(held[j]))
        if room <= 0:
            return 0
        servers = self.placer.add_many(self._demands(j, kind)[0], room)
        held[j].extend(servers)
        return len(servers)

    def add_sizes(self, j: int, workers: int, ps: int) -> None:
        """Job j up to ``workers`` workers and ``ps`` PS in all, as far as the servers hold them: an all-reduce job
        its workers (``ps`` unused); a PS job its first bundle (a worker and a PS together, or nothing: its PS do
        not wait with no worker), then its further workers, then its further PS."""
        if self.allreduce[j]:
            self.add_up_to(j, "worker", workers - self.workers(j))
        elif self.add(j, "bundle"):
            self.add_up_to(j, "worker", workers - self.workers(j))
            self.add_up_to(j, "ps", ps - self.ps(j))

    def add_gang(self, j: int, workers: int, ps: int, stay: bool = False) -> bool:
        """Add ``workers`` workers and ``ps`` PS to job j all together, or nothing (a job that starts whole). A
        packed all-reduce job's workers are placed knowing how many are still to come (`add`'s ``want``);
        with ``stay``, a running job's tasks go back where they were (a scheduler that never moves a job)."""
        pairs = min(workers, ps)
        plan = ["bundle"] * pairs + ["worker"] * (workers - pairs) + ["ps"] * (ps - pairs)
        w0, p0 = self.workers(j), self.ps(j)
        if stay:
            self._stay.add(j)
        for kind in plan:
            if not self.add(j, kind, None if stay else workers - (self.workers(j) - w0)):
                self.shrink_to(j, w0, p0)
                return False
        return True

    def shrink_to(self, j: int, workers: int, ps: int) -> None:
        """Take job j's last-added workers and PS off until it holds at most ``workers`` and ``ps``."""
        while self.workers(j) > workers:
            self.placer.remove(self.worker_servers[j].pop(), self.view.worker_demand[j])
        while self.ps(j) > ps:
            self.placer.remove(self.ps_servers[j].pop(), self.view.ps_demand[j])

    def _moves_to_pack(self, j: int, want: int) -> bool:
        """Whether all-reduce job j, about to be given ``want`` workers, is placed afresh instead of beside last
        slot's workers: when its size changes (a restart wherever it goes), or when it keeps its size but its
        old servers are more than a fresh packed placement would take now (a restart that buys a faster
        placement: fewer servers, less all-reduce traffic between them)."""
        before = self._prev[j] if self._prev is not None else ()
        if want != len(before):
            return True
        span = len(set(before))
        return span > self._fewest_servers(j, want) and self.placer.packed_span(self.view.worker_demand[j], want) < span

    def _fewest_servers(self, j: int, workers: int) -> int:
        per_server = max(float(self.view.capacity[:, 0].max()), 1.0) / max(float(self.view.worker_demand[j][0]), 1e-9)
        return -(-workers // max(int(per_server + 1e-9), 1))

    def _repack(self) -> None:
        """Packed: all-reduce jobs whose workers span more servers than they need (grown task by task, their
        size unknown to the placement, or interleaved with other jobs' tasks) are placed again as wholes, the
        largest first. Those that restart this slot anyway (resized, or not where they ran) are taken off
        together and placed again (all put back as they were if one no longer fits); then each that would
        not move is placed again alone, kept only where it spans fewer servers (a restart that buys that)."""
        loose = [j for j in range(len(self.view)) if self.allreduce[j] and self.worker_servers[j]
                 and j not in self._stay
                 and len(set(self.worker_servers[j])) > self._fewest_servers(j, len(self.worker_servers[j]))]
        prev = self._prev or ((),) * len(self.view)
        staying = [j for j in loose if sorted(prev[j]) == sorted(self.worker_servers[j])]
        moving = sorted((j for j in loose if j not in staying), key=lambda j: (-len(self.worker_servers[j]), j))
        old = {j: list(self.worker_servers[j]) for j in loose}
        self._take_off(moving)
        if not all(self._place_whole(j, len(old[j])) for j in moving):
            self._take_off(moving)
            for j in moving:
                self._put(j, old[j])
        for j in sorted(staying, key=lambda j: (-len(old[j]), j)):
            self._take_off([j])
            if not (self._place_whole(j, len(old[j])) and len(set(self.worker_servers[j])) < len(set(old[j]))):
                self._take_off([j])
                self._put(j, old[j])

    def _take_off(self, jobs) -> None:
        for j in jobs:
            for s in self.worker_servers[j]:
                self.placer.remove(s, self.view.worker_demand[j])
            self.worker_servers[j] = []

    def _put(self, j: int, servers) -> None:
        for s in servers:
            self.placer.add_preferring(self.view.worker_demand[j], [s])
        self.worker_servers[j] = list(servers)

    def _place_whole(self, j: int, count: int) -> bool:
        """Place ``count`` workers of job j packed (the job has none now); False when they do not all fit."""
        for k in range(count):
            here = self.worker_servers[j]
            s = self.placer.add_preferring(self.view.worker_demand[j], sorted(set(here), key=here.index), count - k)
            if s < 0:
                return False
            here.append(s)
        return True

    def _preferred_servers(self, j: int) -> list[int]:
        """Last slot's servers of job j not yet given back to it this slot (unless it is placed afresh), then the
        ones it has now."""
        now = list(self.worker_servers[j])
        before = list(self._prev[j]) if self._prev is not None and j not in self._afresh else []
        for s in now:
            if s in before:
                before.remove(s)
        return before + sorted(set(now), key=now.index)

    def dominant_share(self, j: int) -> float:
        """max over resources of this job's allocated amount / the cluster's total."""
        used = self.workers(j) * self._w_share[j] + self.ps(j) * self._p_share[j]
        return float(used.max())

    def allocation(self) -> Allocation:
        """What was added, as an Allocation; packed, all-reduce jobs spread further than they need are placed
        again first (:meth:`_repack`)."""
        if self._pack:
            self._repack()
        return Allocation(
            workers=np.array([len(s) for s in self.worker_servers], int),
            ps=np.array([len(s) for s in self.ps_servers], int),
            worker_servers=tuple(tuple(s) for s in self.worker_servers),
            ps_servers=tuple(tuple(s) for s in self.ps_servers),
        )


def fill_in_order(view: SlotView, order) -> Allocation:
    """Give each job, in `order`, as many bundles as it may have, while they fit (FIFO, SRTF)."""
    b = AllocationBuilder(view)
    for j in order:
        while b.add(int(j), "bundle"):
            pass
    return b.allocation()


def remaining_time_estimate(view: SlotView) -> np.ndarray:
    """Seconds of single-worker compute the job still needs, from its epoch estimate: for a DL2 job its
    type's step compute time (the authors' simulator), for an all-reduce job its estimated one-GPU speed."""
    t = np.where(view.allreduce, 0, view.type_idx)
    one = view.est_speed[:, 0, 1] if view.max_workers >= 1 else np.zeros(len(view))
    with np.errstate(divide="ignore"):
        allreduce = view.remaining_epochs / np.where(one > 0, one, np.nan)
    return np.where(view.allreduce, np.nan_to_num(allreduce, nan=np.inf),
                    view.remaining_epochs * BATCHES_PER_EPOCH[t] * LOCAL_COMP_TIME[t])


def fifo(view: SlotView) -> Allocation:
    """First in, first out: the earliest job takes all it may, then the next (jobs that fit no more are skipped)."""
    return fill_in_order(view, np.argsort(view.arrival_slot, kind="stable"))


def srtf(view: SlotView) -> Allocation:
    """Shortest remaining time first, by the estimated remaining single-worker compute time."""
    return fill_in_order(view, np.lexsort((view.arrival_slot, remaining_time_estimate(view))))


def drf(view: SlotView) -> Allocation:
    """Dominant resource fairness: progressive filling, the job with the lowest dominant share gets the next bundle."""
    b = AllocationBuilder(view)
    heap = [(0.0, int(view.arrival_slot[j]), j) for j in range(len(view))]
    heapq.heapify(heap)
    while heap:
        _, arrival, j = heapq.heappop(heap)
        if b.add(j, "bundle"):
            heapq.heappush(heap, (b.dominant_share(j), arrival, j))
    return b.allocation()


def tetris(view: SlotView, task_threshold: int | None = None) -> Allocation:
    """Tetris: pick the job with the best packing alignment + shortest remaining time, give it bundles up to
    `task_threshold` (default: the per-job maximum), then pick the next."""
    b = AllocationBuilder(view)
    ps_limit = task_threshold or min(view.max_workers, view.max_ps)
    limits = np.where(view.allreduce, task_threshold or view.max_workers, ps_limit)
    cap = view.total_capacity
    norm = np.where(cap > 0, cap, 1.0)
    bundle = (view.worker_demand + view.ps_demand) / norm
    urgency = 1.0 / np.maximum(remaining_time_estimate(view), 1.0)
    urgency = urgency / max(urgency.mean(), 1e-12)
    left = set(range(len(view)))
    while left:
        free = b.placer.free.sum(axis=0) / norm
        align = bundle @ free
        align = align / max(align[list(left)].mean(), 1e-12)
        j = max(left, key=lambda k: (align[k] + urgency[k], -k))
        left.discard(j)
        while b.workers(j) < limits[j] and b.add(j, "bundle"):
            pass
    return b.allocation()


def build_tetris(options: PolicyOptions) -> StatelessPolicy:
    k = options.tetris_threshold
    if k is None:
        return StatelessPolicy(tetris, "tetris")
    return StatelessPolicy(functools.partial(tetris, task_threshold=k), f"tetris(k={k})")


def check_tetris(options: PolicyOptions) -> list[tuple[str, str]]:
    k = options.tetris_threshold
    return [] if k is None or k >= 1 else [("tetris_threshold", f"must be >= 1, got {k}")]


def build_drf(options: PolicyOptions) -> StatelessPolicy:
    return StatelessPolicy(drf, "drf")


def build_fifo(options: PolicyOptions) -> StatelessPolicy:
    return StatelessPolicy(fifo, "fifo")


def build_srtf(options: PolicyOptions) -> StatelessPolicy:
    return StatelessPolicy(srtf, "srtf")
