"""Node samples: the agents' rows in `node_samples`, and the retention pass over the table.

The rule (which rows to keep, merged how) is the pure `dl2d.db.retention.downsample`; this module only
reads the rows that must change, hands them to it and writes back the difference. Functions take a Session
and never commit.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from dl2d.db.models import NodeSample, utcnow
from dl2d.db.retention import DEFAULT_TIERS, downsample

_SAMPLE_COLUMNS = frozenset(c.name for c in NodeSample.__table__.columns) - {"id", "payload"}


def _to_db(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of `sample_to_row`/`downsample` (ts in epoch seconds or datetime) -> node_samples values."""
    out: dict[str, Any] = dict.fromkeys(_SAMPLE_COLUMNS)  # executemany needs the same keys in every row
    out.update(resolution_s=0, n=1, gpu_count=0)
    extras = dict(row.get("payload") or {})
    for k, v in row.items():
        if k in _SAMPLE_COLUMNS:
            if v is not None:
                out[k] = v
        elif k != "payload":
            extras[k] = v
    out["payload"] = extras or None
    if isinstance(out["ts"], (int, float)):
        out["ts"] = datetime.fromtimestamp(out["ts"], timezone.utc)
    out["resolution_s"] = int(out["resolution_s"])
    return out


def _from_db(sample: NodeSample) -> dict[str, Any]:
    """The inverse of `_to_db` (payload keys flattened back into the row)."""
    row = dict(sample.payload or {})
    row.update({c: getattr(sample, c) for c in _SAMPLE_COLUMNS})
    row["ts"] = sample.ts.timestamp()
    row["resolution_s"] = float(sample.resolution_s)
    return row


def insert_node_samples(session: Session, rows: Iterable[Mapping[str, Any]]) -> int:
    """Bulk-insert node-sample rows as made by `dl2d.agents.sample.sample_to_row` (keys without a column
    go to `payload`). Returns the number of rows."""
    values = [_to_db(r) for r in rows]
    if values:
        session.execute(NodeSample.__table__.insert(), values)
    return len(values)


@dataclass
class RetentionResult:
    loaded: int = 0  # rows read and handed to downsample()
    removed: int = 0  # rows deleted (merged or expired)
    added: int = 0  # merged rows inserted


def apply_retention(session: Session, now: datetime | None = None,
                    tiers: Sequence[tuple[float, float]] | None = None) -> RetentionResult:
    """Apply the retention tiers of `dl2d.db.retention` (raw 1 h, 1-minute means 24 h, 10-minute means
    30 days, then deleted) to the node_samples table.

    Only the rows that must change are read: rows older than the last tier are deleted in SQL; rows that
    aged into a coarser tier, together with the coarse rows of the buckets they fall into (merged again,
    weighted by `n`), go through the pure `downsample()`. Rows it returns unchanged stay as they are.
    """
    tiers = tuple(tiers or DEFAULT_TIERS)
    now = now or utcnow()
    result = RetentionResult()
    expired = NodeSample.ts <= now - timedelta(seconds=tiers[-1][0])
    result.removed += session.execute(delete(NodeSample).where(expired)).rowcount

    loaded: dict[int, tuple[int, dict[str, Any]]] = {}  # id(row dict) -> (db id, row)
    seen: set[int] = set()

    def load(where) -> None:
        for sample in session.scalars(select(NodeSample).where(where & ~expired)):
            if sample.id not in seen:
                seen.add(sample.id)
                row = _from_db(sample)
                loaded[id(row)] = (sample.id, row)

    for (prev_age, _), (_, res) in zip(tiers, tiers[1:]):
        aged = NodeSample.ts <= now - timedelta(seconds=prev_age)
        before = len(loaded)
        load(aged & (NodeSample.resolution_s < res))
        if len(loaded) > before:  # coarse rows these may merge into: first bucket start .. tier's end
            first = min(r["ts"] for _, r in list(loaded.values())[before:])
            start = datetime.fromtimestamp(first - first % res, timezone.utc)
            load(aged & (NodeSample.resolution_s == int(res)) & (NodeSample.ts >= start))

    kept = downsample([row for _, row in loaded.values()], now.timestamp(), tiers)
    unchanged = {id(r) for r in kept if id(r) in loaded}
    gone = [db_id for key, (db_id, _) in loaded.items() if key not in unchanged]
    new = [_to_db(r) for r in kept if id(r) not in loaded]
    for i in range(0, len(gone), 1000):
        session.execute(delete(NodeSample).where(NodeSample.id.in_(gone[i:i + 1000])))
    if new:
        session.execute(NodeSample.__table__.insert(), new)
    result.loaded, result.removed, result.added = len(loaded), result.removed + len(gone), len(new)
    return result
