"""Distilling the planner on the measured speeds into the target-size network (dl2d.policy.plan_distill)."""
from __future__ import annotations

import jax
import numpy as np

from dl2d.policy import plan_distill as D
from dl2d.policy import target as T
from dl2d.policy.lp_plan import on_measured_speeds
from dl2d.sim import engine as E
from dl2d.sim import trace as TR
from dl2d.sim.cluster import preset

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
