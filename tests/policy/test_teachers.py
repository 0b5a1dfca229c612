"""The warm-up's teachers (dl2d.policy.target.teachers): the JAX elastic gives the sizes dl2d.policy.elastic.srtf gives, on
the views of a simulated run in today's world, its spare-GPU pass and keep rule included; names are checked."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from dl2d.policy.target import policy as T
from dl2d.policy.target import view as TV
from dl2d.policy.target import train as TT
from dl2d.policy.target import teachers as TE
from dl2d.policy.elastic.srtf import EFFICIENCY, efficient_sizes, elastic_srtf, size_curves
from tests.testkit.sim import run_slots


def test_the_jax_elastic_gives_elastics_sizes_on_a_simulated_run():
    """On every view of 120 slots of elastic's own run, and on each view again with the jobs' previous sizes
    drawn at random (so the keep rule meets sizes both above and below the efficient ones)."""
    setup = TT.TrainSetup(jobs=30)
    cfg = TT.sim_config(setup)
    tc = TT.target_config(cfg)
    _, steps = run_slots(TT.make_trace(setup, cfg, 7), elastic_srtf, 120, cfg)
    rule = jax.jit(lambda o: TE.elastic(tc, o))
    rng = np.random.default_rng(0)
    lv, checked, above, kept = np.array(tc.levels), 0, 0, 0
    for view, _ in steps:
        if not len(view):
            continue
        redrawn = dataclasses.replace(view, prev_workers=rng.integers(0, 9, len(view)))
        for v in (view, redrawn):
            want = np.asarray(elastic_srtf(v).workers)
            pairs = np.asarray(rule(TV.padded(TV.view_obs(tc, v), len(v))))[:len(v)]  # one compilation, every view
            sizes = lv[pairs // len(tc.ps_levels)]
            assert np.array_equal(sizes, want), f"slot {v.slot}"
            eff = efficient_sizes(size_curves(v), EFFICIENCY)
            checked += len(v)
            above += int(np.sum(sizes > eff))  # the spare-GPU pass grew them
            kept += int(np.sum((v.prev_workers > 0) & (sizes == v.prev_workers) & (sizes != eff)))  # the keep rule
    assert checked > 1000 and above > 0 and kept > 0


def test_an_unknown_teacher_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown teacher 'drf'; choices: optimus, optimus-relative, elastic"):
        TE.teacher("drf")
    with pytest.raises(ValueError, match="teacher must be one of optimus, optimus-relative, elastic, lp-plan, got 'drf'"):
        T.TargetConfig(teacher="drf")
    with pytest.raises(ValueError, match="teacher must be one of"):
        TT.TrainSetup(teacher="drf")  # refused before any trace is built
    # the planner's pair is solved outside JAX (dl2d.policy.planning.plan_net): a network may read it, the JAX training
    # cannot learn from it
    with pytest.raises(ValueError, match="unknown teacher 'lp-plan'; choices: optimus, optimus-relative, elastic"):
        TT.TrainSetup(teacher="lp-plan")
    assert tuple(TE.TEACHERS) + ("lp-plan",) == T.TargetConfig.TEACHERS


def test_the_teacher_is_part_of_the_policy_config_and_old_checkpoints_read_as_optimus(tmp_path):
    """The features show the teacher's pair (so a checkpoint records which): a config saved with elastic loads
    with elastic, one written before the field existed loads as Optimus's, and the features' one-hot block is
    each teacher's own pair."""
    from dl2d.policy.checkpoint import TargetCheckpoint, load_target, save_target

    old = T.TargetConfig.from_dict({"max_workers": 8, "max_ps": 8, "hidden": 16})
    assert old.teacher == "optimus"
    cfg = T.TargetConfig(max_workers=8, max_ps=8, hidden=16, teacher="elastic")
    save_target(tmp_path / "p.msgpack", TargetCheckpoint(cfg, T.init_params(cfg, jax.random.PRNGKey(0)), {}))
    assert load_target(tmp_path / "p.msgpack").config == cfg

    setup = TT.TrainSetup(jobs=30, load=3.0)  # contended: the teachers differ
    sim = TT.sim_config(setup)
    _, steps = run_slots(TT.make_trace(setup, sim, 7), elastic_srtf, 60, sim)
    nl, np_ = len(old.levels), len(old.ps_levels)
    relative = dataclasses.replace(cfg, teacher="optimus-relative")

    def features_and_pair(c):  # one compilation per teacher (views padded to one size), not one per operation
        def run(o):
            o = T.with_optimus(o)
            return T.job_features(c, o), TE.teacher(c.teacher)(c, o)
        return jax.jit(run)

    configs = (old, cfg, relative)
    jitted = {c.teacher: features_and_pair(c) for c in configs}
    differ = 0
    for view, _ in steps[::6]:
        pairs = {}
        for c in configs:
            x, pair = jitted[c.teacher](TV.padded(TV.view_obs(c, view), len(view)))
            x, pairs[c.teacher] = np.asarray(x)[:len(view)], np.asarray(pair)[:len(view)]
            assert np.array_equal(x[:, -nl - np_:-np_].argmax(1), pairs[c.teacher] // np_)
            assert np.array_equal(np.asarray(T.features_teacher(c, x)), pairs[c.teacher])  # read back whole
        differ += not np.array_equal(pairs["optimus"], pairs["elastic"])
    assert differ  # the two teachers' blocks are not the same block


def test_the_jax_relative_optimus_gives_relative_optimus_pairs_where_one_server_is_the_cluster():
    """DL2's PS jobs on one large server (aggregate capacity is the placement's): on every view of Optimus's
    contended run the teacher's pair is RelativeOptimus's (workers, PS) rounded down to the levels, and on some
    views it is not Optimus's."""
    from dl2d.policy.baselines.optimus import Optimus, RelativeOptimus
    from dl2d.sim import engine as E
    from dl2d.sim import trace as TR
    from dl2d.sim.cluster import ClusterSpec

    sim = E.SimConfig(cluster=ClusterSpec(1, gpus=24.0, cpus=96.0, mem_gb=576.0), max_workers=8, max_ps=8)
    tc = T.TargetConfig(max_workers=8, max_ps=8, hidden=16, teacher="optimus-relative")
    rule = jax.jit(lambda o: TE.optimus_relative(tc, o))
    _, steps = run_slots(TR.generate(TR.TraceConfig(num_jobs=12), seed=3), Optimus(), 30, sim)
    np_, lv, plv = len(tc.ps_levels), np.array(tc.levels), np.array(tc.ps_levels)
    checked = differ = 0
    for view, _ in steps:
        if not len(view):
            continue
        want, other = RelativeOptimus()(view), Optimus()(view)
        got = np.asarray(rule(TV.padded(TV.view_obs(tc, view), len(view))))[: len(view)]
        round_w = lambda w: lv[np.maximum(np.searchsorted(lv, w, side="right") - 1, 0)]  # noqa: E731
        round_p = lambda p: plv[np.maximum(np.searchsorted(plv, p, side="right") - 1, 0)]  # noqa: E731
        assert np.array_equal(lv[got // np_], round_w(want.workers)), f"slot {view.slot}"
        assert np.array_equal(plv[got % np_], round_p(want.ps)), f"slot {view.slot}"
        checked += len(view)
        differ += not (np.array_equal(want.workers, other.workers) and np.array_equal(want.ps, other.ps))
    assert checked > 100 and differ > 0


def test_a_prior_on_the_teachers_pair_makes_an_untrained_policy_its_teacher():
    """TargetConfig.prior raises the teacher's pair's logit: an untrained network with a large one picks the
    teacher's pair for every job (an all-reduce job's closed pairs stay closed), without it a pair of its own."""
    setup = TT.TrainSetup(jobs=30, load=3.0)
    sim = TT.sim_config(setup)
    _, steps = run_slots(TT.make_trace(setup, sim, 7), elastic_srtf, 40, sim)
    view = steps[-1][0]
    picks = {}
    for prior in (0.0, 20.0):
        cfg = T.TargetConfig(max_workers=16, max_ps=16, hidden=16, teacher="elastic", prior=prior)
        params = T.init_params(cfg, jax.random.PRNGKey(3))
        run = jax.jit(lambda p, o, cfg=cfg: (T.decide(cfg, p, o, ("ps", "allreduce"))["action"],
                                             TE.elastic(cfg, T.with_optimus(o))))  # compiled whole, not op by op
        action, pair = run(params, TV.padded(TV.view_obs(cfg, view), len(view)))
        picks[prior], teacher = np.asarray(action)[:len(view)], np.asarray(pair)[:len(view)]
    assert np.array_equal(picks[20.0], teacher)
    assert not np.array_equal(picks[0.0], teacher)
    assert T.TargetConfig.from_dict(T.TargetConfig(prior=8.0).to_dict()).prior == 8.0
    with pytest.raises(ValueError, match="prior must be a number in \\[0, 50\\]"):
        T.TargetConfig(prior=-1.0)
