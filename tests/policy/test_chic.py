"""Chic / Chic-Pair (dl2d.policy.seeds.chic): the cross-entropy method's pure pieces on hand-checked numbers, the
action semantics, capacity safety over random views, checkpoints, and a short training run that must improve."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl2d.core.contract import SlotView, validate
from dl2d.core.placement import place
from dl2d.policy.seeds import chic as CH
from dl2d.policy.seeds import chic_train as CT
from dl2d.sim.cluster import ClusterSpec, preset
from dl2d.sim.engine import SimConfig
from dl2d.sim.trace import TraceConfig, generate
from dl2d.workload.catalog import view_fields
from dl2d.workload.jobtypes import JOB_TYPES, MAX_EPOCHS

# ---------------------------------------------------------------- CEM arithmetic

def test_elite_threshold_and_mask_hand_checked():
    # N = 4 policy samples + the uniform one; sorted: -10 -7 -5 -3 -1; floor(0.7 * 4) = 2 -> xi = R_(2) = -7
    rets = [-10.0, -3.0, -7.0, -1.0, -5.0]
    xi = CT.elite_threshold(rets, rho=0.3, n=4)
    assert xi == -7.0
    assert CT.elite_mask(rets, xi).tolist() == [False, True, True, True, True]
    # N = 10 samples of 0..10 (11 with the uniform one): floor(0.7 * 10) = 7 -> R_(7) = 6 -> 5 elites
    r = np.arange(11.0)[::-1]
    assert CT.elite_threshold(r, 0.3, 10) == 6.0
    assert CT.elite_mask(r, 6.0).sum() == 5
    # rho = 1 keeps everything (index clamps to the smallest); ties at the threshold are elites
    assert CT.elite_threshold([3.0, 1.0, 2.0], 1.0) == 1.0
    assert CT.elite_mask([2.0, 2.0, 1.0], 2.0).tolist() == [True, True, False]


def test_smoothed_update_hand_checked():
    new = {"w": np.array([1.0, 2.0]), "b": np.array([0.0])}
    old = {"w": np.array([3.0, 6.0]), "b": np.array([4.0])}
    out = CT.smooth(new, old, alpha=0.25)
    np.testing.assert_allclose(out["w"], [2.5, 5.0])  # 0.25*1 + 0.75*3, 0.25*2 + 0.75*6
    np.testing.assert_allclose(out["b"], [3.0])
    np.testing.assert_allclose(CT.smooth(new, old, 1.0)["w"], new["w"])


def test_gaussian_cem_mean_std_update_hand_checked():
    samples = np.array([[0.0, 10.0], [1.0, 20.0], [2.0, 30.0], [3.0, 40.0]])
    scores = [0.0, 3.0, 1.0, 2.0]  # best two: rows 1 and 3
    mu, sd = CT.gaussian_cem_update(np.zeros(2), np.ones(2), samples, scores, rho=0.5, alpha=0.5, noise_floor=0.0)
    np.testing.assert_allclose(mu, [0.5 * 2.0, 0.5 * 30.0])  # elite means 2 and 30, smoothed with the old 0
    np.testing.assert_allclose(sd, [0.5 * 1.0 + 0.5, 0.5 * 10.0 + 0.5])  # elite stds 1 and 10
    # identical elites: the std collapses to 0 and is held at the noise floor
    mu, sd = CT.gaussian_cem_update(np.zeros(1), np.ones(1), np.ones((3, 1)), [1, 2, 3], 0.5, 1.0, 0.05)
    assert mu.tolist() == [1.0] and sd.tolist() == [0.05]


def test_fit_elites_raises_the_likelihood_of_elite_actions():
    cfg = CH.ChicConfig(num_jobs=2, hidden=(16, 8), fit_steps=40, fit_batch=64, dropout=0.0)
    params = CH.init_params(cfg, 1)
    rng = np.random.default_rng(0)
    states = rng.uniform(0, 1, (64, cfg.state_dim))
    masks = np.ones((64, cfg.num_actions), bool)
    actions = (states[:, 0] > 0.5).astype(int) * 3  # a learnable rule: action 0 or 3
    before = CT.log_likelihood(cfg, params, states, masks, actions)
    fitted, losses = CT.fit_elites(cfg, params, states, masks, actions, seed=0)
    after = CT.log_likelihood(cfg, fitted, states, masks, actions)
    assert before < -1.4  # about log(1/5) for a near-uniform start
    assert after > before + 0.5, (before, after)
    assert losses[-1] < losses[0]


# ---------------------------------------------------------------- reward, state, actions

def test_time_in_system_sums_to_total_jct():
    arrival, finish = np.array([0, 1]), np.array([2.5, 3.0])
    per_slot = [CH.time_in_system(arrival, finish, s) for s in range(4)]
    assert per_slot == [1.0, 2.0, 1.5, 0.0]
    assert sum(per_slot) == pytest.approx(np.sum(finish - arrival))


def test_r3_penalty_sequence():
    assert CH.r3_change(0, 0, 1, 0, 1.0) == -1.0  # first task (a worker only)
    assert CH.r3_change(1, 0, 1, 1, 1.0) == 1.0  # now has both
    assert CH.r3_change(1, 1, 2, 1, 1.0) == 0.0
    assert CH.r3_change(0, 0, 1, 1, 1.0) == 0.0  # a pair at once: -p2 + p2


def test_encode_state_layout():
    cfg = CH.ChicConfig(num_jobs=3, max_workers=4, max_ps=8)
    s = CH.encode_state(cfg, [2, 0], [MAX_EPOCHS / 2, 30.0], [1, 2], [4, 0], backlog=5)
    assert s.shape == (cfg.state_dim,) == (3 * (CH.NUM_TYPES + 3) + 1,)
    rows = s[:-1].reshape(3, -1)
    assert CH.NUM_TYPES == 15  # every model of the catalog (DL2's eight, six all-reduce) and one unseen class
    assert rows[0, 2] == 1 and rows[0, :CH.NUM_TYPES].sum() == 1
    np.testing.assert_allclose(rows[0, CH.NUM_TYPES:], [0.5, 0.25, 0.5])
    assert not rows[2].any()  # empty row
    assert s[-1] == pytest.approx(np.log1p(5))
    pair = CH.ChicConfig(num_jobs=3, pair=True)
    assert CH.encode_state(pair, [1], [10.0], [1], [1], 0).shape == (3 * (CH.NUM_TYPES + 2) + 1,)
    with pytest.raises(ValueError):
        CH.encode_state(cfg, [0] * 4, [1.0] * 4, [0] * 4, [0] * 4, 0)


def test_action_space_sizes_and_decoding():
    chic, pair = CH.ChicConfig(num_jobs=3), CH.ChicConfig(num_jobs=3, pair=True)
    assert chic.num_actions == 7 and pair.num_actions == 4
    assert [CH.decode_action(chic, a) for a in range(7)] == [
        (0, "worker"), (0, "ps"), (1, "worker"), (1, "ps"), (2, "worker"), (2, "ps"), None]
    assert [CH.decode_action(pair, a) for a in range(4)] == [(0, "bundle"), (1, "bundle"), (2, "bundle"), None]
    with pytest.raises(ValueError):
        CH.decode_action(pair, 4)


def test_condition_2_on_a_hand_made_speed_table():
    speed = np.zeros((4, 4))
    speed[1:, 1:] = [[1, 2, 2], [1.5, 2, 2], [1.5, 2, 2]]  # [p, w]
    assert CH.can_improve(speed, 0, 0, False, 3, 3)  # nothing yet: always
    assert CH.can_improve(speed, 1, 1, False, 3, 3)  # +worker 1 -> 2
    assert not CH.can_improve(speed, 2, 1, False, 3, 3)  # +worker 2 -> 2, +ps 2 -> 2: Condition (2)
    assert CH.can_improve(speed, 1, 1, True, 3, 3)  # pair: (2,2) = 2 > 1
    assert not CH.can_improve(speed, 2, 2, True, 3, 3)
    assert not CH.can_improve(speed, 1, 1, False, 1, 1)  # at the per-job limits


def test_condition_2_for_an_allreduce_job_reads_workers_only():
    speed = np.zeros((2, 5))
    speed[0, 1:] = [1.0, 1.8, 2.0, 2.0]  # [PS = 0, workers]
    assert CH.can_improve(speed, 0, 0, False, 4, 1, allreduce=True)  # no worker yet
    assert CH.can_improve(speed, 2, 0, False, 4, 1, allreduce=True)  # 2 -> 3 still faster
    assert not CH.can_improve(speed, 3, 0, True, 4, 1, allreduce=True)  # 3 -> 4: no gain, pair or not
    assert not CH.can_improve(speed, 4, 0, False, 4, 1, allreduce=True)  # at the limit
    assert CH.r3_change(0, 0, 1, 0, 1.0, allreduce=True) == 0.0  # its first worker is all it needs


# ---------------------------------------------------------------- the scheduler on random views

def make_view(types, free_frac, servers, max_w, max_p, seed=0) -> SlotView:
    n = len(types)
    rng = np.random.default_rng(seed)
    cap = ClusterSpec(servers).empty()
    free = np.floor(cap * np.asarray(free_frac)[:, None])
    est = rng.uniform(5, 100, n)
    return SlotView(slot=3, job_ids=np.arange(n) * 2 + 1, type_idx=np.asarray(types, int), arrival_slot=np.arange(n),
                    slots_run=np.zeros(n, int), epochs_done=est * rng.uniform(0, 0.9, n), est_epochs=est,
                    prev_workers=np.zeros(n, int), prev_ps=np.zeros(n, int), free=free, capacity=cap,
                    max_workers=max_w, max_ps=max_p, **view_fields(types, max_p, max_w))


views = st.integers(1, 5).flatmap(lambda servers: st.tuples(
    st.lists(st.integers(0, len(JOB_TYPES) - 1), min_size=0, max_size=7),
    st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=servers, max_size=servers),
    st.just(servers), st.integers(1, 4), st.integers(1, 4), st.integers(0, 10_000)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(views, st.integers(1, 4), st.booleans(), st.sampled_from([CH.SAMPLE, CH.UNIFORM, CH.GREEDY]))
def test_capacity_never_exceeded_and_pairs_stay_pairs(v, num_jobs, pair, mode):
    types, free_frac, servers, max_w, max_p, seed = v
    view = make_view(types, free_frac, servers, max_w, max_p, seed)
    cfg = CH.ChicConfig(pair=pair, num_jobs=num_jobs, max_workers=max_w, max_ps=max_p, hidden=(8,))
    sched = CH.ChicScheduler(cfg, CH.init_params(cfg, seed), mode=mode, seed=seed, record=True)
    alloc = sched(view)
    validate(view, alloc)
    usage, w, p = place(view, alloc)  # raises CapacityError on any server overflow
    assert np.all(usage <= view.free + 1e-9)
    assert np.array_equal(w, alloc.workers) and np.array_equal(p, alloc.ps)
    assert not alloc.workers[num_jobs:].any() and not alloc.ps[num_jobs:].any()  # beyond the first I: nothing
    adds = sum(a != cfg.void for a in sched.trajectory.actions)
    if pair:
        assert np.array_equal(alloc.workers, alloc.ps)
        assert adds == alloc.workers.sum()  # each non-void action = exactly one worker and one PS
    else:
        assert adds == alloc.workers.sum() + alloc.ps.sum()  # each = exactly one task


def test_pair_action_adds_one_worker_and_one_ps():
    view = make_view([0, 1, 2], [1.0, 1.0], 2, 4, 4)
    cfg = CH.ChicConfig(pair=True, num_jobs=3, max_workers=4, max_ps=4)
    sched = CH.ChicScheduler(cfg, CH.init_params(cfg), record=True)
    from dl2d.policy.baselines.heuristics import AllocationBuilder
    b = AllocationBuilder(view)
    for a in (1, 1, 0):
        before = [(b.workers(j), b.ps(j)) for j in range(3)]
        mask = sched._mask(view, b, 3)
        assert mask[a]
        j, kind = CH.decode_action(cfg, a)
        assert b.add(j, kind)
        after = [(b.workers(k), b.ps(k)) for k in range(3)]
        assert [(x[0] - y[0], x[1] - y[1]) for x, y in zip(after, before)] == [
            (1, 1) if k == a else (0, 0) for k in range(3)]


def test_void_is_masked_until_some_job_can_train():
    view = make_view([0, 1], [1.0], 1, 4, 4)
    cfg = CH.ChicConfig(num_jobs=2, max_workers=4, max_ps=4)
    sched = CH.ChicScheduler(cfg, CH.init_params(cfg))
    from dl2d.policy.baselines.heuristics import AllocationBuilder
    b = AllocationBuilder(view)
    assert not sched._mask(view, b, 2)[cfg.void]
    b.add(0, "worker")
    assert not sched._mask(view, b, 2)[cfg.void]
    b.add(0, "ps")
    assert sched._mask(view, b, 2)[cfg.void]


def test_schedule_kept_until_the_first_I_jobs_change():
    view = make_view([0, 1, 3], [1.0] * 3, 3, 4, 4)
    cfg = CH.ChicConfig(num_jobs=2, max_workers=4, max_ps=4)
    sched = CH.ChicScheduler(cfg, CH.init_params(cfg, 3), mode=CH.SAMPLE, seed=1)
    a1 = sched(view)
    a2 = sched(replace(view, slot=4))  # same first I jobs: same schedule, no new decision phase
    assert sched.trajectory.decisions == 1
    assert a1.worker_servers == a2.worker_servers and a1.ps_servers == a2.ps_servers
    sched(view.subset(np.arange(1, len(view))))
    assert sched.trajectory.decisions == 2


def test_unmasked_mode_punishes_actions_on_missing_jobs():
    view = make_view([0], [1.0], 1, 2, 2)
    cfg = CH.ChicConfig(num_jobs=3, max_workers=2, max_ps=2, mask_invalid=False, p1=5.0)
    sched = CH.ChicScheduler(cfg, CH.init_params(cfg, 0), mode=CH.UNIFORM, seed=0, record=True)
    alloc = sched(view)
    missing = sum(1 for a in sched.trajectory.actions if a != cfg.void and CH.decode_action(cfg, a)[0] >= 1)
    assert missing > 0  # uniform over 7 actions hits rows 1, 2 (no job there)
    r3 = -cfg.p2 * int((alloc.workers[0] > 0) != (alloc.ps[0] > 0))
    invalid = sum(1 for a in sched.trajectory.actions if a != cfg.void and not (
        CH.decode_action(cfg, a)[0] == 0))
    assert sched.trajectory.penalty <= -cfg.p1 * invalid + r3 + 1e-9


# ---------------------------------------------------------------- checkpoints

def test_checkpoint_round_trip(tmp_path):
    cfg = CH.ChicConfig(pair=True, num_jobs=4, hidden=(16, 8))
    params = CH.init_params(cfg, 7)
    path = tmp_path / "c.npz"
    CH.save_checkpoint(path, cfg, params, {"note": "x"})
    cfg2, params2, meta = CH.load_checkpoint(path)
    assert cfg2 == cfg and meta == {"note": "x"}
    assert set(params2) == set(params)
    for k in params:
        np.testing.assert_array_equal(params2[k], params[k])
    sched = CH.load_scheduler(path)
    assert sched.name == "chic-pair" and sched.mode == CH.GREEDY


def test_bad_checkpoints_rejected(tmp_path):
    cfg = CH.ChicConfig(num_jobs=2, hidden=(8,))
    with pytest.raises(CH.ChicCheckpointError, match="no such"):
        CH.load_checkpoint(tmp_path / "missing.npz")
    (tmp_path / "garbage.npz").write_bytes(b"not a zip at all")
    with pytest.raises(CH.ChicCheckpointError, match="unreadable"):
        CH.load_checkpoint(tmp_path / "garbage.npz")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(CH.ChicCheckpointError, match="format"):
        CH.load_checkpoint(tmp_path / "other.npz")
    good = tmp_path / "good.npz"
    CH.save_checkpoint(good, cfg, CH.init_params(cfg))
    doc = dict(np.load(good))
    np.savez(tmp_path / "v9.npz", **{**doc, "version": np.array(9)})
    with pytest.raises(CH.ChicCheckpointError, match="version 9"):
        CH.load_checkpoint(tmp_path / "v9.npz")
    np.savez(tmp_path / "shape.npz", **{**doc, "param/w0": np.zeros((3, 3))})
    with pytest.raises(CH.ChicCheckpointError, match="shape"):
        CH.load_checkpoint(tmp_path / "shape.npz")
    np.savez(tmp_path / "cfg.npz", **{**doc, "config": np.array('{"num_jobs": 0}')})
    with pytest.raises(CH.ChicCheckpointError, match="config"):
        CH.load_checkpoint(tmp_path / "cfg.npz")
    np.savez(tmp_path / "miss.npz", **{k: v for k, v in doc.items() if k != "param/b0"})
    with pytest.raises(CH.ChicCheckpointError, match="b0 missing"):
        CH.load_checkpoint(tmp_path / "miss.npz")


# ---------------------------------------------------------------- a short training run

def test_short_training_improves_the_cem_objective():
    """Chic-Pair on 6 short jobs and 4 servers: 5 iterations of 10 episodes. Measured (seeds 0-2, Chic-Pair
    and Chic): the mean return of the sampled episodes rises by 35-48% from iteration 1 to 5."""
    sim = SimConfig(cluster=preset("tiny"), max_workers=4, max_ps=4, max_slots=400)
    tr = generate(TraceConfig(num_jobs=6, max_arrivals_per_slot=3, arrival_pattern="uniform"), seed=3)
    tr = replace(tr, est_epochs=np.minimum(tr.est_epochs, 20.0), true_epochs=np.minimum(tr.true_epochs, 20.0))
    cfg = CH.ChicConfig(pair=True, num_jobs=3, max_workers=4, max_ps=4, episodes=10, fit_steps=60, fit_batch=128,
                        hidden=(32, 16), alpha=1.0, lr=0.02, dropout=0.0)
    res = CT.train(cfg, [tr], sim, iterations=5, seed=0)
    rets = [h.mean_return for h in res.history]
    assert rets[-1] > rets[0] + 0.2 * abs(rets[0]), rets
    assert res.history[-1].xi > res.history[0].xi  # the elite level rises too
