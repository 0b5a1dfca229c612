"""Distilling the planner on the measured speeds into the target-size network (dl2d.policy.planning.plan_distill)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from dl2d.policy.planning import plan_distill as D
from dl2d.policy.target import policy as T
from dl2d.policy.target import view as TV
from dl2d.policy.planning.lp_plan import on_measured_speeds
from dl2d.sim import engine as E
from dl2d.sim import trace as TR
from dl2d.sim.cluster import preset
from dl2d.sim.worlds import world

TCFG = T.TargetConfig(max_workers=8, max_ps=8, hidden=16, teacher="optimus-relative")


def test_a_label_is_the_granted_pair_rounded_down_to_the_levels():
    # levels 0..8; PS levels 1..8: (3 workers, 2 PS) -> 3 * 8 + 1; no workers -> pair 0; an all-reduce job's PS
    # index is 0 whatever it was granted
    got = D.pair_labels(TCFG, np.array([3, 0, 2]), np.array([2, 0, 5]), np.array([False, False, True]))
    assert list(got) == [3 * 8 + 1, 0, 2 * 8]


def small_run():
    tr = TR.generate(TR.TraceConfig(num_jobs=6), seed=4)
    cfg = E.SimConfig(cluster=preset("tiny"), max_workers=8, max_ps=8)
    return tr, cfg


def test_the_recorder_labels_every_slot_with_what_the_planner_granted():
    tr, cfg = small_run()
    planner = on_measured_speeds(cfg)
    rec = D.Recorder(TCFG, planner)
    res = E.run(tr, rec, cfg, seed=4)
    data = rec.samples()
    assert len(data) == len(rec.parts) > 3 and data.x.shape[2] == TCFG.feature_dim
    assert np.all(data.label[~data.active] == 0)
    # the planner drove, so the run is the planner's own
    alone = E.run(tr, on_measured_speeds(cfg), cfg, seed=4)
    assert np.allclose(res.jct_slots, alone.jct_slots)
    # some job waited in some slot, and some job ran with more than one worker: the labels are not one pair
    labelled = data.label[data.active]
    assert len(set(labelled.tolist())) > 1


def test_fitting_the_planners_pairs_makes_the_network_choose_them():
    tr, cfg = small_run()
    data = D.collect(TCFG, cfg, [tr], [4])
    params = T.init_params(TCFG, jax.random.PRNGKey(0))
    before = D.agreement(TCFG, params, data)
    params, loss = D.fit(TCFG, params, data, 300, lr=3e-3, batch=32)
    assert np.isfinite(loss)
    after = D.agreement(TCFG, params, data)
    assert after > 0.9 > before
    # a second fit of the same network (the next round) reuses the compiled step: one compilation in all
    D.fit(TCFG, params, data, 3, lr=3e-3, batch=32)
    _, step = D.fit_step(TCFG, 3e-3)
    assert step._cache_size() == 1


def test_every_count_levels_hold_the_planners_odd_ps_counts():
    wide = T.TargetConfig(max_workers=16, max_ps=16, every_count=True)
    assert wide.levels == tuple(range(17)) and wide.ps_levels == tuple(range(1, 17))
    # the features name a column for each level of each per-level block
    assert wide.feature_dim == 9 + 3 * 17 + 2 * 16
    base = T.TargetConfig(max_workers=16, max_ps=16)
    # 13 PS: the base levels (1-8, 10, 12, 14, 16) round it to 12, the 10th; every count keeps it
    assert D.pair_labels(base, np.array([1]), np.array([13]), np.array([False]))[0] == 1 * 12 + 9
    assert D.pair_labels(wide, np.array([1]), np.array([13]), np.array([False]))[0] == 1 * 16 + 12
    # a checkpoint's config written before the field reads as the base levels
    old = {k: v for k, v in base.to_dict().items() if k != "every_count"}
    assert T.TargetConfig.from_dict(old) == base
    assert T.TargetConfig.from_dict(wide.to_dict()) == wide


def test_a_network_widened_to_every_count_chooses_as_before():
    base = T.TargetConfig(max_workers=16, max_ps=16, hidden=16, teacher="optimus-relative")
    params = T.init_params(base, jax.random.PRNGKey(3))
    params = jax.tree_util.tree_map(lambda a: a + 0.1 * jax.random.normal(jax.random.PRNGKey(5), a.shape), params)
    wide, wparams = D.widen(base, params, every_count=True)
    assert wide.every_count and wide.num_actions == 17 * 16
    # features at the base levels, and anything at the new ones: the base pairs' logits are the old network's
    rng = np.random.default_rng(0)
    J = 6
    x_old = rng.normal(size=(J, base.feature_dim)).astype(np.float32)
    x_new = rng.normal(size=(J, wide.feature_dim)).astype(np.float32)
    new_cols = T.feature_columns(wide)
    x_new[:, [new_cols.index(c) for c in T.feature_columns(base)]] = x_old
    active, allreduce = np.ones(J, bool), np.zeros(J, bool)
    lo, vo = T.apply(base, params, x_old, active, allreduce)
    ln, vn = T.apply(wide, wparams, x_new, active, allreduce)
    new_l, new_p = list(wide.levels), list(wide.ps_levels)
    same = [new_l.index(w) * len(new_p) + new_p.index(p) for w in base.levels for p in base.ps_levels]
    assert np.allclose(np.asarray(ln)[:, same], np.asarray(lo), atol=1e-5)
    assert np.allclose(vn, vo, atol=1e-5)
    # a new pair takes the logit of the base pair below it: (1 worker, 13 PS) is (1, 12)'s
    assert np.allclose(ln[:, 1 * 16 + 12], lo[:, 1 * 12 + 9], atol=1e-5)


def test_the_measured_speed_column_and_a_network_widened_to_it():
    """TargetConfig.speed_factor: one more column, the log of each job's measured speed (0 before it is
    measured); a network widened to it (plan_distill.widen) chooses as before whatever the column holds, and a
    checkpoint's config written before the field reads without it."""
    base = T.TargetConfig(max_workers=16, max_ps=16, hidden=16, every_count=True)
    params = T.init_params(base, jax.random.PRNGKey(3))
    params = jax.tree_util.tree_map(lambda a: a + 0.1 * jax.random.normal(jax.random.PRNGKey(5), a.shape), params)
    new, wparams = D.widen(base, params, speed_factor=True)
    assert new.speed_factor and new.feature_dim == base.feature_dim + 1
    col = T.feature_columns(new).index(("speed_factor", 0))
    rng = np.random.default_rng(0)
    x_old = rng.normal(size=(5, base.feature_dim)).astype(np.float32)
    x_new = np.insert(x_old, col, rng.normal(size=5), axis=1).astype(np.float32)
    active, allreduce = np.ones(5, bool), np.zeros(5, bool)
    np.testing.assert_allclose(T.apply(new, wparams, x_new, active, allreduce)[0],
                               T.apply(base, params, x_old, active, allreduce)[0], atol=1e-5)
    with pytest.raises(ValueError, match="only turns on every_count or speed_factor"):
        D.widen(base, params, teacher="elastic")
    old = {k: v for k, v in new.to_dict().items() if k != "speed_factor"}
    assert T.TargetConfig.from_dict(old) == base and T.TargetConfig.from_dict(new.to_dict()) == new
    with pytest.raises(ValueError, match="speed_factor must be true or false"):
        T.TargetConfig(speed_factor=1)
    # the column from a view: log of the measured factor, 0 where the view has none
    trace = TR.generate(TR.TraceConfig(num_jobs=3, max_arrivals_per_slot=3), seed=1)
    cfg = world("dl2").sim_config("testbed")
    view = E.view_of(trace, E.replace(E.SimState.initial(3), slot=int(trace.arrival_slot.max())), cfg)
    view = E.replace(view, job_speed_factor=np.array([0.5, np.nan, 2.0]))
    x = np.asarray(T.job_features(new, T.with_optimus(TV.view_obs(new, view))))
    np.testing.assert_allclose(x[:, col], np.log([0.5, 1.0, 2.0]), atol=1e-6)


def test_the_training_runs_planner_phase_learns_the_planners_choices():
    """dl2d.policy.target.train's phase "plan" (`dl2ctl train --plan-rounds`): rounds of labelling the first
    training traces by the planner, each fitted and evaluated; afterwards the network chooses the planner's
    pairs on the planner's own runs of those traces, which the untrained network does not."""
    from dl2d.policy.target import train as TT
    # 50 fitting steps a round: the agreement below is 0.92 (0.98 at 100, 0.82 at 30)
    setup = TT.TrainSetup(world="dl2", servers=4, jobs=6, clusters=2, slots=4, val_traces=1, sl_iters=0, rl_iters=0,
                          plan_rounds=2, plan_traces=1, plan_iters=50, plan_lr=1e-2, teacher="optimus-relative",
                          every_count=True)
    cfg = TT.sim_config(setup)
    progress, evals = [], []
    result = TT.train(setup, on_progress=lambda *a: progress.append(a), on_eval=lambda r: evals.append(r))
    assert progress == [("plan", 1, 2), ("plan", 2, 2)]  # one step per trace labelled, of rounds x traces
    assert [(r["phase"], r["iter"]) for r in evals] == [("plan", 1), ("plan", 2)]
    assert result.config.every_count and result.chosen["phase"] == "plan"
    own = D.collect(result.config, cfg, [TT.make_trace(setup, cfg, 0)], [0])  # the planner drives, and labels
    untrained = T.init_params(result.config, jax.random.PRNGKey(setup.rng))
    assert D.agreement(result.config, result.params, own) > 0.85 > D.agreement(result.config, untrained, own)
