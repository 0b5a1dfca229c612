"""How long the ``node_samples`` table keeps what (the retention rule), as pure functions.

A *row* is the flat, per-node summary of one agent sample
(``dl2d.agents.sample.sample_to_row``). :func:`downsample` is a pure
function: given one node's (or many nodes') rows and the current time, it
returns the rows to keep, replacing old full-resolution rows by bucket
means. It lives with the database, which it bounds; ``dl2d.db.samples``
applies it to the table. Default policy (:data:`DEFAULT_TIERS`):

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

__all__ = ["DEFAULT_TIERS", "downsample", "max_rows_per_node"]

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


def _resolution(ts: float, now: float, tiers: Sequence[tuple[float, float]]) -> float | None:
    """The first tier whose bucket holding ``ts`` starts young enough for it (a raw tier: ``ts`` itself); None
    past the last: drop. Judging the bucket's start, not the row's own time, is what makes the rule idempotent:
    a merged row is stamped with its bucket's start, and a second pass must put it in the same tier (a row one
    second short of 30 days merged into a bucket that starts at 30 days was dropped by the next pass)."""
    for max_age, res in tiers:
        start = math.floor(ts / res) * res if res > 0 else ts
        if now - start < max_age:
            return res
    return None


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

    Each row goes to the first tier whose bucket holding it starts within the
    tier's age (:func:`_resolution`); rows in a coarse tier are merged into
    ``(node, floor(ts/res)*res)`` buckets; rows whose last-tier bucket starts
    past it are dropped. Rows are not mutated.
    """
    raw: list[dict[str, Any]] = []
    coarse: dict[tuple[str, float, float], dict[str, Any]] = {}  # kept as they are
    buckets: dict[tuple[str, float, float], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        res = _resolution(r["ts"], now, tiers)
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
