"""Cluster shape and task placement.

Free resources are an array [servers, 3] of (GPUs, CPU cores, memory GB). Placement is DL2's default: each
task goes to the least-loaded server that can hold it (load = the sum of used fractions of the three
resources), so a task is never split across servers and nothing ever exceeds a server's capacity.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ClusterSpec:
    num_servers: int = 500
    gpus: float = 2.0
    cpus: float = 8.0
    mem_gb: float = 48.0

    def __post_init__(self):
        if self.num_servers < 1:
            raise ValueError("a cluster needs at least one server")
        if min(self.gpus, self.cpus, self.mem_gb) < 0 or max(self.cpus, self.mem_gb) <= 0:
            raise ValueError("server resources must be non-negative, with some CPU and memory")

    @property
    def server_capacity(self) -> np.ndarray:
        return np.array([self.gpus, self.cpus, self.mem_gb], dtype=float)

    @property
    def capacity(self) -> np.ndarray:
        """Total capacity per resource, shape [3]."""
        return self.server_capacity * self.num_servers

    def empty(self) -> np.ndarray:
        """Free resources of an idle cluster, shape [servers, 3]."""
        return np.tile(self.server_capacity, (self.num_servers, 1))


#: Named cluster sizes. "dl2" is the scale of the paper's simulation; the small ones are for tests and demos.
PRESETS: dict[str, ClusterSpec] = {
    "dl2": ClusterSpec(500),
    "testbed": ClusterSpec(13),
    "small": ClusterSpec(40),
    "tiny": ClusterSpec(4),
}


def preset(name: str) -> ClusterSpec:
    if name not in PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


class Placer:
    """Places tasks one at a time on the least-loaded server that fits (a thin mutable shell).

    Servers are indexed by their (capacity, free) vector: a cluster has few distinct ones, so a placement
    scans those classes (with their load computed once) instead of every server. Ties go to the lowest
    server index, so placement is deterministic. Load = the sum of used fractions of the resources.
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
            self._entry(s)[1].append(s)  # ascending indices: already a heap

    @property
    def free(self) -> np.ndarray:
        return np.array(self._free).reshape(-1, 3)

    def _entry(self, s: int) -> list:
        key = (self._cap[s], self._free[s])
        entry = self._classes.get(key)
        if entry is None:
            load = sum(1.0 - f / c for f, c in zip(key[1], key[0]) if c > 0)
            entry = self._classes[key] = [load, []]
        return entry

    def server_for(self, demand) -> int:
        """The server `add` would use for `demand`, or -1; changes nothing."""
        d0, d1, d2 = (float(x) - 1e-9 for x in demand)
        best = None
        for (_, (f0, f1, f2)), (load, servers) in self._classes.items():
            if f0 >= d0 and f1 >= d1 and f2 >= d2 and (best is None or (load, servers[0]) < best):
                best = (load, servers[0])
        return -1 if best is None else best[1]

    def fits(self, demand) -> bool:
        return self.server_for(demand) >= 0

    def _move(self, s: int, sign: float, demand) -> None:
        key = (self._cap[s], self._free[s])
        heap = self._classes[key][1]
        if heap[0] == s:
            heapq.heappop(heap)
        else:
            heap.remove(s)
            heapq.heapify(heap)
        if not heap:
            del self._classes[key]
        self._free[s] = tuple(f + sign * float(d) for f, d in zip(self._free[s], demand))
        heapq.heappush(self._entry(s)[1], s)

    def add(self, demand) -> int:
        """Place one task; returns its server or -1 (and changes nothing) when it fits nowhere."""
        s = self.server_for(demand)
        if s >= 0:
            self._move(s, -1.0, demand)
        return s

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
