"""The simulated cluster's shape and its named presets.

Free resources are an array [servers, 3] of (GPUs, CPU cores, memory GB); task placement is
dl2d.core.placement's (least-loaded server that fits).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The most servers a simulated cluster may have (`dl2ctl sim/train --servers`, the daemon's `sim.servers`):
#: 20x the largest preset (t4-512, dl2's 500) and more nodes than today's largest GPU clusters. The simulator
#: keeps several [servers, 3] arrays per slot and its placement scans every server for each task, so 10^8
#: servers took 3.6 GB before a single slot ran.
MAX_SERVERS = 10_000


@dataclass(frozen=True)
class ClusterSpec:
    num_servers: int = 500
    gpus: float = 2.0
    cpus: float = 8.0
    mem_gb: float = 48.0

    def __post_init__(self):
        if self.num_servers < 1:
            raise ValueError("a cluster needs at least one server")
        if self.num_servers > MAX_SERVERS:
            raise ValueError(f"a simulated cluster has at most {MAX_SERVERS} servers, not {self.num_servers}")
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


#: One node of the hardware the all-reduce throughput was measured on (dl2d/workload/data/pollux/README.md):
#: 4 NVIDIA T4 GPUs, 48 vCPUs, 192 GB (an AWS g4dn.12xlarge).
T4_NODE = {"gpus": 4.0, "cpus": 48.0, "mem_gb": 192.0}

#: Named cluster sizes. DL2's world (2-GPU servers): "dl2" is the scale of the paper's simulation, the small ones
#: are for tests and demos. Today's world (4-GPU T4 nodes): "t4-16" is the measured 64-GPU cluster, "t4-128"
#: (512 GPUs) and "t4-512" (2048 GPUs) larger ones.
PRESETS: dict[str, ClusterSpec] = {
    "dl2": ClusterSpec(500),
    "testbed": ClusterSpec(13),
    "small": ClusterSpec(40),
    "tiny": ClusterSpec(4),
    "t4-16": ClusterSpec(16, **T4_NODE),
    "t4-128": ClusterSpec(128, **T4_NODE),
    "t4-512": ClusterSpec(512, **T4_NODE),
}


def preset(name: str) -> ClusterSpec:
    if name not in PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
