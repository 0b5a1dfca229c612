"""The target-size policy learning online in the daemon (dl2d.policy.target.online) on the simulated backend of
today's world: it updates from a small cluster's first slots, each decision records the version it was made
with, it saves at stop; and an online policy that starves the jobs is put back to its last good parameters,
with a `policy_revert` event saying why, and checkpointed at once."""
from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
from sqlalchemy import select

from dl2d.daemon.config import build_config
from dl2d.daemon.main import DemoFeeder, build_loop, demo_cluster_gpus
from dl2d.db.engine import session_scope
from dl2d.db.models import Decision, Event, EventKind, Slot
from dl2d.policy.checkpoint import TargetCheckpoint, load_target, save_target
from dl2d.policy.target.entry import pretrained
from dl2d.policy.target.online import OnlineTargetLearner, good_path


def leaves(params):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(params))]


def make_loop(tmp_path, jobs=8):
    cfg = build_config({"state_dir": str(tmp_path / "state"), "slot_seconds": 60.0,
                        "sim": {"cluster": "t4-16", "noise": 0.0}, "metrics": {"enabled": False},
                        "guardrails": {"starve_slots": 10_000},
                        "policy": {"name": "dl2-target", "online_rl": True, "online_window": 2,
                                   "checkpoint_every": 3}}, {})
    feeder = DemoFeeder(jobs, 0, world="today", slot_seconds=60.0, cluster_gpus=demo_cluster_gpus(cfg))
    return cfg, build_loop(cfg, feeder)


def versions(engine):
    with session_scope(engine) as s:
        return [r.policy_version for r in s.execute(select(Decision.policy_version).join(Slot, Decision.slot_id == Slot.id)
                                                    .order_by(Slot.number))]


def test_the_daemon_learns_online_from_a_small_cluster_and_saves_at_stop(tmp_path):
    cfg, loop = make_loop(tmp_path)
    learner = loop.learner
    assert isinstance(learner, OnlineTargetLearner) and learner.version == 0
    start = leaves(learner.params)
    assert loop.run(max_slots=8) == 8
    assert learner.stats.updates >= 2 and learner.stats.reverts == 0 and np.isfinite(learner.stats.last_loss)
    assert any(not np.array_equal(a, b) for a, b in zip(start, leaves(learner.params)))
    seen = [v for v in versions(loop.engine) if v is not None]
    assert seen[0] == 0 and seen[-1] >= 1 and all(b - a in (0, 1) for a, b in zip(seen, seen[1:]))
    ck = load_target(cfg.policy_save_path)  # the stop's save: the learning parameters, the good ones beside
    assert ck.meta["final"] is True and ck.meta["policy_version"] == learner.version
    assert all(np.array_equal(a, b) for a, b in zip(leaves(ck.params), leaves(learner.params)))
    assert load_target(good_path(cfg.policy_save_path)).meta["policy_version"] == learner.good_version
    loop.engine.dispose()


def test_a_starving_online_policy_is_reverted_recorded_and_saved(tmp_path):
    cfg, first = make_loop(tmp_path)
    first.engine.dispose()
    shipped = load_target(pretrained("today"))
    bad = jax.tree_util.tree_map(np.array, jax.device_get(shipped.params))
    bad["logits"]["kernel"][:] = 0.0
    bad["logits"]["bias"][:] = -1e3
    bad["logits"]["bias"][0] = 1e3  # every job: no workers
    save_target(cfg.policy_save_path, TargetCheckpoint(shipped.config, bad, {**shipped.meta, "policy_version": 7}))
    save_target(good_path(cfg.policy_save_path), TargetCheckpoint(shipped.config, shipped.params,
                                                                  {**shipped.meta, "policy_version": 4}))
    _, loop = make_loop(tmp_path)  # resumes the online checkpoint: the starving parameters, the shipped as good
    assert loop.learner.version == 7
    assert loop.run(max_slots=5) == 5
    with session_scope(loop.engine) as s:
        events = list(s.scalars(select(Event).where(Event.kind == EventKind.POLICY_REVERT)))
        assert len(events) == 1, [e.detail for e in events]
        detail = events[0].detail
        assert "below 80% of the fallback's" in detail["reason"] and "of the last good parameters'" in detail["reason"]
        assert detail["policy_version"] == 8 and detail["good_version"] == 4
        # the first two slots ran nothing new; from the third the reverted policy runs jobs
        rows = s.execute(select(Slot.number, Decision.policy_version).join(Decision, Decision.slot_id == Slot.id)
                         .order_by(Slot.number)).all()
    assert [v for _, v in rows][:3] == [7, 7, 8]
    assert loop.learner.stats.reverts == 1
    # slots 2-3 were decided by the good parameters themselves (not judged), then learned from (version 9)
    assert (loop.learner.good_version, loop.learner.version, loop.learner.stats.updates) == (4, 9, 1)
    assert all(np.array_equal(a, b) for a, b in zip(leaves(loop.learner.good_params), leaves(shipped.params)))
    assert load_target(cfg.policy_save_path).meta["policy_version"] == 9
    loop.engine.dispose()
    # what an admin sees: `dl2ctl daemon status` counts the reverts and gives the last one's reason
    r = subprocess.run([sys.executable, "-m", "dl2d.cli.main", "daemon", "status", "--state-dir", cfg.state_dir,
                        "--config", str(tmp_path / "none.toml"), "--json"], capture_output=True, text=True, timeout=60)
    db = json.loads(r.stdout)["database"]
    assert db["policy_reverts"] == 1 and db["last_policy_revert"]["reason"] == detail["reason"]
    assert db["last_policy_revert"]["good_version"] == 4  # the .good file's version


def test_the_configured_exploration_reaches_the_learner(tmp_path):
    cfg = build_config({"state_dir": str(tmp_path / "state"), "sim": {"cluster": "t4-16"},
                        "metrics": {"enabled": False},
                        "policy": {"name": "dl2-target", "online_rl": True, "online_explore": "resizing"}}, {})
    loop = build_loop(cfg, DemoFeeder(2, 0, world="today", slot_seconds=cfg.slot_seconds,
                                      cluster_gpus=demo_cluster_gpus(cfg)))
    assert loop.learner.explore == "resizing"
    loop.engine.dispose()
