"""Online learning of the target-size policy (dl2d.policy.target.online): the revert rule's score and verdict,
a window's arrays, an update from the simulator's slots, the checkpoint round trip, and a revert."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from dl2d.core.contract import Allocation
from dl2d.policy import registry
from dl2d.policy.target import train as TT
from dl2d.policy.checkpoint import load_target
from dl2d.policy.registry import PolicyOptions
from dl2d.policy.target.online import (
    OnlineTargetLearner,
    RevertRule,
    _Slot,
    good_path,
    slot_score,
    window_batch,
)
from dl2d.sim import engine as E

SETUP = TT.TrainSetup(jobs=12)
CFG = TT.sim_config(SETUP)


def leaves(params):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(params))]


def views(n_slots: int, seed: int = 3):
    """The first ``n_slots`` views of a 12-job trace of today's world, under Optimus."""
    trace = TT.make_trace(SETUP, CFG, seed)
    out = []
    optimus = registry.build("optimus")

    def sched(v):
        out.append(v)
        return optimus(v)

    E.run(trace, sched, CFG, seed=seed)
    return out[:n_slots]


def learner(window=2, **kw) -> OnlineTargetLearner:
    return registry.build("dl2-target", PolicyOptions(online_rl=True, online_window=window, **kw))


def drive(lrn, vs):
    """Decide every view in turn, each carried out as chosen, closing the slot after it."""
    for v in vs:
        a = lrn(v)
        lrn.applied(v, a, overridden=False)
        lrn.observe(0.0)


def test_slot_score_is_the_share_of_remaining_work_trained_capped_at_one():
    v = views(8)[-1]
    assert len(v) >= 2
    none = Allocation(np.zeros(len(v), int), np.zeros(len(v), int))
    assert slot_score(v, none) == 0.0
    one = Allocation(np.ones(len(v), int), np.zeros(len(v), int))
    share = v.est_speed[:, 0, 1] * v.slot_seconds / v.remaining_epochs
    assert slot_score(v, one) == pytest.approx(float(np.minimum(share, 1).sum()), rel=1e-6)
    assert 0 < slot_score(v, one) <= len(v)


def test_revert_rule_fails_a_window_clearly_below_the_fallback_and_the_good_parameters():
    rule = RevertRule(0.2)
    assert rule.verdict([1.0, 1.0], [1.0, 1.2], [3.0, 3.0]) is None  # 2.0 >= 0.8 * 2.2
    assert rule.verdict([0.5, 0.5], [1.0, 1.0], [0.6, 0.6]) is None  # the good ones score as low: no use
    why = rule.verdict([0.5, 0.5], [1.0, 1.0], [1.0, 1.5])
    assert why == ("the learning policy's score over 2 slots was 1, below 80% of the fallback's 2 and of the last "
                   "good parameters' 2.5 on the same views")
    assert rule.verdict([0.0], [0.0], [1.0]) is None  # the fallback gains nothing either: no verdict
    with pytest.raises(ValueError, match="revert margin must be in"):
        RevertRule(1.0)


def test_window_batch_charges_each_present_job_and_ends_the_episode_of_a_job_that_left():
    def slot(ids):
        n = len(ids)
        return _Slot(np.array(ids), np.ones((n, 3), np.float32), np.ones(n, bool), np.ones(n, bool),
                     np.zeros(n, int), np.zeros(n, np.float32), np.full(n, -0.5, np.float32),
                     Allocation(np.ones(n, int), np.zeros(n, int)), 1.0, 1.0, np.nan)

    b, last = window_batch([slot([7, 9]), slot([9, 11])], {11: -0.25, 12: -9.0}, reward_jobs=4, features=3)
    # columns: 7, 9, 11 (sorted), padded to 64 rows
    assert b["x"].shape == (2, 64, 3) and b["active"][:, :4].tolist() == [[True, True, False, False],
                                                                         [False, True, True, False]]
    assert b["reward"][0, :3].tolist() == [-0.25, -0.25, 0.0]
    assert b["done"][:, :3].tolist() == [[True, False, False], [False, True, False]]  # 7 left after slot 0, 9 after 1
    assert last[:4].tolist() == [0.0, 0.0, -0.25, 0.0]  # 12 was not in the window


def test_the_learner_updates_from_live_slots_saves_and_resumes(tmp_path):
    lrn = learner(window=2)
    assert lrn.kinds == ("allreduce",) and lrn.version == 0 and lrn.reward_jobs == 40
    before = leaves(lrn.params)
    drive(lrn, views(7))
    # windows closed at slots 2, 4, 6 (each judged, then learned from): three updates, no revert
    assert (lrn.stats.updates, lrn.stats.reverts, lrn.version) == (3, 0, 3)
    assert np.isfinite(lrn.stats.last_loss) and lrn.stats.transitions > 0
    after = leaves(lrn.params)
    assert all(np.all(np.isfinite(a)) for a in after)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))
    # slots 0-1 were decided by the starting (good) parameters: not judged; 2-3 and 4-5 passed
    assert lrn.good_version == 2

    path = tmp_path / "online.msgpack"
    lrn.save(path, {"final": True})
    ck, good = load_target(path), load_target(good_path(path))
    assert ck.meta["policy_version"] == 3 and ck.meta["good_version"] == 2 and ck.meta["final"] is True
    assert ck.meta["world"] == "today"  # the trained checkpoint's meta is kept (its kinds come from it)
    assert good.meta["policy_version"] == 2
    assert all(np.array_equal(a, b) for a, b in zip(leaves(ck.params), after))
    again = registry.build("dl2-target", PolicyOptions(online_rl=True, resume=str(path)))
    assert again.version == 3 and again.good_version == 2  # the good parameters and their version, resumed
    assert all(np.array_equal(a, b) for a, b in zip(leaves(again.params), after))
    assert all(np.array_equal(a, b) for a, b in zip(leaves(again.good_params), leaves(good.params)))


def starving(params):
    """Parameters whose every job's pair is (0 workers, first PS level): every job waits."""
    p = jax.tree_util.tree_map(np.array, jax.device_get(params))
    p["logits"]["kernel"][:] = 0.0
    p["logits"]["bias"][:] = -1e3
    p["logits"]["bias"][0] = 1e3
    return p


def test_parameters_that_starve_the_jobs_are_reverted_to_the_last_good_ones():
    trained = learner(window=2)
    lrn = OnlineTargetLearner(trained.cfg, starving(trained.params), good_params=trained.params,
                              fallback=registry.build("drf"), window=2, kinds=trained.kinds, version=5)
    vs = views(4)
    drive(lrn, vs[:2])
    assert lrn.take_reverts() == [] and lrn.stats.reverts == 0
    starved = lrn(vs[2])  # the window of slots 0-1 closes first: judged, reverted; then slot 2 is decided
    reverts = lrn.take_reverts()
    assert lrn.stats.reverts == 1 and len(reverts) == 1 and lrn.take_reverts() == []
    assert "below 80% of the fallback's" in reverts[0]["reason"] and reverts[0]["slots"] == 2
    assert (reverts[0]["good_version"], reverts[0]["policy_version"], lrn.version) == (5, 6, 6)
    assert lrn.stats.updates == 0  # a failed window is not learned from
    assert all(np.array_equal(a, b) for a, b in zip(leaves(lrn.params), leaves(trained.params)))
    assert starved.workers.sum() > 0  # the reverted policy runs the jobs again
    starving_alloc = OnlineTargetLearner(trained.cfg, starving(trained.params), fallback=registry.build("drf"),
                                         kinds=trained.kinds)(vs[2])
    assert starving_alloc.workers.sum() == 0


def test_a_low_temperature_samples_the_greedy_pair_and_learns_that_distribution():
    vs = views(4)
    greedy = registry.build("dl2-target")
    cold = learner(window=2, online_temperature=0.05)
    warm = learner(window=2, online_temperature=1.0)
    assert cold.pcfg.temperature == 0.05 and warm.pcfg.temperature == 1.0
    for v in vs:
        want = greedy(v)
        got = cold(v)
        warm(v)
        assert np.array_equal(got.workers, want.workers) and np.array_equal(got.ps, want.ps)
        assert np.all(cold._pending.log_prob > -1e-3)  # the greedy pair is all but certain at this temperature
        assert np.all(warm._pending.log_prob <= cold._pending.log_prob + 1e-6)
        cold.observe(0.0)
        warm.observe(0.0)
    with pytest.raises(ValueError, match="temperature must be in"):
        learner(online_temperature=0.0)


def test_exploring_only_where_jobs_resize_keeps_every_held_pair_and_learns_only_from_the_others():
    """explore="resizing": a running job whose greedy pair is what it holds keeps it (no restart to explore,
    nothing learned); the jobs that start or resize anyway sample. At a hot temperature "every" moves held jobs."""
    import dataclasses

    greedy = registry.build("dl2-target")
    held = 0
    for v in views(6)[2:]:
        g = greedy(v)
        v = dataclasses.replace(v, prev_workers=np.asarray(g.workers), prev_ps=np.asarray(g.ps))
        want = greedy(v)  # the greedy pairs once the jobs hold them (the keep rule and the fill may still move some)
        keeps = (want.workers == v.prev_workers) & (want.ps == v.prev_ps) & (v.prev_workers > 0)
        lrn = learner(window=2, online_temperature=10.0, online_explore="resizing", seed=held)
        got = lrn(v)
        assert np.array_equal(got.workers[keeps], v.prev_workers[keeps])
        assert not lrn._pending.learn[keeps].any() and lrn._pending.learn[~keeps].all()
        held += int(keeps.sum())
        every = learner(window=2, online_temperature=10.0, online_explore="every", seed=held)(v)
        assert not np.array_equal(every.workers[keeps], v.prev_workers[keeps])  # hot sampling moves some of them
    assert held > 0
    with pytest.raises(ValueError, match="explore must be one of every, resizing"):
        learner(online_explore="some")
