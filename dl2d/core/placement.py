"""Task placement on a cluster of servers, and the capacity check of an allocation.

Free resources are an array [servers, 3] of (GPUs, CPU cores, memory GB). Placement is DL2's default: each
task goes to the least-loaded server that can hold it (load = the sum of used fractions of the three
resources), so a task is never split across servers and nothing ever exceeds a server's capacity. A view's
``allreduce_placement`` "pack" (the default) places an all-reduce job's new workers on the server that best fits
the workers it still wants instead (after the servers the job holds), so the job spans the fewest servers
(:meth:`Placer.add_preferring`, :meth:`Placer.packed_span`).
"""
from __future__ import annotations

import bisect
import heapq

import numpy as np

from dl2d.core.contract import Allocation, CapacityError, SlotView


class Placer:
    """Places tasks one at a time on the least-loaded server that fits (a thin mutable shell).

    Servers are indexed by their (capacity, free) vector: a cluster has few distinct ones. The classes are
    kept sorted by (load, lowest server index), updated as a task moves a server from one to another, so a
    placement scans them from the least loaded and stops at the first that fits (almost always the first).
    Ties go to the lowest server index, so placement is deterministic. Load = the sum of used fractions of
    the resources.
    """

    def __init__(self, free: np.ndarray, capacity: np.ndarray):
        free = np.asarray(free, dtype=float)
        capacity = np.broadcast_to(np.asarray(capacity, dtype=float), free.shape)
        self.capacity = np.array(capacity)
        self.total_capacity = self.capacity.sum(axis=0)
        self._cap = [tuple(map(float, c)) for c in self.capacity]
        self._free = [tuple(map(float, f)) for f in free]
        self._classes: dict[tuple, list] = {}  # (cap, free) -> [load, heap of servers]
        for s in range(len(free)):
            key = (self._cap[s], self._free[s])
            entry = self._classes.get(key)
            if entry is None:
                entry = self._classes[key] = [self._load(key), []]
            entry[1].append(s)  # ascending indices: already a heap
        #: (load, lowest server, key) of every class, ascending
        self._order = sorted((load, servers[0], key) for key, (load, servers) in self._classes.items())

    @property
    def free(self) -> np.ndarray:
        return np.array(self._free).reshape(-1, 3)

    @staticmethod
    def _load(key) -> float:
        return sum(1.0 - f / c for f, c in zip(key[1], key[0]) if c > 0)

    def server_for(self, demand) -> int:
        """The server `add` would use for `demand`, or -1; changes nothing."""
        return self._first_fit(*(float(x) - 1e-9 for x in demand))

    def _first_fit(self, d0: float, d1: float, d2: float) -> int:
        """The least-loaded server (lowest index on a tie) with at least (d0, d1, d2) free, or -1."""
        for _, s, (_, (f0, f1, f2)) in self._order:
            if f0 >= d0 and f1 >= d1 and f2 >= d2:
                return s
        return -1

    def fits(self, demand) -> bool:
        return self.server_for(demand) >= 0

    def fits_on(self, server: int, demand) -> bool:
        return all(f >= float(d) - 1e-9 for f, d in zip(self._free[server], demand))

    def add_preferring(self, demand, servers, pack_for: int = 0) -> int:
        """Place one task on the first of ``servers`` it fits on, else where `add` would; -1 if nowhere. (An
        all-reduce job's workers go where the job already is: it keeps its placement and stays packed.) With
        ``pack_for`` > 0, the workers the job still wants this one included, a new server is chosen to hold them
        on the fewest servers instead (:meth:`_packing_server`)."""
        for s in servers:
            if self.fits_on(s, demand):
                self._move(s, -1.0, demand)
                return s
        if pack_for <= 0:
            return self.add(demand)
        s = self._packing_server(demand, pack_for)
        if s >= 0:
            self._move(s, -1.0, demand)
        return s

    @staticmethod
    def _room(free, demand, default: int) -> int:
        """How many tasks of ``demand`` (floats) fit in ``free``; ``default`` when it asks for nothing."""
        return min((int((f + 1e-9) // x) for f, x in zip(free, demand) if x > 0), default=default)

    @staticmethod
    def _pack_key(room: int, want: int, s: int) -> tuple:
        """The packing order of a server that holds ``room`` of the ``want`` tasks still to place (smallest
        first): one that holds them all, the fewest first (best fit); else the one that holds the most."""
        return (0, room, s) if room >= want else (1, -room, s)

    def _packing_server(self, demand, want: int) -> int:
        """The server for the first of ``want`` tasks of one demand that will fill it: of the servers that hold
        all of them, the one that holds the fewest (best fit, leaving whole servers free for the next job);
        when none does, the one that holds the most (the job spans the fewest servers); the lowest index on a
        tie; -1 when none holds one."""
        dem = [float(x) for x in demand]
        best, best_key = -1, None
        for _, s, (_, free) in self._order:  # the lowest server of each class: its equals hold as many
            room = self._room(free, dem, want)
            if room <= 0:
                continue
            key = self._pack_key(room, want, s)
            if best_key is None or key < best_key:
                best, best_key = s, key
        return best

    def packed_span(self, demand, count: int) -> int:
        """The servers ``count`` tasks of one demand would span if placed now as `add_preferring` packs them
        (each server chosen by :meth:`_packing_server`, then filled), nothing placed; a large number when they
        do not all fit. Servers of a class hold as many each: a class gives its lowest ones first."""
        dem = [float(x) for x in demand]
        pools = []  # [room, the class's servers still unused, ascending]
        for key, (_, servers) in self._classes.items():
            room = self._room(key[1], dem, count)
            if room > 0:
                pools.append([room, heapq.nsmallest(min(len(servers), -(-count // room)), servers)])
        span = 0
        while count > 0:
            live = [p for p in pools if p[1]]
            if not live:
                return len(self._free) + 1
            room, servers = min(live, key=lambda p: self._pack_key(p[0], count, p[1][0]))
            servers.pop(0)
            count -= min(room, count)
            span += 1
        return span

    def _move(self, s: int, sign: float, demand) -> None:
        """Server s's free resources change by ``sign * demand``: it leaves its class for another."""
        order, classes = self._order, self._classes
        key = (self._cap[s], self._free[s])
        load, heap = classes[key]
        del order[bisect.bisect_left(order, (load, heap[0], key))]
        if heap[0] == s:
            heapq.heappop(heap)
        else:
            heap.remove(s)
            heapq.heapify(heap)
        if heap:
            bisect.insort(order, (load, heap[0], key))
        else:
            del classes[key]
        f0, f1, f2 = self._free[s]
        self._free[s] = free = (f0 + sign * float(demand[0]), f1 + sign * float(demand[1]),
                                f2 + sign * float(demand[2]))
        key = (self._cap[s], free)
        entry = classes.get(key)
        if entry is None:
            entry = classes[key] = [self._load(key), []]
        else:
            del order[bisect.bisect_left(order, (entry[0], entry[1][0], key))]
        heapq.heappush(entry[1], s)
        bisect.insort(order, (entry[0], entry[1][0], key))

    def add(self, demand) -> int:
        """Place one task; returns its server or -1 (and changes nothing) when it fits nowhere."""
        s = self.server_for(demand)
        if s >= 0:
            self._move(s, -1.0, demand)
        return s

    def add_many(self, demand, count: int) -> list[int]:
        """Place up to ``count`` tasks of one demand, each as `add` would; their servers (fewer when the rest
        fits nowhere)."""
        dem = tuple(float(x) for x in demand)  # converted once, not per task
        need = tuple(d - 1e-9 for d in dem)
        placed: list[int] = []
        for _ in range(count):
            s = self._first_fit(*need)
            if s < 0:
                break
            self._move(s, -1.0, dem)
            placed.append(s)
        return placed

    def add_at(self, server: int, demand) -> None:
        """Place one task on a chosen server (the caller checked that it fits)."""
        self._move(server, -1.0, demand)

    def remove(self, server: int, demand) -> None:
        self._move(server, 1.0, demand)

    def add_bundle(self, *demands) -> list[int] | None:
        """Place several tasks all-or-nothing (e.g. a worker and a PS)."""
        placed = []
        for d in demands:
            s = self.add(d)
            if s < 0:
                for srv, dd in zip(placed, demands):
                    self.remove(srv, dd)
                return None
            placed.append(s)
        return placed


def fit_counts(room: np.ndarray, demand, default: int = np.iinfo(np.int32).max) -> np.ndarray:
    """[servers] how many tasks of ``demand`` [3] fit in each server's ``room`` [servers, 3] (the array form of
    :meth:`Placer._room`); ``default`` where it asks for nothing."""
    counts = np.full(len(room), default, dtype=np.int64)
    for r, x in enumerate(demand):
        if x > 0:
            counts = np.minimum(counts, np.floor(room[:, r] / x + 1e-9).astype(np.int64))
    return counts


def even_spread(tasks: int, per_node: int) -> tuple[int, int]:
    """(nodes, tasks on each) of ``tasks`` on the fewest nodes that hold ``per_node`` each, spread evenly: how
    Slurm lays out ``--nodes=N`` with the same GRES on every node (dl2d.daemon.slurm.mapping.allocation_for
    for a whole demand, CPUs and memory too). 10 on nodes of 4: 3 nodes of 4, the last two holding 3 each."""
    tasks, per_node = int(tasks), max(int(per_node), 1)
    nodes = max(-(-tasks // per_node), 1)
    return nodes, -(-tasks // nodes)


def place(view: SlotView, alloc: Allocation) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Usage [servers, 3] of an allocation, and the workers/PS actually placed per job.

    With servers given, checks them (CapacityError on any overflow); without, places each job's tasks
    (worker, PS, worker, PS, ...) on the least-loaded server that fits and drops what fits nowhere.
    """
    return place_servers(view, alloc)[:3]


def place_servers(view: SlotView, alloc: Allocation):
    """`place`, plus the servers of every placed task: (usage, workers, ps, worker_servers, ps_servers)."""
    free = view.free.copy()
    w_dem, p_dem = view.worker_demand, view.ps_demand
    if alloc.worker_servers is not None:
        for j in range(len(view)):
            for servers, demand in ((alloc.worker_servers[j], w_dem[j]), (alloc.ps_servers[j], p_dem[j])):
                for s in servers:
                    free[s] -= demand
        if np.any(free < -1e-6):
            raise CapacityError(f"allocation overflows server(s) {np.flatnonzero((free < -1e-6).any(1)).tolist()}")
        placed_w = np.array([len(s) for s in alloc.worker_servers], int)
        placed_p = np.array([len(s) for s in alloc.ps_servers], int)
        return view.free - free, placed_w, placed_p, tuple(alloc.worker_servers), tuple(alloc.ps_servers)
    placer = Placer(view.free, view.capacity)
    placed_w = np.zeros(len(view), int)
    placed_p = np.zeros(len(view), int)
    w_srv: list[list[int]] = [[] for _ in range(len(view))]
    p_srv: list[list[int]] = [[] for _ in range(len(view))]
    for j in range(len(view)):
        for k in range(max(int(alloc.workers[j]), int(alloc.ps[j]))):
            for want, placed, demand, srv in ((alloc.workers, placed_w, w_dem[j], w_srv),
                                              (alloc.ps, placed_p, p_dem[j], p_srv)):
                if k < want[j]:
                    s = placer.add(demand)
                    if s >= 0:
                        placed[j] += 1
                        srv[j].append(s)
    return (view.free - placer.free, placed_w, placed_p,
            tuple(tuple(s) for s in w_srv), tuple(tuple(s) for s in p_srv))
