"""The sample dict an agent serves (schema documented in docs/agents.md), and its flat per-node row.

`sample_to_row` lives here, next to the schema it reads: the daemon stores its rows in `node_samples`
(dl2d.db.samples), whose columns are the row's keys; how long they are kept is dl2d.db.retention's rule.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

from dl2d import __version__ as _dl2d_version
from dl2d.agents.host import HostReader
from dl2d.agents.nvml import GPUReader

__all__ = ["SCHEMA_VERSION", "Sampler", "build_sample", "sample_to_row"]

SCHEMA_VERSION = 1


def build_sample(
    node: str, ts: float, gpus: list[dict[str, Any]], gpu_error: str | None,
    driver_version: str | None, host: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "node": node,
        "ts": ts,
        "agent_version": _dl2d_version,
        "driver_version": driver_version,
        "gpu_count": len(gpus),
        "gpu_error": gpu_error,
        "gpus": gpus,
        "host": host,
    }


class Sampler:
    """Reads GPUs and host into one sample.

    Samples younger than ``min_interval`` seconds are served from a cache, so
    many concurrent pollers (or a retry storm) cost one NVML read.
    """

    def __init__(
        self,
        node: str,
        gpu: GPUReader,
        host: HostReader | None,
        min_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self._gpu = gpu
        self._host = host
        self._min_interval = min_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, bytes] | None = None

    def sample(self) -> dict[str, Any]:
        rep = self._gpu.read()
        host = self._host.read() if self._host is not None else None
        return build_sample(self.node, self._clock(), rep.gpus, rep.error, rep.driver_version, host)

    def sample_json(self) -> bytes:
        with self._lock:
            now = self._clock()
            if self._cached is None or now - self._cached[0] >= self._min_interval:
                self._cached = (now, json.dumps(self.sample(), separators=(",", ":")).encode())
            return self._cached[1]


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _vals(gpus: list[dict[str, Any]], key: str) -> list[float]:
    return [g[key] for g in gpus if _num(g.get(key))]


def sample_to_row(sample: dict[str, Any]) -> dict[str, Any]:
    """Flat per-node summary of an agent sample (see docs/agents.md)."""
    gpus = sample.get("gpus") or []
    host = sample.get("host") or {}
    util = _vals(gpus, "util_gpu_pct")
    jobs = {
        p["slurm_job_id"]
        for g in gpus for p in (g.get("processes") or []) if p.get("slurm_job_id")
    }
    return {
        "node": sample["node"],
        "ts": float(sample["ts"]),
        "resolution_s": 0.0,
        "n": 1,
        "gpu_count": len(gpus),
        "gpu_util_mean_pct": sum(util) / len(util) if util else None,
        "gpu_util_max_pct": max(util) if util else None,
        "gpu_mem_used_bytes": sum(_vals(gpus, "mem_used_bytes")) if gpus else None,
        "gpu_mem_total_bytes": sum(_vals(gpus, "mem_total_bytes")) if gpus else None,
        "gpu_power_w": sum(_vals(gpus, "power_w")) if gpus else None,
        "gpu_temp_max_c": max(_vals(gpus, "temp_c"), default=None),
        "ecc_uncorrected": sum(_vals(gpus, "ecc_uncorrected")) if gpus else None,
        "xid_count": sum(len(g.get("xid_errors") or []) for g in gpus),
        "cpu_percent": host.get("cpu_percent"),
        "load1": host.get("load1"),
        "mem_used_bytes": host.get("mem_used_bytes"),
        "net_rx_bps": host.get("net_rx_bps"),
        "net_tx_bps": host.get("net_tx_bps"),
        "jobs": sorted(jobs),
        "gpu_error": sample.get("gpu_error"),
    }
