"""The node-sample retention rule (dl2d.db.retention): bounded rows, idempotent, means preserved."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dl2d.db.retention import DEFAULT_TIERS, downsample, max_rows_per_node

DAY = 86400.0


def row(node, ts, util=50.0, temp=40, jobs=()):
    return {"node": node, "ts": ts, "resolution_s": 0.0, "n": 1, "gpu_util_mean_pct": util,
            "gpu_temp_max_c": temp, "jobs": list(jobs), "gpu_error": None}


def test_documented_bound():
    assert max_rows_per_node(10) == 361 + 1382 + 4178 == 5921


def simulate(interval, period, duration, tiers):
    """Poll one node every ``interval`` s and apply the policy every ``period`` s."""
    rows, t, peak = [], 0.0, 0
    while t < duration:
        rows.extend(row("n1", t + k * interval, util=(t / 60) % 100)
                    for k in range(int(period / interval)))
        t += period
        rows = downsample(rows, now=t, tiers=tiers)
        peak = max(peak, len(rows))
        assert min(r["ts"] for r in rows) > t - tiers[-1][0] - tiers[-1][1]
    return rows, peak


def test_rows_stay_bounded_under_periodic_passes():
    """Scaled-down tiers (same shape as the default: raw, then x6, then x10
    coarser), 11 simulated hours at 1-s polling, a pass every minute: the row
    count never exceeds max_rows_per_node (+ samples between passes)."""
    tiers = ((360.0, 0.0), (3600.0, 6.0), (36000.0, 60.0))
    rows, peak = simulate(1.0, 60.0, 40000.0, tiers)
    bound = max_rows_per_node(1.0, tiers)
    assert bound == 361 + 542 + 542
    assert len(rows) <= bound and peak <= bound + 60
    assert len(rows) >= bound - 6  # and the bound is tight
    assert sum(r["n"] for r in rows) == pytest.approx(36000, abs=60)


def test_default_tiers_on_a_month_of_samples():
    """31 days at 60-s polling plus the last hour at 10 s, in one pass."""
    now = 31 * DAY
    rows = [row("n1", float(t)) for t in range(0, int(now - 3600), 60)]
    rows += [row("n1", float(t)) for t in range(int(now - 3600), int(now), 10)]
    out = downsample(rows, now)
    by_res = {}
    for r in out:
        by_res[r["resolution_s"]] = by_res.get(r["resolution_s"], 0) + 1
    # the partial bucket at 30 d starts past it: dropped (judged by its start, as the merged row is stamped)
    assert by_res == {0.0: 359, 60.0: 1380, 600.0: 4176}
    assert len(out) <= max_rows_per_node(10)
    assert min(r["ts"] for r in out) > now - 30 * DAY - 600


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 40 * DAY), st.floats(0, 100)), min_size=1, max_size=200),
       st.floats(1, 10 * DAY))
@example(points=[(10 * DAY + 1.0, 0.0)], later=1.0)  # a second short of 30 d: was merged, then dropped
@example(points=[(39 * DAY + 1.0, 50.0)], later=1.0)  # a second short of 1 d: was merged at 60 s, then 600 s
def test_idempotent_and_mean_preserving(points, later):
    now = 40 * DAY
    rows = [row("n", ts, util) for ts, util in points]
    once = downsample(rows, now)
    assert downsample(once, now) == once
    # applying now and again later == applying later directly (same buckets, weighted means)
    direct = downsample(rows, now + later)
    twice = downsample(once, now + later)
    assert [(r["ts"], r["n"]) for r in twice] == [(r["ts"], r["n"]) for r in direct]
    for a, b in zip(twice, direct):
        assert a["gpu_util_mean_pct"] == pytest.approx(b["gpu_util_mean_pct"])
    last_age, last_res = DEFAULT_TIERS[-1]  # a row is kept while its last-tier bucket starts within that tier
    kept = [(ts, u) for ts, u in points if now + later - math.floor(ts / last_res) * last_res < last_age]
    if kept:
        total = sum(r["gpu_util_mean_pct"] * r["n"] for r in direct)
        assert total == pytest.approx(sum(u for _, u in kept), rel=1e-9, abs=1e-6)


def test_merge_rules_and_nodes_kept_apart():
    now = 10 * DAY
    rows = [row("a", now - 7200 + 5, util=20, temp=50, jobs=["1"]),
            row("a", now - 7200 + 15, util=40, temp=70, jobs=["2"]),
            row("a", now - 7200 + 25, util=None, temp=60),
            row("b", now - 7200 + 5, util=90),
            row("a", now - 60, util=10),      # fresh: untouched
            row("a", now - 31 * DAY)]          # too old: dropped
    out = downsample(rows, now)
    a = [r for r in out if r["node"] == "a"]
    assert len(a) == 2 and len([r for r in out if r["node"] == "b"]) == 1
    m = a[0]
    assert (m["resolution_s"], m["n"], m["ts"] % 60) == (60.0, 3, 0.0)
    assert m["gpu_util_mean_pct"] == 30  # None ignored
    assert m["gpu_temp_max_c"] == 70 and m["jobs"] == ["1", "2"]
    assert a[1] == rows[4]
