"""The learned rule chooser (dl2d.policy.elastic.chooser): the features of a cluster's state, the fit of least expected
regret on a case whose best choice is known, the file's checks, and the policy keeping its rule for ``every``
slots."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dl2d.policy.elastic import chooser as RC
from dl2d.policy.elastic.srtf import elastic_srtf, node_workers
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.sim.cluster import ClusterSpec
from dl2d.workload.workloads import WorkloadJob
from tests.testkit.sim import run_slots

FOUR_NODES = E.SimConfig(cluster=ClusterSpec(4, gpus=4, cpus=48, mem_gb=192), slot_seconds=60.0, slot_noise=0.0,
                         max_workers=16, max_ps=2, resize_overhead_s=30.0)


def _view(asked=(8, 4, 1)):
    jobs = [WorkloadJob(f"j{i}", 0.0, m, g, b)
            for i, (m, g, b) in enumerate(zip(("imagenet", "cifar10", "ncf"), asked, (3200, 512, 256)))]
    _, steps = run_slots(T.from_workload(jobs, 60.0, interference_sigma=0.0), elastic_srtf, 2, FOUR_NODES)
    return steps[1][0]


def test_state_features_read_what_the_jobs_ask_and_how_they_run():
    view = _view()
    x = RC.state_features(view)
    assert x.shape == (len(RC.FEATURES),) and np.all(np.isfinite(x))
    f = dict(zip(RC.FEATURES, x))
    assert f["log jobs"] == pytest.approx(np.log(4))
    assert f["share asking for more than one worker"] == pytest.approx(2 / 3)
    assert f["mean log2 workers asked"] == pytest.approx(np.mean(np.log2([8, 4, 1])))
    assert f["waiting share"] == pytest.approx(np.mean(view.prev_workers == 0))
    one_gpu = RC.state_features(_view(asked=(1, 1, 1)))
    assert dict(zip(RC.FEATURES, one_gpu))["share asking for more than one worker"] == 0
    assert np.array_equal(RC.state_features(view.subset([])), np.zeros(len(RC.FEATURES)))


def test_rules_are_elastic_with_its_threshold_and_whole_nodes():
    view = _view()
    assert np.array_equal(RC.apply_rule(view, "0.6").workers, elastic_srtf(view).workers)
    whole = RC.apply_rule(view, "0.7n")
    assert np.array_equal(whole.workers, elastic_srtf(view, efficiency=0.7, node_workers=node_workers(view)).workers)
    for bad, msg in (("fast", "not an efficiency"), ("1.5", r"not in \(0, 1\]"), ("0n0", "not an efficiency")):
        with pytest.raises(ValueError, match=msg):
            RC.parse_rule(bad)


def test_fit_learns_the_best_rule_where_it_is_known():
    """Rule 1 costs less where the second feature is positive, rule 0 elsewhere, and the other two always cost
    more; samples where every rule costs the same teach nothing. The fit picks the best rule on unseen states."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, len(RC.FEATURES)))
    good = np.where(x[:, 1] > 0, 1, 0)
    costs = 10.0 + rng.uniform(0, 1, (400, 4))
    costs[np.arange(400), good] = 5.0
    costs[::7] = 3.0  # ties
    ch = RC.fit(x, costs, l2=1e-4, steps=2000)
    test = rng.normal(size=(200, len(RC.FEATURES)))
    assert np.mean(np.argmax(ch.logits(test), axis=1) == np.where(test[:, 1] > 0, 1, 0)) > 0.95
    assert ch.meta["argmax_regret"] < 0.1 * ch.meta["uniform_regret"]
    with pytest.raises(ValueError, match="fit needs x"):
        RC.fit(x[:, :3], costs)


def test_a_saved_chooser_loads_as_saved_and_a_bad_file_is_one_clear_error(tmp_path):
    rng = np.random.default_rng(1)
    ch = RC.fit(rng.normal(size=(50, len(RC.FEATURES))), rng.uniform(size=(50, 4)), steps=50)
    path = tmp_path / "c.json"
    ch.save(path)
    again = RC.Chooser.load(path)
    x = rng.normal(size=(5, len(RC.FEATURES)))
    np.testing.assert_allclose(again.logits(x), ch.logits(x))
    d = json.loads(path.read_text())
    for change, msg in (({"format": "x"}, "not a rule chooser"), ({"features": ["a"]}, "other features"),
                        ({"weights": [[1.0]]}, "weights must be"), ({"rules": ["0.6", "x", "0.7n", "0.8n"]},
                                                                     "not an efficiency")):
        path.write_text(json.dumps({**d, **change}))
        with pytest.raises(ValueError, match=msg):
            RC.Chooser.load(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="cannot read rule chooser"):
        RC.Chooser.load(path)


def test_the_policy_keeps_its_rule_for_every_slots_and_chooses_again_on_a_new_run():
    view = _view()
    w = np.zeros((len(RC.FEATURES) + 1, 4))
    feature = RC.FEATURES.index("log jobs")
    w[feature] = [0.0, 0.0, 1.0, -1.0]  # more jobs than the mean: 0.7n; fewer: 0.8n
    ch = RC.Chooser(RC.RULES, np.full(len(RC.FEATURES), 0.0), np.ones(len(RC.FEATURES)), w, {})
    w2 = w.copy()
    w2[-1] = [0.0, 0.0, -50.0, 0.0]  # a bias against 0.7n
    policy = RC.ChooserPolicy(ch, every=3)
    from dataclasses import replace
    for slot in range(view.slot, view.slot + 3):
        policy(replace(view, slot=slot))
    assert policy.counts == [0, 0, 3, 0]
    policy.chooser = RC.Chooser(RC.RULES, ch.mean, ch.scale, w2, {})
    policy(replace(view, slot=view.slot + 2))  # within the 3 slots: kept
    assert policy.counts == [0, 0, 4, 0]
    policy(replace(view, slot=view.slot + 3))  # chosen again
    assert policy.counts[2] == 4 and sum(policy.counts) == 5
    policy(replace(view, slot=view.slot - 5))  # the slot went back: a new run, chosen again
    assert sum(policy.counts) == 6
    with pytest.raises(ValueError, match="every must be"):
        RC.ChooserPolicy(ch, every=0)


def test_the_shipped_chooser_is_registered_and_gives_its_recorded_validation_jct():
    """The package's chooser (bench/bench_chooser.py) as ``elastic-chooser`` on the first of its validation
    workloads (generated, a seed never recorded for its fit): the JCT its meta records."""
    from dl2d.policy import registry
    from dl2d.sim.worlds import world
    from dl2d.workload import philly

    ch = RC.Chooser.load(RC.SHIPPED)
    val = ch.meta["validation"]
    name, jct = val["workloads"][0], val["jct_h"][0]
    folder, seed = name.rsplit("/", 1)
    _, style, load = folder.split()
    cfg = world("today").sim_config("t4-16", max_slots=20_160)
    trace = T.from_workload(philly.generate(160, load=float(load), cluster_gpus=64, seed=int(seed), style=style),
                            cfg.slot_seconds, seed=int(seed))
    policy = registry.build("elastic-chooser")
    assert round(E.run(trace, policy, cfg, seed=int(seed)).avg_jct_hours, 4) == jct
    assert sum(c > 0 for c in policy.counts) >= 2  # it does choose: more than one rule ran
    assert registry.get("elastic-chooser").learned and registry.problems("elastic-chooser") == []
