"""Online RL in the daemon (DL2 section 4.2) on the simulated backend: the learner updates the policy from the
slots' rewards, the policy checkpoint is written every N slots and loads back, each decision records the
policy version it was made with, and a restarted daemon resumes from the saved policy."""
from __future__ import annotations

import jax
import numpy as np
from sqlalchemy import select

from dl2d.daemon.config import build_config
from dl2d.daemon.main import build_loop
from dl2d.db.engine import session_scope
from dl2d.db.jobs import submit_job
from dl2d.db.models import Decision, Slot
from dl2d.policy.checkpoint import Checkpoint, load, save
from dl2d.policy.dl2.config import PolicyConfig
from dl2d.policy.dl2.nets import init_params
from dl2d.workload.jobtypes import JOB_TYPES

# small networks and minibatch so that updates start after a couple of slots
TINY = PolicyConfig(max_jobs=8, hidden=32, minibatch=16, replay_size=1024, rl_lr=1e-3)
EVERY = 3


def leaves(params):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(params))]


def make_loop(tmp_path, ckpt):
    cfg = build_config({"state_dir": str(tmp_path / "state"), "sim": {"cluster": "small", "noise": 0.1, "seed": 1},
                        "metrics": {"enabled": False}, "guardrails": {"starve_slots": 10_000},
                        "policy": {"name": "dl2", "checkpoint": str(ckpt), "online_rl": True,
                                   "checkpoint_every": EVERY}}, {})
    return cfg, build_loop(cfg)


def decisions(engine):
    with session_scope(engine) as s:
        return s.execute(select(Slot.number, Decision.source, Decision.policy_version)
                         .join(Decision, Decision.slot_id == Slot.id).order_by(Slot.number)).all()


def test_online_rl_learns_checkpoints_and_resumes(tmp_path):
    ckpt = tmp_path / "tiny.msgpack"
    save(ckpt, Checkpoint(TINY, init_params(TINY, jax.random.PRNGKey(0))))
    initial = leaves(load(ckpt).params)

    cfg, loop = make_loop(tmp_path, ckpt)
    learner = loop.learner
    assert learner is not None and learner.learn and learner.version == 0
    with session_scope(loop.engine) as s:  # long jobs: all of them run through every slot of the test
        for i in range(12):
            t = JOB_TYPES[i % len(JOB_TYPES)]
            submit_job(s, {"name": f"rl{i}", "owner": "test", "job_type": t.name, "total_epochs": 1e5,
                           "command": "x", "worker": dict(zip(("gpus", "cpus", "mem_gb"), t.worker_demand)),
                           "ps": {"cpus": t.ps_demand[1], "mem_gb": t.ps_demand[2]}})
    saves = []  # (slots closed, version) at every checkpoint write
    real_save = learner.save

    def spy(path, meta=None):
        saves.append((loop._closed, learner.version))
        real_save(path, meta)

    learner.save = spy
    slots = 3 * EVERY
    assert loop.run(max_slots=slots) == slots

    # the parameters moved and stay finite
    after = leaves(learner.params)
    assert learner.stats.updates > 0 and learner.stats.transitions >= TINY.minibatch
    assert np.isfinite(learner.stats.last_loss)
    assert all(np.all(np.isfinite(a)) for a in after)
    assert any(not np.array_equal(a, b) for a, b in zip(initial, after))

    # one update per slot once the buffer holds a minibatch; a checkpoint every EVERY slots, and one at stop
    assert learner.version == learner.stats.updates
    periodic, final = saves[:-1], saves[-1]
    assert [n for n, _ in periodic] == [n for n in range(EVERY, slots + 1, EVERY) if n >= slots - learner.version + 1]
    assert periodic and [v for _, v in periodic] == sorted({v for _, v in periodic})  # versions increase
    assert final == (slots, learner.version)

    # the checkpoint on disk is the learner's policy
    ck = load(cfg.policy_save_path)
    assert ck.config == TINY and ck.meta["policy_version"] == learner.version and ck.meta["final"] is True
    assert all(np.array_equal(a, b) for a, b in zip(leaves(ck.params), after))
    assert ck.opt_state is not None

    # each decision is the policy's and records the version it was made with: 0 until the first update, then +1
    rows = decisions(loop.engine)
    assert [r.number for r in rows] == list(range(slots)) and {r.source for r in rows} == {"policy"}
    versions = [r.policy_version for r in rows]
    assert versions[0] == 0 and versions[-1] > 0
    assert all(b - a in (0, 1) for a, b in zip(versions, versions[1:]))
    assert versions[-1] == learner.version - 1  # the last slot's update came after its decision
    loop.engine.dispose()

    # restart: the daemon loads the saved online policy (not the original checkpoint) and continues from it
    _, loop2 = make_loop(tmp_path, ckpt)
    assert loop2.learner.version == learner.version
    assert all(np.array_equal(a, b) for a, b in zip(leaves(loop2.learner.params), after))
    assert loop2.run(max_slots=2) == 2
    rows = decisions(loop2.engine)
    assert [r.number for r in rows] == list(range(slots + 2))
    assert [r.policy_version for r in rows[slots:]][0] == learner.version
    assert all(np.all(np.isfinite(a)) for a in leaves(loop2.learner.params))
    loop2.engine.dispose()
