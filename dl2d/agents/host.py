"""Host statistics (CPU load, memory, network bytes) through psutil."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

__all__ = ["HostReader", "counter_rate"]


def counter_rate(prev: int | None, cur: int, dt: float) -> float | None:
    """Per-second rate of a monotonic counter; ``None`` on the first read,
    a non-positive interval, or a counter reset (interface re-created)."""
    if prev is None or dt <= 0 or cur < prev:
        return None
    return (cur - prev) / dt


class HostReader:
    """Reads host stats; keeps the previous network counters to report rates.

    ``psutil_mod`` is injectable for tests; the default is the real psutil.
    """

    def __init__(self, psutil_mod: Any | None = None, clock: Callable[[], float] = time.monotonic):
        if psutil_mod is None:
            import psutil as psutil_mod
        self._ps = psutil_mod
        self._clock = clock
        self._lock = threading.Lock()
        self._prev: tuple[float, int, int] | None = None
        self._ps.cpu_percent(interval=None)  # prime: first call always returns 0.0

    def read(self) -> dict[str, Any]:
        ps = self._ps
        vm = ps.virtual_memory()
        net = ps.net_io_counters()
        load1, load5, load15 = os.getloadavg()
        now = self._clock()
        with self._lock:
            prev = self._prev
            self._prev = (now, net.bytes_recv, net.bytes_sent)
        dt = now - prev[0] if prev else 0.0
        return {
            "cpu_count": ps.cpu_count(),
            "cpu_percent": ps.cpu_percent(interval=None),
            "load1": load1,
            "load5": load5,
            "load15": load15,
            "mem_total_bytes": vm.total,
            "mem_used_bytes": vm.total - vm.available,
            "mem_available_bytes": vm.available,
            "net_rx_bytes": net.bytes_recv,
            "net_tx_bytes": net.bytes_sent,
            "net_rx_bps": counter_rate(prev[1] if prev else None, net.bytes_recv, dt),
            "net_tx_bps": counter_rate(prev[2] if prev else None, net.bytes_sent, dt),
        }
