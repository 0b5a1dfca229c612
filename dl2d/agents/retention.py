"""Node-sample rows and their downsampling (retention policy).

A *row* is the flat, per-node summary of one agent sample that goes into the
``node_samples`` table (:func:`sample_to_row`). :func:`downsample` is a pure
function: given one node's (or many nodes') rows and the current time, it
returns the rows to keep, replacing old full-resolution rows by bucket
means. Default policy (:data:`DEFAULT_TIERS`):

=====================  ==============  =================================
age of the row         resolution      rows per node (10-s polling)
=====================  ==============  =================================
< 1 hour               every sample    <= 361
1 hour .. 1 day        1-minute means  <= 1382
1 day .. 30 days       10-minute means <= 4178
>= 30 days             dropped         0
=====================  ==============  =================================

so at most 5,921 rows per node, 5.9 M rows for 1000 nodes, whatever the
uptime (:func:`max_rows_per_node`). Buckets are aligned to absolute time and
rows carry their sample count ``n``, so applying it again (or every few
minutes, to overlapping sets) gives the same means: it is idempotent.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Sequence

__all__ = ["DEFAULT_TIERS", "downsample", "max_rows_per_node", "sample_to_row"]

#: (max age in seconds, resolution in seconds; 0 = keep every sample)
DEFAULT_TIERS: tuple[tuple[float, float], ...] = (
    (3600.0, 0.0),
    (86400.0, 60.0),
    (30 * 86400.0, 600.0),
)

KEY_FIELDS = ("node", "ts", "resolution_s", "n")
#: aggregated with max (peaks and monotonic counters); other numbers: mean
MAX_FIELDS = frozenset({"gpu_util_max_pct", "gpu_temp_max_c", "ecc_uncorrected", "xid_count"})


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


def _resolution(age: float, tiers: Sequence[tuple[float, float]]) -> float | None:
    for max_age, res in tiers:
        if age < max_age:
            return res
    return None  # older than the last tier: drop


def _merge(rows: list[dict[str, Any]], node: str, ts: float, res: float) -> dict[str, Any]:
    """Weighted (by ``n``) means; max for MAX_FIELDS; union of job lists;
    last value for other fields. ``None`` values do not count."""
    rows = sorted(rows, key=lambda r: r["ts"])
    out: dict[str, Any] = {"node": node, "ts": ts, "resolution_s": res,
                           "n": sum(r.get("n", 1) for r in rows)}
    keys = {k for r in rows for k in r} - set(KEY_FIELDS)
    for k in keys:
        vals = [(r[k], r.get("n", 1)) for r in rows if r.get(k) is not None]
        if not vals:
            out[k] = None
        elif all(_num(v) for v, _ in vals):
            if k in MAX_FIELDS:
                out[k] = max(v for v, _ in vals)
            else:
                out[k] = sum(v * w for v, w in vals) / sum(w for _, w in vals)
        elif all(isinstance(v, list) for v, _ in vals):
            out[k] = sorted({x for v, _ in vals for x in v})
        else:
            out[k] = vals[-1][0]
    return out


def downsample(
    rows: Iterable[dict[str, Any]],
    now: float,
    tiers: Sequence[tuple[float, float]] = DEFAULT_TIERS,
) -> list[dict[str, Any]]:
    """Rows to keep at time ``now``, ordered by (node, ts).

    Each row goes to the tier of its age; rows in a coarse tier are merged
    into ``(node, floor(ts/res)*res)`` buckets; rows past the last tier are
    dropped. Rows are not mutated.
    """
    raw: list[dict[str, Any]] = []
    coarse: dict[tuple[str, float, float], dict[str, Any]] = {}  # kept as they are
    buckets: dict[tuple[str, float, float], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        res = _resolution(now - r["ts"], tiers)
        if res is None:
            continue
        have = r.get("resolution_s", 0.0)
        if res <= have or res == 0:  # already this coarse (or coarser)
            if have > 0:
                coarse[(r["node"], have, r["ts"])] = r
            else:
                raw.append(r)
            continue
        start = math.floor(r["ts"] / res) * res
        buckets[(r["node"], res, start)].append(r)
    merged = []
    for (node, res, start), group in buckets.items():
        existing = coarse.pop((node, res, start), None)  # same bucket from an earlier pass
        merged.append(_merge(group + ([existing] if existing else []), node, start, res))
    out = raw + list(coarse.values()) + merged
    out.sort(key=lambda r: (r["node"], r["ts"], r.get("resolution_s", 0.0)))
    return out


def max_rows_per_node(interval_s: float, tiers: Sequence[tuple[float, float]] = DEFAULT_TIERS) -> int:
    """Upper bound on rows per node right after :func:`downsample` ran, when
    polled every ``interval_s``. Between passes, add the samples taken since
    the last pass (e.g. 60 rows for a pass every 10 min at 10-s polling).

    +1 per tier for a partly filled bucket at each end, +1 for a raw sample
    exactly at the boundary.
    """
    total, lo = 0, 0.0
    for max_age, res in tiers:
        step = res if res > 0 else interval_s
        total += math.ceil((max_age - lo) / step) + (1 if res == 0 else 2)
        lo = max_age
    return total
