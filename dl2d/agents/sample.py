"""The sample dict an agent serves (schema documented in docs/agents.md)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

from dl2d import __version__ as _dl2d_version
from dl2d.agents.host import HostReader
from dl2d.agents.nvml import GPUReader

__all__ = ["SCHEMA_VERSION", "Sampler", "build_sample"]

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
