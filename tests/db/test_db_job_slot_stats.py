"""job_slot_stats rows: bulk insert, one row per (slot, job), each job's last N rows read back oldest first."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy.exc import IntegrityError
from testkit.db import submission

from dl2d.db.engine import session_scope
from dl2d.db.jobs import submit_job
from dl2d.db.slots import recent_job_slot_stats, record_job_slot_stats, record_slot

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def row(job_id, factor, shared=None):
    return {"job_id": job_id, "workers": 2, "ps": 1, "epochs": 1.0, "epochs_per_s": 0.01,
            "predicted_epochs_per_s": 0.02, "speed_factor": factor, "ended": False, "gpus": None,
            "gpu_util_mean_pct": None, "gpu_mem_per_gpu_max_bytes": None, "shared_gpu": shared,
            "gpu_observations": 0}


def test_record_and_read_back_recent(engine):
    with session_scope(engine) as s:
        a, b, c = (submit_job(s, submission(name=f"j{i}")).id for i in range(3))
        for k in range(5):
            slot = record_slot(s, k, T0 + timedelta(minutes=20 * k))
            rows = [row(a, 0.1 * k)] + ([row(b, 1.0, shared=True)] if k == 1 else [])
            assert record_job_slot_stats(s, slot, rows) == len(rows)
        assert record_job_slot_stats(s, slot, []) == 0
    with session_scope(engine) as s:
        got = recent_job_slot_stats(s, [a, b, c], 3)
        assert set(got) == {a, b}
        assert [r["speed_factor"] for r in got[a]] == pytest.approx([0.2, 0.3, 0.4])
        assert got[b][0]["shared_gpu"] is True and got[b][0]["workers"] == 2
        assert recent_job_slot_stats(s, [], 3) == {} and recent_job_slot_stats(s, [a], 0) == {}
    with pytest.raises(IntegrityError), session_scope(engine) as s:  # one row per (slot, job)
        record_job_slot_stats(s, slot.id, [row(a, 1.0)])
