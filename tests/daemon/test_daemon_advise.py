"""Advise mode: the daemon carries out what Slurm alone would do (each job exactly the size it
asked for, never resized) and records, every slot, what its policy would have done; `dl2ctl report` compares the
two by predicted JCT."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from dl2d.cli.main import cli
from dl2d.daemon.config import ConfigError, build_config
from dl2d.daemon.main import DemoFeeder, build_loop, demo_cluster_gpus
from dl2d.db.advice import AdvisedSlot, JobLife, compare_advice
from dl2d.db.engine import session_scope
from dl2d.db.models import Allocation, Decision, Intent, IntentKind, Job, JobState

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_predicted_jcts_integrate_each_speed_over_the_slots_and_extrapolate():
    slots = [AdvisedSlot(i + 1, T0 + timedelta(seconds=100 * i), T0 + timedelta(seconds=100 * (i + 1)), "drf",
                         {7: (4, 0, 2.0, 1.0)}) for i in range(2)]
    life = JobLife(7, "j", "alice", T0 - timedelta(seconds=3600), 300.0, None, {1: (2, 0), 2: (4, 0)})
    row, total = compare_advice(slots, [life])
    # what ran: 1 epoch/s -> 200 epochs in the two slots, the last 100 at the last speed: done 300 s in;
    # advised: 2 epochs/s -> done 150 s in. Both from submission, an hour earlier.
    assert row["ran_jct_h"] == pytest.approx((3600 + 300) / 3600, abs=1e-4)
    assert row["advised_jct_h"] == pytest.approx((3600 + 150) / 3600, abs=1e-4)
    assert row["change_pct"] == pytest.approx(100 * (150 - 300) / 3900, abs=0.1)
    assert row["slots_advised_other"] == 1  # slot 1 ran 2 workers, the policy advised 4
    assert total["name"] == "all" and total["ran_jct_h"] == row["ran_jct_h"]
    never = compare_advice([AdvisedSlot(1, T0, T0 + timedelta(seconds=100), "drf", {7: (0, 0, 0.0, 1.0)})],
                           [JobLife(7, "j", "a", T0, 300.0, None, {})])
    assert never[0]["advised_jct_h"] is None and never[0]["change_pct"] is None  # the advice never runs it
    assert compare_advice(slots, [JobLife(7, "j", "a", T0, 300.0, None, {}, ran_before=True)]) == []


def test_advise_mode_refuses_online_learning_and_unknown_modes():
    with pytest.raises(ConfigError, match="policy.online_rl: online RL learns from the policy's own decisions"):
        build_config({"mode": "advise", "policy": {"name": "dl2", "online_rl": True, "allow_untrained": True}}, {})
    with pytest.raises(ConfigError, match="mode: must be one of enforce, advise, got 'shadow'"):
        build_config({"mode": "shadow"}, {})


def test_the_daemon_in_advise_mode_never_resizes_and_records_every_slot_of_advice(tmp_path):
    cfg = build_config({"state_dir": str(tmp_path), "mode": "advise", "slot_seconds": 60.0,
                        "sim": {"cluster": "tiny", "noise": 0.0}, "policy": {"name": "drf"},
                        "metrics": {"enabled": False}}, {})
    feeder = DemoFeeder(8, 3, world="today", slot_seconds=cfg.slot_seconds, cluster_gpus=demo_cluster_gpus(cfg))
    loop = build_loop(cfg, feeder)
    slots = loop.run(max_slots=3000, until_idle=lambda: feeder.exhausted() and loop.idle())
    assert loop.info["mode"] == "advise"
    with session_scope(loop.engine) as s:
        jobs = {j.id: j for j in s.scalars(select(Job))}
        assert len(jobs) == 8 and all(j.state == JobState.COMPLETED for j in jobs.values())
        kinds = {i.kind for i in s.scalars(select(Intent))}
        assert kinds == {IntentKind.SUBMIT}, kinds  # started at the size asked for, never resized
        asked = {j.id: int(j.spec.get("workers") or 1) for j in jobs.values()}
        for a in s.scalars(select(Allocation)):
            assert a.workers in (0, asked[a.job_id]), (a.job_id, a.workers, asked[a.job_id])
        decisions = list(s.scalars(select(Decision)))
        assert len(decisions) == slots and all(d.advice and d.advice["policy"] == "drf" for d in decisions)
        advised_other = sum(1 for d in decisions for e in d.advice["jobs"] if e[1] != asked[e[0]] and e[1] > 0)
        assert advised_other > 0  # DRF would have sized jobs differently from what they asked for
        for d in decisions:  # every active job of the slot is in its advice, with a speed at each size
            allocs = {a.job_id for a in d.slot.allocations}
            assert {e[0] for e in d.advice["jobs"]} == allocs
            assert all(e[3] >= 0 and e[4] >= 0 and (e[1] == 0) == (e[3] == 0) for e in d.advice["jobs"])

    r = CliRunner().invoke(cli, ["report", "--db", cfg.database_url, "--only", "advice", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["advice"]
    per_job, total = rows[:-1], rows[-1]
    assert sorted(x["job_id"] for x in per_job) == sorted(jobs) and total["name"] == "all"
    assert all(x["policy"] == "drf" and x["ran_jct_h"] and x["observed_jct_h"] for x in per_job)
    # a job DRF never sized otherwise is predicted the same under both
    for x in per_job:
        if x["slots_advised_other"] == 0:
            assert x["advised_jct_h"] == x["ran_jct_h"]
    assert any(x["change_pct"] not in (None, 0.0) for x in per_job)
    # the model's prediction of what ran tracks what was observed (noise 0: within the jobs' speed factors)
    ratio = total["ran_jct_h"] / total["observed_jct_h"]
    assert 0.5 < ratio < 2.0, total
    table = CliRunner().invoke(cli, ["report", "--db", cfg.database_url])
    assert table.exit_code == 0 and "advice: advise mode" in table.output
