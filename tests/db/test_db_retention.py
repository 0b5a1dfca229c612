from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import func, select

from dl2d.db.engine import session_scope
from dl2d.db.models import NodeSample
from dl2d.db.samples import apply_retention, insert_node_samples

NOW = datetime(2024, 5, 10, 12, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)


def _series(start: timedelta, end: timedelta, step_s: int, resolution_s: int, n: int, util):
    """Rows of node n1 from NOW-start (inclusive) to NOW-end (exclusive) every step_s seconds."""
    t, k = NOW - start, 0
    while t < NOW - end:
        yield {"node": "n1", "ts": t.timestamp(), "resolution_s": resolution_s, "n": n, "gpu_count": 2,
               "gpu_util_mean_pct": util(k), "gpu_mem_total_bytes": 8e10, "net_rx_bps": 100.0,
               "jobs": ["17"], "gpu_power_w": 300.0}
        t += timedelta(seconds=step_s)
        k += 1


def _by_resolution(s) -> dict[int, int]:
    q = select(NodeSample.resolution_s, func.count()).group_by(NodeSample.resolution_s)
    return dict(s.execute(q).all())


def _row(s, resolution_s: int, ts: datetime) -> NodeSample:
    return s.scalars(select(NodeSample).where(NodeSample.resolution_s == resolution_s, NodeSample.ts == ts)).one()


def test_retention_tiers(engine):
    with session_scope(engine) as s:
        # raw every 10 s for the last 3 h (utilisation 0,10,..,50 within every minute: mean 25)
        insert_node_samples(s, _series(3 * H, 0 * H, 10, 0, 1, lambda k: k % 6 * 10.0))
        insert_node_samples(s, _series(48 * H, 3 * H, 60, 60, 6, lambda k: 80.0))
        insert_node_samples(s, _series(40 * 24 * H, 48 * H, 600, 600, 60, lambda k: 30.0))
        assert _by_resolution(s) == {0: 1080, 60: 2700, 600: 5472}
        assert _row(s, 0, NOW - H).payload == {"jobs": ["17"], "gpu_power_w": 300.0}

    with session_scope(engine) as s:
        result = apply_retention(s, NOW)
    # merged: raw rows aged >= 1 h (721, into 121 minutes), minute rows aged >= 24 h (1441, into 145);
    # expired: 10-minute rows aged >= 30 days (1441)
    assert (result.removed, result.added) == (721 + 1441 + 1441, 121 + 145)

    with session_scope(engine) as s:
        assert _by_resolution(s) == {0: 359, 60: 1259 + 121, 600: 4031 + 145}
        oldest = {r: s.scalar(select(func.min(NodeSample.ts)).where(NodeSample.resolution_s == r))
                  for r in (0, 60, 600)}
        assert oldest == {0: NOW - H + timedelta(seconds=10), 60: NOW - 24 * H + timedelta(minutes=1),
                          600: NOW - 30 * 24 * H + timedelta(minutes=10)}
        minute = _row(s, 60, NOW - 2 * H)
        assert (minute.n, minute.gpu_util_mean_pct, minute.net_rx_bps, minute.gpu_count) == (6, 25.0, 100.0, 2)
        assert minute.payload == {"jobs": ["17"], "gpu_power_w": 300.0}
        ten = _row(s, 600, NOW - 30 * H)
        assert (ten.n, ten.gpu_util_mean_pct) == (60, 80.0)
        assert _row(s, 60, NOW - H).n == 1  # a bucket only partly past the 1 h boundary

    with session_scope(engine) as s:  # again at the same time: nothing to do
        again = apply_retention(s, NOW)
    assert (again.removed, again.added) == (0, 0)

    with session_scope(engine) as s:  # 30 s later, 3 more raw samples join the partial bucket (weighted by n)
        later = apply_retention(s, NOW + timedelta(seconds=30))
        assert (later.removed, later.added) == (1 + 3, 1)
        partial = _row(s, 60, NOW - H)
        assert (partial.n, partial.gpu_util_mean_pct) == (4, 15.0)


def test_agent_rows_round_trip(engine):
    from dl2d.agents.sample import sample_to_row

    sample = {"node": "g1", "ts": NOW.timestamp(), "gpu_error": None,
              "gpus": [{"util_gpu_pct": 40.0, "mem_used_bytes": 1e9, "mem_total_bytes": 4e10, "power_w": 200.0,
                        "processes": [{"slurm_job_id": "99"}]},
                       {"util_gpu_pct": 60.0, "mem_used_bytes": 3e9, "mem_total_bytes": 4e10}],
              "host": {"cpu_percent": 12.5, "load1": 3.0, "mem_used_bytes": 2e10, "net_rx_bps": 1e6}}
    row = sample_to_row(sample)
    with session_scope(engine) as s:
        insert_node_samples(s, [row])
    with session_scope(engine) as s:
        got = s.scalars(select(NodeSample)).one()
        assert (got.gpu_count, got.gpu_util_mean_pct, got.gpu_util_max_pct) == (2, 50.0, 60.0)
        assert (got.gpu_mem_used_bytes, got.load1, got.net_rx_bps, got.ts) == (4e9, 3.0, 1e6, NOW)
        assert got.payload["jobs"] == ["99"] and got.payload["gpu_power_w"] == 200.0
