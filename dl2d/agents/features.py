"""Per-Slurm-job GPU features from agent samples, for the policy and report.

A GPU is attributed to a job when one of the GPU's compute processes maps
to that job (``processes[].slurm_job_id``). GPU utilisation is per device,
not per process, so on a GPU shared by several jobs each job is credited the
whole device's utilisation and ``shared_gpu`` is set: treat it as an upper
bound (and as an interference signal).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

__all__ = ["job_gpu_features"]


def job_gpu_features(samples: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{job_id: features}`` over any set of samples (nodes and times).

    Features: ``gpus`` (distinct GPUs seen), ``nodes``, ``observations``
    (GPU x sample pairs), ``gpu_util_mean_pct``, ``gpu_mem_per_gpu_mean_bytes``,
    ``gpu_mem_per_gpu_max_bytes`` (memory of the job's own processes),
    ``shared_gpu``, ``ts_first``, ``ts_last``.
    """
    util: dict[str, list[float]] = defaultdict(list)
    mem: dict[str, list[int]] = defaultdict(list)
    gpus: dict[str, set[tuple[str, str]]] = defaultdict(set)
    shared: dict[str, bool] = defaultdict(bool)
    ts: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        node = s.get("node", "?")
        for g in s.get("gpus") or []:
            per_job: dict[str, int] = defaultdict(int)
            for p in g.get("processes") or []:
                job = p.get("slurm_job_id")
                if job:
                    per_job[job] += p.get("used_mem_bytes") or 0
            for job, used in per_job.items():
                gpus[job].add((node, g.get("uuid") or str(g.get("index"))))
                mem[job].append(used)
                ts[job].append(s["ts"])
                if g.get("util_gpu_pct") is not None:
                    util[job].append(g["util_gpu_pct"])
                if len(per_job) > 1:
                    shared[job] = True
    return {
        job: {
            "gpus": len(gpus[job]),
            "nodes": sorted({n for n, _ in gpus[job]}),
            "observations": len(mem[job]),
            "gpu_util_mean_pct": sum(util[job]) / len(util[job]) if util[job] else None,
            "gpu_mem_per_gpu_mean_bytes": sum(mem[job]) / len(mem[job]),
            "gpu_mem_per_gpu_max_bytes": max(mem[job]),
            "shared_gpu": shared[job],
            "ts_first": min(ts[job]),
            "ts_last": max(ts[job]),
        }
        for job in sorted(gpus)
    }
