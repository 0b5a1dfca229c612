"""Per-GPU statistics through NVML, behind an injectable interface.

The interface *is* the subset of the ``pynvml`` module API used below
(``nvmlInit``, ``nvmlDeviceGetCount``, ... plus ``NVMLError`` and the few
constants), so the real backend is the ``pynvml`` module itself and
:class:`FakeNVML` is a drop-in object with the same names. Code under test
gets a ``FakeNVML`` passed in; nothing is monkeypatched.

Every per-field call is best-effort: a field the GPU or driver does not
support becomes ``None`` instead of failing the whole sample, and a machine
without the driver (or without ``pynvml``) yields zero GPUs plus a reason.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

__all__ = [
    "FakeGPU",
    "FakeNVML",
    "FakeProcess",
    "GPUReader",
    "GPUReport",
    "load_pynvml",
    "slurm_job_of_pid",
]

_CGROUP_JOB = re.compile(r"job_(\d+)")


def slurm_job_of_pid(pid: int, proc_root: str = "/proc") -> str | None:
    """Best-effort Slurm job id of a process.

    Reads ``SLURM_JOB_ID`` from ``<proc_root>/<pid>/environ`` (needs root or
    the same user), else looks for ``job_<id>`` in the cgroup path that
    Slurm's cgroup plugin creates (``.../slurm/uid_X/job_<id>/step_Y``).
    """
    base = os.path.join(proc_root, str(pid))
    try:
        with open(os.path.join(base, "environ"), "rb") as f:
            for var in f.read().split(b"\0"):
                if var.startswith(b"SLURM_JOB_ID="):
                    return var.split(b"=", 1)[1].decode(errors="replace") or None
    except OSError:
        pass
    try:
        with open(os.path.join(base, "cgroup"), encoding="utf-8", errors="replace") as f:
            m = _CGROUP_JOB.search(f.read())
            if m:
                return m.group(1)
    except OSError:
        pass
    return None


def load_pynvml() -> tuple[Any | None, str | None]:
    """Import ``pynvml``; return ``(module, None)`` or ``(None, reason)``."""
    try:
        import pynvml  # nvidia-ml-py
    except Exception as e:  # ImportError, or a broken install
        return None, f"pynvml not importable: {e}"
    return pynvml, None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class GPUReport:
    """One read of all GPUs on the node."""

    gpus: list[dict[str, Any]]
    error: str | None = None  # why there are no GPUs, when there are none
    driver_version: str | None = None


class GPUReader:
    """Reads all GPUs through an NVML-like object (``pynvml`` or ``FakeNVML``).

    Initialisation is retried on every :meth:`read` until it succeeds, so an
    agent started before the driver is loaded picks the GPUs up later.
    """

    def __init__(
        self,
        nvml: Any | None,
        unavailable_reason: str | None = None,
        job_of_pid: Callable[[int], str | None] = slurm_job_of_pid,
    ) -> None:
        self._nvml = nvml
        self._reason = unavailable_reason or ("no NVML backend" if nvml is None else None)
        self._job_of_pid = job_of_pid
        self._ready = False
        self._lock = threading.Lock()
        self._xid_sets: dict[int, Any] = {}  # GPU index -> NVML event set
        self._xids: dict[int, list[int]] = {}  # GPU index -> XIDs seen since start

    def read(self) -> GPUReport:
        with self._lock:
            return self._read_locked()

    def close(self) -> None:
        with self._lock:
            if self._ready and self._nvml is not None:
                for es in self._xid_sets.values():
                    self._call(self._nvml.nvmlEventSetFree, es)
                self._call(self._nvml.nvmlShutdown)
            self._ready = False
            self._xid_sets.clear()

    # -- internals -------------------------------------------------------

    def _read_locked(self) -> GPUReport:
        nv = self._nvml
        if nv is None:
            return GPUReport([], self._reason)
        if not self._ready:
            try:
                nv.nvmlInit()
            except Exception as e:
                return GPUReport([], f"NVML init failed: {e}")
            self._ready = True
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception as e:
            return GPUReport([], f"nvmlDeviceGetCount failed: {e}")
        driver = self._call(nv.nvmlSystemGetDriverVersion)
        gpus = [self._read_gpu(i) for i in range(count)]
        error = None if gpus else "NVML reports 0 GPUs"
        return GPUReport(gpus, error, _text(driver) if driver is not None else None)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call an NVML getter; ``None`` when unsupported or failing."""
        try:
            return fn(*args)
        except Exception:  # NVMLError_NotSupported, NoPermission, GPU lost...
            return None

    def _read_gpu(self, i: int) -> dict[str, Any]:
        nv, call = self._nvml, self._call
        h = call(nv.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            return {"index": i, "error": "nvmlDeviceGetHandleByIndex failed"}
        util = call(nv.nvmlDeviceGetUtilizationRates, h)
        mem = call(nv.nvmlDeviceGetMemoryInfo, h)
        power = call(nv.nvmlDeviceGetPowerUsage, h)
        limit = call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        name, uuid = call(nv.nvmlDeviceGetName, h), call(nv.nvmlDeviceGetUUID, h)
        return {
            "index": i,
            "uuid": _text(uuid) if uuid is not None else None,
            "name": _text(name) if name is not None else None,
            "util_gpu_pct": util.gpu if util is not None else None,
            "util_mem_pct": util.memory if util is not None else None,
            "mem_used_bytes": mem.used if mem is not None else None,
            "mem_total_bytes": mem.total if mem is not None else None,
            "temp_c": call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            "power_w": power / 1000.0 if power is not None else None,
            "power_limit_w": limit / 1000.0 if limit is not None else None,
            "clock_sm_mhz": call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            "clock_mem_mhz": call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            "ecc_corrected": call(
                nv.nvmlDeviceGetTotalEccErrors,
                h,
                nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                nv.NVML_VOLATILE_ECC,
            ),
            "ecc_uncorrected": call(
                nv.nvmlDeviceGetTotalEccErrors,
                h,
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nv.NVML_VOLATILE_ECC,
            ),
            "xid_errors": self._drain_xids(i, h),
            "processes": self._processes(h),
        }

    def _processes(self, h: Any) -> list[dict[str, Any]] | None:
        procs = self._call(self._nvml.nvmlDeviceGetComputeRunningProcesses, h)
        if procs is None:
            return None
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append(
                {
                    "pid": int(p.pid),
                    "used_mem_bytes": int(used) if used is not None else None,
                    "slurm_job_id": self._job_of_pid(int(p.pid)),
                }
            )
        return out

    def _drain_xids(self, i: int, h: Any) -> list[int] | None:
        """XIDs seen on GPU ``i`` since the agent started, or ``None`` if
        NVML refuses event registration (common in containers, non-root)."""
        nv = self._nvml
        if i not in self._xid_sets:
            es = self._call(nv.nvmlEventSetCreate)
            if es is None or not self._call_ok(
                nv.nvmlDeviceRegisterEvents, h, nv.nvmlEventTypeXidCriticalError, es
            ):
                self._xid_sets[i] = None
                return None
            self._xid_sets[i] = es
            self._xids[i] = []
        es = self._xid_sets[i]
        if es is None:
            return None
        for _ in range(64):  # bounded drain; timeout 0 = do not block
            data = self._call(nv.nvmlEventSetWait, es, 0)
            if data is None:
                break
            self._xids[i].append(int(data.eventData))
        return list(self._xids[i][-32:])

    def _call_ok(self, fn: Callable[..., Any], *args: Any) -> bool:
        try:
            fn(*args)
            return True
        except Exception:
            return False


# ---------------------------------------------------------------------------
# Fake NVML for tests and benchmarks
# ---------------------------------------------------------------------------


class _FakeNVMLError(Exception):
    pass


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int | None  # noqa: N815 - pynvml's spelling


@dataclass
class FakeGPU:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    util_gpu: int = 0
    util_mem: int = 0
    mem_used: int = 0
    mem_total: int = 80 * 1024**3
    temp_c: int = 35
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    clock_sm: int = 1980
    clock_mem: int = 2619
    ecc_corrected: int | None = 0  # None = "not supported"
    ecc_uncorrected: int | None = 0
    processes: list[FakeProcess] = field(default_factory=list)
    pending_xids: list[int] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)  # method names that raise


class FakeNVML:
    """Same names as the ``pynvml`` subset that :class:`GPUReader` uses.

    ``init_error`` simulates a machine without the driver.
    """

    NVMLError = _FakeNVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(
        self,
        gpus: list[FakeGPU] | None = None,
        init_error: str | None = None,
        driver_version: str = "550.54.15",
    ) -> None:
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.driver_version = driver_version
        self.initialised = False

    @classmethod
    def h100s(cls, n: int = 8) -> "FakeNVML":
        return cls(
            [
                FakeGPU(uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000")
                for i in range(n)
            ]
        )

    def _gpu(self, h: int, method: str) -> FakeGPU:
        if not self.initialised:
            raise self.NVMLError("Uninitialized")
        g = self.gpus[h]
        if method in g.unsupported:
            raise self.NVMLError("Not Supported")
        return g

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialised:
            raise self.NVMLError("Uninitialized")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._gpu(i, "nvmlDeviceGetHandleByIndex")
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._gpu(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=g.mem_used, total=g.mem_total, free=g.mem_total - g.mem_used)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._gpu(h, "nvmlDeviceGetTemperature").temp_c

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetClockInfo")
        return g.clock_sm if clock == self.NVML_CLOCK_SM else g.clock_mem

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetTotalEccErrors")
        v = g.ecc_uncorrected if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else g.ecc_corrected
        if v is None:
            raise self.NVMLError("Not Supported")
        return v

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[FakeProcess]:
        return list(self._gpu(h, "nvmlDeviceGetComputeRunningProcesses").processes)

    def nvmlEventSetCreate(self) -> list[int]:
        return []  # holds the handles registered with it

    def nvmlEventSetFree(self, es: list[int]) -> None:
        es.clear()

    def nvmlDeviceRegisterEvents(self, h: int, types: int, es: list[int]) -> None:
        self._gpu(h, "nvmlDeviceRegisterEvents")
        es.append(h)

    def nvmlEventSetWait(self, es: list[int], timeout_ms: int) -> SimpleNamespace:
        for h in es:
            if self.gpus[h].pending_xids:
                return SimpleNamespace(
                    eventType=self.nvmlEventTypeXidCriticalError,
                    eventData=self.gpus[h].pending_xids.pop(0),
                    device=h,
                )
        raise self.NVMLError("Timeout")
