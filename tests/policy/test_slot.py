"""The jitted slot loop: encoding, masking, the slow reference loop, teacher replay, job-aware exploration."""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit.policy import CFG, SIM, tiny_trace
from testkit.policy_reference import reference_window

from dl2d.core.placement import place
from dl2d.policy.dl2.scheduler import decide
from dl2d.policy.dl2.slot import (
    GREEDY,
    SAMPLE,
    TEACHER,
    action_mask,
    apply_action,
    encode,
    job_features,
    pad_window,
    poor_state_action,
    run_window,
    starting_bundles,
)
from dl2d.policy.dl2.train import make_teacher
from dl2d.sim import engine as E
from dl2d.sim.cluster import ClusterSpec
from dl2d.workload.jobtypes import PS_DEMAND, WORKER_DEMAND

CAP = SIM.cluster.empty()  # 4 servers x (2 GPU, 8 CPU, 48 GB)
_mask = jax.jit(partial(action_mask, CFG))
_apply = jax.jit(partial(apply_action, CFG))


def window(types, free=None, w0=None, u0=None, seed=0, cap=CAP, worker_demand=None, ps_demand=None):
    """A window of jobs of `types`, asking for their types' default demands unless told otherwise."""
    rng = np.random.default_rng(seed)
    n = len(types)
    wd = WORKER_DEMAND[np.asarray(types, int)] if worker_demand is None else worker_demand
    pd = PS_DEMAND[np.asarray(types, int)] if ps_demand is None else ps_demand
    return pad_window(CFG, np.asarray(types), rng.integers(0, 50, n), rng.uniform(1, 300, n),
                      cap.copy() if free is None else free, cap, w0, u0, worker_demand=wd, ps_demand=pd)


# ---------------------------------------------------------------- encoding


def test_encoding_shapes_one_hot_padding_and_dominant_share(cfg):
    types = [0, 5, 7]
    win = window(types)
    w = jnp.array([2, 1, 0, 0, 0, 0, 0, 0], jnp.int32)
    u = jnp.array([1, 3, 0, 0, 0, 0, 0, 0], jnp.int32)
    f = np.asarray(job_features(cfg, win, w, u))
    x = np.asarray(encode(cfg, win, w, u))
    F, L = cfg.features_per_job, cfg.num_types
    assert f.shape == (cfg.max_jobs, F) and F == L + 5
    assert x.shape == (cfg.max_jobs * F,) == (cfg.state_dim,)
    np.testing.assert_array_equal(x, f.reshape(-1))
    # one-hot type of every real job, zero rows for padding
    np.testing.assert_array_equal(f[:3, :L], np.eye(L)[types])
    assert not f[3:].any()
    # d, e, w, u scaled as documented
    np.testing.assert_allclose(f[:3, L], np.asarray(win.slots_run)[:3] / cfg.slots_scale, rtol=1e-6)
    np.testing.assert_allclose(f[:3, L + 1], np.asarray(win.remaining)[:3] / cfg.epochs_scale, rtol=1e-6)
    np.testing.assert_allclose(f[:3, L + 3], [2 / cfg.max_workers, 1 / cfg.max_workers, 0])
    np.testing.assert_allclose(f[:3, L + 4], [1 / cfg.max_ps, 3 / cfg.max_ps, 0])
    # r = dominant share of the cluster's total capacity (times J)
    total = CAP.sum(axis=0)
    for j, t in enumerate(types):
        used = int(w[j]) * WORKER_DEMAND[t] + int(u[j]) * PS_DEMAND[t]
        assert f[j, L + 2] == pytest.approx(np.max(used / total) * cfg.max_jobs, rel=1e-6)
    # job 0: 2 GPUs of 8 = 0.25 is dominant (CPU 6/32, mem 20/192); job 1 (no GPU): CPU 8/32 = 0.25
    assert f[0, L + 2] == pytest.approx(0.25 * cfg.max_jobs)
    assert f[1, L + 2] == pytest.approx(0.25 * cfg.max_jobs)
    assert f[2, L + 2] == 0


# ---------------------------------------------------------------- masking

free_st = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 8), st.integers(0, 48)), min_size=4, max_size=4)


@settings(max_examples=40, deadline=None)
@given(types=st.lists(st.integers(0, 7), min_size=0, max_size=8), free=free_st,
       limits=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=8, max_size=8),
       seed=st.integers(0, 2**31 - 1), epsilon=st.sampled_from([0.0, 0.5, 1.0]))
def test_mask_only_allows_what_fits_and_sampled_actions_are_allowed(cfg, params, types, free, limits, seed, epsilon):
    n = len(types)
    free = np.array(free, float)
    w0 = np.array([l[0] for l in limits[:n]], int)
    u0 = np.array([l[1] for l in limits[:n]], int)
    win = window(types, free, w0, u0, seed=seed)
    mask = np.asarray(_mask(win, win.w0, win.u0, win.free))
    assert mask[-1], "void is always allowed"
    assert not mask[3 * n: -1].any(), "padding jobs have no actions"
    for a in np.flatnonzero(mask[:-1]):
        w, u, f, sw, sp = _apply(win, win.w0, win.u0, win.free, jnp.int32(a))
        assert np.all(np.asarray(f) >= -1e-5), f"action {a} overflows a server"
        j, kind = divmod(int(a), 3)
        assert int(w[j]) <= cfg.max_workers and int(u[j]) <= cfg.max_ps
        assert (int(sw) >= 0) == (kind != 1) and (int(sp) >= 0) == (kind != 0)
    # the whole loop in sampling mode (with exploration): every action allowed by its recorded mask
    out = jax.device_get(run_window(cfg, params, jax.random.PRNGKey(seed), win, mode=SAMPLE, epsilon=epsilon))
    k = int(out.n_steps)
    assert 1 <= k <= cfg.max_steps
    assert out.actions[k - 1] == cfg.num_actions - 1, "the window ends on void"
    assert np.all(out.masks[np.arange(k), out.actions[:k]])
    assert np.all(out.free >= -1e-5)
    assert np.all(out.workers <= cfg.max_workers) and np.all(out.ps <= cfg.max_ps)
    assert np.all(out.workers[:n] >= w0) and not out.workers[n:].any() and not out.ps[n:].any()
    # the free resources account for exactly the tasks added
    added = ((out.workers[:n] - w0)[:, None] * WORKER_DEMAND[types] + (out.ps[:n] - u0)[:, None] * PS_DEMAND[types])
    np.testing.assert_allclose(free.sum(0) - out.free.sum(0), added.sum(0), atol=1e-4)
    # once it stops, nothing more fits (void is the only action left) unless it chose to stop
    final = np.asarray(_mask(win, out.workers, out.ps, out.free))
    assert final[-1]


def test_nothing_fits_only_void(cfg, params):
    full = np.zeros_like(CAP)
    win = window([0, 3, 5], full)
    mask = np.asarray(_mask(win, win.w0, win.u0, win.free))
    assert mask[-1] and mask.sum() == 1
    out = jax.device_get(run_window(cfg, params, jax.random.PRNGKey(0), win, mode=SAMPLE))
    assert int(out.n_steps) == 1 and out.actions[0] == cfg.num_actions - 1
    assert not out.workers.any() and not out.ps.any()
    # one CPU core free everywhere: not even a PS (2 cores) fits
    win = window([0, 3, 5], np.tile([2.0, 1.0, 48.0], (4, 1)))
    assert np.asarray(_mask(win, win.w0, win.u0, win.free)).sum() == 1
    # all jobs at their limits on an empty cluster
    win = window([0, 1], None, [cfg.max_workers] * 2, [cfg.max_ps] * 2)
    assert np.asarray(_mask(win, win.w0, win.u0, win.free)).sum() == 1


def test_engine_accepts_sampled_allocations_over_several_windows(cfg, params, sim):
    """20 jobs in windows of 8 on the tiny cluster, sampling with exploration: every slot is placeable."""
    trace = tiny_trace(20, seed=3)
    rng = np.random.default_rng(0)
    state = E.replace(E.SimState.initial(len(trace)), slot=0)
    key = jax.random.PRNGKey(0)
    windows = 0
    for _ in range(6):
        view = E.view_of(trace, state, sim)
        key, sub = jax.random.split(key)
        d = decide(cfg, params, sub, view, mode=SAMPLE, epsilon=0.5, record=True)
        windows = max(windows, len(d.records))
        a = d.allocation
        assert np.all(a.workers <= cfg.max_workers) and np.all(a.ps <= cfg.max_ps)
        assert [len(s) for s in a.worker_servers] == list(a.workers)
        usage, w, p = place(view, a)  # raises CapacityError on any overflow
        np.testing.assert_array_equal(w, a.workers)
        assert np.all(usage <= view.capacity + 1e-6)
        state, _, info = E.step(trace, state, a, sim, rng)
        assert info["unplaced"] == 0
    assert windows >= 2


# ---------------------------------------------------------------- the reference loop


@pytest.mark.parametrize("mode,epsilon,seed", [(GREEDY, 0.0, 0), (SAMPLE, 0.0, 1), (SAMPLE, 0.0, 2),
                                               (SAMPLE, 0.5, 3)])
def test_jitted_loop_matches_slow_reference(cfg, mode, epsilon, seed):
    from dl2d.policy.dl2.nets import init_params

    rng = np.random.default_rng(seed)
    params = init_params(cfg, jax.random.PRNGKey(100 + seed))
    # discourage the void action so that windows run for many steps
    params["policy"]["out"]["bias"] = params["policy"]["out"]["bias"].at[-1].set(-3.0)
    types = rng.integers(0, 8, 5)
    cap = np.tile([4.0, 24.0, 128.0], (4, 1))  # same shape as the tiny cluster, roomier servers
    free = cap.copy()
    free[1] -= [1, 4, 16]  # uneven servers so that placement choices matter
    w0 = np.array([0, 0, 3, 0, 1])  # job 2: several workers, no PS (a poor state)
    u0 = np.array([0, 0, 0, 0, 0])
    free[2] -= 3 * WORKER_DEMAND[types[2]]
    free[3] -= WORKER_DEMAND[types[4]]
    win = window(types, free, w0, u0, seed=seed, cap=cap)
    key = jax.random.PRNGKey(seed)
    out = jax.device_get(run_window(cfg, params, key, win, mode=mode, epsilon=epsilon))
    acts, w, u, f, states, masks = reference_window(cfg, params, key, win, mode, epsilon)
    k = int(out.n_steps)
    assert k > 10, "with void discouraged a window takes many steps"
    np.testing.assert_array_equal(out.actions[:k], acts)
    np.testing.assert_array_equal(out.workers, w)
    np.testing.assert_array_equal(out.ps, u)
    np.testing.assert_allclose(out.free, f, atol=1e-4)
    np.testing.assert_array_equal(out.masks[:k], masks)
    np.testing.assert_allclose(out.states[:k], states, atol=1e-5)


@pytest.mark.parametrize("mode,epsilon,seed", [(GREEDY, 0.0, 4), (SAMPLE, 0.5, 5)])
def test_jitted_loop_matches_slow_reference_on_many_servers(cfg, mode, epsilon, seed):
    """37 servers: the slot loop's per-block fit cache spans several blocks and padding servers."""
    from dl2d.policy.dl2.nets import init_params

    rng = np.random.default_rng(seed)
    params = init_params(cfg, jax.random.PRNGKey(100 + seed))
    params["policy"]["out"]["bias"] = params["policy"]["out"]["bias"].at[-1].set(-3.0)
    types = rng.integers(0, 8, 8)
    cap = np.tile([2.0, 8.0, 48.0], (37, 1))
    cap[::5] = [0.0, 16.0, 64.0]  # CPU-only servers
    free = np.floor(cap * rng.uniform(0, 1, cap.shape))
    fresh = rng.uniform(size=37) < 0.4
    free[fresh] = cap[fresh]  # untouched servers: ties in load
    win = window(types, free, seed=seed, cap=cap)
    key = jax.random.PRNGKey(seed)
    out = jax.device_get(run_window(cfg, params, key, win, mode=mode, epsilon=epsilon))
    acts, w, u, f, states, masks = reference_window(cfg, params, key, win, mode, epsilon)
    k = int(out.n_steps)
    assert k > 10
    np.testing.assert_array_equal(out.actions[:k], acts)
    np.testing.assert_array_equal(out.workers, w)
    np.testing.assert_array_equal(out.ps, u)
    np.testing.assert_allclose(out.free, f, atol=1e-4)
    np.testing.assert_array_equal(out.masks[:k], masks)


# ---------------------------------------------------------------- teacher replay


@pytest.mark.parametrize("teacher_name,servers", [("drf", None), ("oracle", 40)])
def test_teacher_replay_reproduces_the_teachers_allocations(cfg, params, sim, teacher_name, servers):
    """DRF on the tests' 4 servers; the speed oracle where the cluster never binds (its replay follows the
    replay rule's order, not the oracle's SRTF order, so under contention other jobs could get the last tasks)."""
    if servers:
        sim = replace(sim, cluster=ClusterSpec(servers))
    trace = tiny_trace(12, seed=4)
    teacher = make_teacher(teacher_name)
    rng = np.random.default_rng(0)
    state = E.replace(E.SimState.initial(len(trace)), slot=0)
    checked = 0
    for i in range(25):
        if state.done():
            break
        view = E.view_of(trace, state, sim)
        target = teacher(view)
        d = decide(cfg, params, jax.random.PRNGKey(i), view, mode=TEACHER, targets=(target.workers, target.ps))
        np.testing.assert_array_equal(d.allocation.workers, target.workers)
        np.testing.assert_array_equal(d.allocation.ps, target.ps)
        place(view, d.allocation)
        checked += int(target.ps.sum() > len(view))  # slots where the teacher gave some job more than one PS
        state, _, _ = E.step(trace, state, target, sim, rng)
    assert checked >= 5
    assert getattr(teacher, "short_job_slots", 0) == 0


# ---------------------------------------------------------------- job-aware exploration


def test_poor_state_action_on_hand_made_states():
    cfg = replace(CFG, poor_ratio=2.0)
    win = window([0, 1, 2, 3])
    all_ok = jnp.ones(cfg.num_actions, bool)

    def fix(w, u, mask=all_ok):
        w = jnp.array(w + [0] * (cfg.max_jobs - len(w)), jnp.int32)
        u = jnp.array(u + [0] * (cfg.max_jobs - len(u)), jnp.int32)
        a, poor = poor_state_action(cfg, win, w, u, mask)
        return int(a) if bool(poor) else None

    assert fix([1, 1, 1, 1], [1, 1, 1, 1]) is None  # balanced: not poor
    assert fix([1, 0, 0, 0], [0, 1, 0, 0]) is None  # single tasks are not poor
    assert fix([1, 3, 1, 1], [1, 0, 1, 1]) == 3 * 1 + 1  # several workers, no PS: add a PS
    assert fix([1, 1, 0, 1], [1, 1, 2, 1]) == 3 * 2 + 0  # several PS, no worker: add a worker
    assert fix([1, 1, 1, 3], [1, 1, 1, 1]) == 3 * 3 + 1  # w/u = 3 > 2: add a PS
    assert fix([1, 1, 1, 1], [1, 3, 1, 1]) == 3 * 1 + 0  # u/w = 3 > 2: add a worker
    assert fix([1, 1, 1, 2], [1, 1, 1, 1]) is None  # ratio 2 is not above the threshold
    assert fix([3, 0, 1, 1], [0, 3, 1, 1]) == 1  # the first poor job wins
    # a fix that does not fit does not count; the next poor job's does
    blocked = all_ok.at[1].set(False)
    assert fix([3, 0, 1, 1], [0, 3, 1, 1], blocked) == 3
    # padding jobs are never poor
    w = jnp.array([0] * 4 + [3] + [0] * 3, jnp.int32)
    assert not bool(poor_state_action(cfg, win, w, jnp.zeros(cfg.max_jobs, jnp.int32), all_ok)[1])


def test_epsilon_one_always_takes_the_fix_in_poor_states(cfg, params):
    types = [0, 1, 2, 3]
    win = window(types, None, w0=[3, 0, 0, 0], u0=[0, 0, 3, 0])
    poor_steps = 0
    for seed in range(3):
        out = jax.device_get(run_window(cfg, params, jax.random.PRNGKey(seed), win, mode=SAMPLE, epsilon=1.0))
        # replay the recorded steps from the state after the starting bundles
        w, u, free = starting_bundles(cfg, win)
        for t in range(int(out.n_steps)):
            mask = jnp.asarray(out.masks[t])
            fix, poor = poor_state_action(cfg, win, w, u, mask)
            if bool(poor):
                poor_steps += 1
                assert out.actions[t] == int(fix) and out.explored[t]
            else:
                assert not out.explored[t]
            w, u, free, _, _ = apply_action(cfg, win, w, u, free, jnp.int32(out.actions[t]))
        np.testing.assert_array_equal(w, out.workers)
    assert poor_steps >= 3


# ---------------------------------------------------------------- all-reduce jobs (DL2 section 7)

def test_allreduce_jobs_get_workers_only_their_ps_and_bundle_actions_masked(params):
    from dl2d.workload.catalog import ALLREDUCE_WORKER
    types = [0, 3, 0, 3]
    ar = np.array([False, True, False, True])
    wd = np.where(ar[:, None], ALLREDUCE_WORKER.as_array()[None] * [1, 0.25, 0.2], WORKER_DEMAND[types])
    pd = np.where(ar[:, None], 0.0, PS_DEMAND[types])
    rng = np.random.default_rng(0)
    win = pad_window(CFG, np.asarray(types), rng.integers(0, 50, 4), rng.uniform(1, 300, 4), CAP.copy(), CAP,
                     worker_demand=wd, ps_demand=pd, allreduce=ar)
    zero = jnp.zeros(CFG.max_jobs, jnp.int32)
    m = np.asarray(_mask(win, zero, zero, win.free))
    for j in range(4):
        assert m[3 * j] and m[3 * j + 1] == (not ar[j]) and m[3 * j + 2] == (not ar[j]), j
    w, u, _ = starting_bundles(CFG, win)
    assert list(np.asarray(w)[:4]) == [1, 1, 1, 1] and list(np.asarray(u)[:4]) == [1, 0, 1, 0]
    for seed in range(5):
        out = run_window(CFG, params, jax.random.PRNGKey(seed), win, mode=SAMPLE, epsilon=0.3)
        assert np.all(np.asarray(out.ps)[:4][ar] == 0) and np.all(np.asarray(out.workers)[:4] >= 1)


# ---------------------------------------------------------------- jobs described by their speed, not their type

def test_speed_features_of_hand_made_estimates():
    from dl2d.policy.dl2.job_info import NUM_SPEED_FEATURES, speed_features
    est = np.zeros((2, 3, 17))
    est[0, 0, 1:] = 0.01 * np.minimum(np.arange(1, 17), 4)  # all-reduce: linear to 4 workers, flat after
    est[1, 1:, 1:] = 0.02  # PS job: no gain from more workers
    f = speed_features(est, remaining_epochs=[36.0, 72.0], allreduce=[True, False])
    assert f.shape == (2, NUM_SPEED_FEATURES)
    np.testing.assert_allclose(f[0, :4], [1.0, 1.0, 0.5, 0.25])  # efficiency at 2, 4, 8, 16
    np.testing.assert_allclose(f[1, :4], [0.5, 0.25, 0.125, 0.0625])
    np.testing.assert_allclose(f[:, 4], np.log1p([1.0, 1.0]) / 5, rtol=1e-6)  # 36 / 0.01 s = 1 h; 72 / 0.02 s = 1 h
    assert list(f[:, 5]) == [1.0, 0.0]


def test_with_the_speed_encoding_a_model_never_seen_is_scheduled_by_what_it_is(sim):
    """Two views that differ only in the jobs' model index (one of them a model index no training saw) give the
    same state and the same decision: the policy reads speed features, not types."""
    from dl2d.policy.dl2.nets import init_params
    from dl2d.policy.dl2.scheduler import decide
    from dl2d.workload.catalog import UNSEEN
    cfg = replace(CFG, job_encoding="speed")
    params = init_params(cfg, jax.random.PRNGKey(3))
    tr = tiny_trace(seed=4)
    state = E.SimState.initial(len(tr))
    view = E.view_of(tr, replace(state, slot=int(tr.arrival_slot.max())), sim)
    other = replace(view, type_idx=np.full(len(view), UNSEEN))
    a = decide(cfg, params, jax.random.PRNGKey(0), view, mode=GREEDY, record=True)
    b = decide(cfg, params, jax.random.PRNGKey(0), other, mode=GREEDY, record=True)
    np.testing.assert_array_equal(a.records[0].states, b.records[0].states)
    assert a.allocation.worker_servers == b.allocation.worker_servers
    typed = replace(CFG)
    c = decide(typed, init_params(typed, jax.random.PRNGKey(3)), jax.random.PRNGKey(0), view, record=True)
    d = decide(typed, init_params(typed, jax.random.PRNGKey(3)), jax.random.PRNGKey(0), other, record=True)
    assert not np.array_equal(c.records[0].states, d.records[0].states)  # the type encoding does see the index


@pytest.mark.parametrize("mode,epsilon,seed", [(GREEDY, 0.0, 6), (SAMPLE, 0.3, 7)])
def test_jitted_loop_matches_slow_reference_with_speed_features(mode, epsilon, seed):
    from dl2d.policy.dl2.job_info import NUM_SPEED_FEATURES
    from dl2d.policy.dl2.nets import init_params
    cfg = replace(CFG, job_encoding="speed")
    assert cfg.features_per_job == NUM_SPEED_FEATURES + 5
    rng = np.random.default_rng(seed)
    params = init_params(cfg, jax.random.PRNGKey(200 + seed))
    params["policy"]["out"]["bias"] = params["policy"]["out"]["bias"].at[-1].set(-3.0)
    types = rng.integers(0, 8, 5)
    cap = np.tile([4.0, 24.0, 128.0], (4, 1))
    info = rng.uniform(0, 1, (5, NUM_SPEED_FEATURES)).astype(np.float32)
    win = pad_window(cfg, types, rng.integers(0, 50, 5), rng.uniform(1, 300, 5), cap.copy(), cap,
                     worker_demand=WORKER_DEMAND[types], ps_demand=PS_DEMAND[types], job_info=info)
    key = jax.random.PRNGKey(seed)
    out = jax.device_get(run_window(cfg, params, key, win, mode=mode, epsilon=epsilon))
    acts, w, u, f, states, masks = reference_window(cfg, params, key, win, mode, epsilon)
    k = int(out.n_steps)
    np.testing.assert_array_equal(out.actions[:k], acts)
    np.testing.assert_allclose(out.states[:k], states, atol=1e-5)
    assert np.allclose(states[0].reshape(cfg.max_jobs, -1)[:5, :NUM_SPEED_FEATURES], info)
