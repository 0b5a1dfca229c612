"""Target-size policy checkpoints (dl2d.policy.checkpoint.save_target/load_target) and the registry's
``dl2-target``: a saved policy decides as the one saved; a damaged or foreign file is one clear CheckpointError."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import serialization

from dl2d.policy import registry
from dl2d.policy.target import policy as T
from dl2d.policy.target import view as TV
from dl2d.policy.checkpoint import CheckpointError, TargetCheckpoint, load_target, save_target
from tests.testkit.sim import make_view

CFG = T.TargetConfig(max_workers=8, max_ps=8, hidden=16)


def _view():
    return make_view(["resnet-50", "vgg-16", "seq2seq", "dssm"], servers=3, est=[20.0, 5.0, 50.0, 10.0],
                     done=[1.0, 0.0, 10.0, 2.0], max_workers=8, max_ps=8)


@pytest.fixture
def saved(tmp_path):
    params = T.init_params(CFG, jax.random.PRNGKey(3))
    path = tmp_path / "p.msgpack"
    save_target(path, TargetCheckpoint(CFG, params, {"world": "dl2"}))
    return path, params


def test_a_saved_policy_loads_and_decides_as_the_one_saved(saved):
    path, params = saved
    ckpt = load_target(path)
    assert ckpt.config == CFG and ckpt.meta == {"world": "dl2"}
    view = _view()
    want = TV.TargetPolicy(CFG, params)(view)
    got = registry.build("dl2-target", registry.PolicyOptions(checkpoint=str(path)))(view)
    np.testing.assert_array_equal(got.workers, want.workers)
    np.testing.assert_array_equal(got.ps, want.ps)
    assert want.workers.sum() > 0


def _rewrite(path, change):
    doc = serialization.msgpack_restore(path.read_bytes())
    change(doc)
    path.write_bytes(serialization.msgpack_serialize(doc))


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(format="dl2d-policy"), "not a dl2d-target-policy checkpoint (it is a 'dl2d-policy'"),
    (lambda d: d.update(version=2), "version 2 not supported"),
    (lambda d: d["config"].update(hidden=10 ** 9), "hidden must be an integer in [1, 1024]"),
    (lambda d: d["config"].update({"hiden\n": 3}), "unknown key(s) 'hiden\\n'"),
    (lambda d: d["params"]["logits"].update(kernel=np.zeros((3, 3), np.float32)), "shapes (3, 3) != expected"),
    (lambda d: d["params"]["actor"]["embed"].update(bias=np.full(16, np.nan, np.float32)), "NaN or infinite"),
    (lambda d: d["params"].pop("critic"), "params do not match the config"),
    (lambda d: d.update(meta=[1]), "meta is not a table"),
])
def test_a_damaged_checkpoint_is_one_clear_error(saved, change, message):
    path, _ = saved
    _rewrite(path, change)
    with pytest.raises(CheckpointError) as e:
        load_target(path)
    assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(registry.PolicyBuildError, match="policy dl2-target"):
        registry.build("dl2-target", registry.PolicyOptions(checkpoint=str(path)))


def test_garbage_and_a_missing_file_are_clear_errors(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00\xffnot msgpack at all" * 10)
    with pytest.raises(CheckpointError, match="not a dl2d-target-policy checkpoint"):
        load_target(junk)
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_target(tmp_path / "absent")


def test_the_shipped_dl2_world_policy_loads_and_scores_its_recorded_held_out_jct():
    """The pretrained checkpoint in the package (docs/BENCHMARKS.md: how it was made) loads through the registry
    with no checkpoint given, and on its first held-out trace, in the NumPy simulator, gets the JCT its meta
    records (the other traces are the benchmark's: 4 more runs would add 20 s here)."""
    from dl2d.policy.target.entry import pretrained
    from dl2d.sim import engine as E
    from dl2d.sim import trace as TR
    from dl2d.sim.worlds import world

    ckpt = load_target(pretrained("dl2"))
    meta = ckpt.meta
    assert meta["world"] == "dl2" and meta["held_out_seeds"][0] == 0
    cfg = world("dl2").sim_config(meta["cluster"])
    trace = TR.generate(TR.TraceConfig(num_jobs=meta["jobs"]), seed=0)
    dl2_world = registry.PolicyOptions(world="dl2")
    policy = registry.build("dl2-target", dl2_world)
    assert registry.problems("dl2-target", dl2_world) == []
    got = float(E.run(trace, policy, cfg, seed=0).jct_slots.mean())
    assert got == pytest.approx(meta["held_out_jct_numpy"][0], abs=1e-3)
    assert meta["held_out_jct_numpy_mean"] < meta["optimus_held_out_jct_numpy_mean"]
    # it learned the planner on the measured speeds (dl2d.policy.planning.plan_distill), its features showing the relative
    # Optimus's pair, and beats every heuristic its meta scored on the held-out traces (the relative Optimus,
    # the DL2 world's best, among them)
    assert meta["teacher"] == "lp-plan-measured" and ckpt.config.teacher == "optimus-relative"
    heuristics = meta["heuristics_held_out_jct_numpy_mean"]
    assert "optimus-relative" in heuristics and meta["held_out_jct_numpy_mean"] < min(heuristics.values())


def test_the_shipped_todays_world_policy_loads_and_scores_its_recorded_validation_jct():
    """The default world's pretrained checkpoint (made by `dl2ctl train --policy dl2-target`, the command and the
    checkpoint it started from recorded in its meta) is what dl2-target builds with no checkpoint, and on its first validation trace, in
    the JAX environment it was validated in, the greedy policy gets the JCT its meta records."""
    from dl2d.policy.target import ppo as P
    from dl2d.policy.target import train as TT
    from dl2d.policy.target.entry import pretrained
    from dl2d.sim import jaxenv as X

    ckpt = load_target(pretrained("today"))
    meta = ckpt.meta
    assert meta["world"] == "today" and meta["command"].startswith("dl2ctl train --policy dl2-target")
    setup = TT.TrainSetup(**{**meta["setup"], "val_traces": 1})
    cfg = TT.sim_config(setup)
    assert ckpt.config == TT.target_config(cfg, setup.teacher, setup.prior)
    env, states = X.from_traces([TT.make_trace(setup, cfg, setup.val_seed)], cfg, setup.jobs, placement=False)
    final, reached = TT.run_to_end(lambda s, n: P.evaluate(ckpt.config, env, ckpt.params, s, n), states,
                                   setup.max_eval_slots)
    [jct], _ = TT.average_jcts(final, reached)
    assert jct == pytest.approx(meta["validation_jct"][0], abs=1e-2)
    assert registry.problems("dl2-target") == []  # the default world's policy ships
    assert meta["validation_jct_mean"] <= meta["teacher_validation_jct_mean"]


def test_jobs_of_a_kind_the_policy_never_trained_on_get_the_teachers_sizes():
    """A policy of today's all-reduce world on PS jobs (it gave them no worker, and they starved): Optimus's
    pair for them; the jobs of its own kind keep the network's choice."""
    params = T.init_params(CFG, jax.random.PRNGKey(5))
    view = _view()  # four PS jobs
    learned, obs = TV.TargetPolicy(CFG, params).actions(view)
    padded = {k: np.asarray(v) for k, v in obs.items()}
    teacher = np.asarray(jax.jit(lambda o: T.teacher_actions(CFG, T.with_optimus(o)))(padded))
    got, _ = TV.TargetPolicy(CFG, params, kinds=("allreduce",)).actions(view)
    np.testing.assert_array_equal(got, teacher)
    assert not np.array_equal(learned, teacher)  # the untrained network's own choice differs
    same, _ = TV.TargetPolicy(CFG, params, kinds=("ps",)).actions(view)
    np.testing.assert_array_equal(same, learned)


def test_a_world_without_a_shipped_policy_needs_a_checkpoint_and_the_daemon_config_names_the_worlds():
    from dl2d.daemon.config import WORLDS
    from dl2d.sim.worlds import WORLDS as SIM_WORLDS

    assert WORLDS == tuple(SIM_WORLDS)
    [(option, message)] = registry.problems("dl2-target", registry.PolicyOptions(world="mars"))
    assert option == "checkpoint" and "no pretrained policy for the mars world" in message


def test_a_policy_decides_on_a_cluster_whose_limits_are_below_its_levels():
    """Trained for up to 8 workers and 8 PS, run where a job may have 2 and 3: the levels above read the speed
    at the limit and the fill never passes it."""
    policy = TV.TargetPolicy(CFG, T.init_params(CFG, jax.random.PRNGKey(4)))
    view = make_view(["resnet-50", "vgg-16", "seq2seq"], servers=6, est=[20.0, 5.0, 50.0], max_workers=2, max_ps=3)
    alloc = policy(view)
    assert np.all(alloc.workers <= 2) and np.all(alloc.ps <= 3) and alloc.workers.sum() > 0


def test_benchmark_seeds_a_shipped_policy_trained_or_validated_on_are_refused():
    from dl2d.policy.target.entry import pretrained
    from dl2d.policy.target.train import held_out_seeds

    meta = load_target(pretrained("today")).meta  # trained on seeds 0-63, validated on 10000-10004
    assert list(held_out_seeds("30000-30002", meta)) == [30000, 30001, 30002]
    assert list(held_out_seeds("64", meta)) == [64]
    with pytest.raises(ValueError, match=r"seeds \[10004\] were used in training or validation"):
        held_out_seeds("10004-10005", meta)
    assert held_out_seeds("64,70-71", meta) == [64, 70, 71]  # the one form every bench script takes
    with pytest.raises(ValueError, match="seeds must be N, FIRST-LAST or a comma-separated list of them, got '1-x'"):
        held_out_seeds("1-x", meta)
    with pytest.raises(ValueError, match="the last is below the first"):
        held_out_seeds("9-3", meta)


def test_the_fill_places_a_ps_jobs_bundles_before_its_other_tasks():
    """Two PS jobs on two servers of 2 GPUs and 8 cores: the shorter wants 2 workers and 4 PS, the longer 2 and
    2. Placing the shorter job's PS all before its workers would take 8 of the 16 cores and leave the longer
    job's workers no cores beside their PS (it would wait, holding nothing); bundles first, both run."""
    from dl2d.sim.cluster import ClusterSpec

    cfg = T.TargetConfig(max_workers=8, max_ps=8, hidden=16)
    view = make_view(["resnet-50", "resnet-50"], spec=ClusterSpec(2, gpus=2.0, cpus=8.0, mem_gb=48.0),
                     arrival=[0, 0], est=[10.0, 100.0], max_workers=8, max_ps=8)
    policy = TV.TargetPolicy(cfg, T.init_params(cfg, jax.random.PRNGKey(0)))
    obs = TV.view_obs(cfg, view)
    pair = lambda w, p: cfg.levels.index(w) * len(cfg.ps_levels) + cfg.ps_levels.index(p)  # noqa: E731
    got = policy.place(view, np.array([pair(2, 4), pair(2, 2)]), obs)
    assert list(got.workers) == [2, 1] and list(got.ps) == [4, 1]
    used = (got.workers[:, None] * view.worker_demand + got.ps[:, None] * view.ps_demand).sum(axis=0)
    assert used[1] == 16.0  # every core in use


def test_whole_nodes_cut_an_allreduce_jobs_workers_to_whole_nodes():
    """The site's ``whole_nodes``: on four nodes of 4 GPUs, targets of 10, 6 and 1 workers (17 GPUs of 16) are
    cut to whole nodes above a node (8 and 4), and a multi-node job holds each of its nodes whole; without it
    the same targets are filled as they are. The registered policy passes the option on."""
    from dl2d.policy.elastic.srtf import elastic_srtf, whole_nodes_of
    from dl2d.sim import engine as E
    from dl2d.sim import trace as TR
    from dl2d.sim.cluster import ClusterSpec
    from dl2d.workload.workloads import WorkloadJob
    from tests.testkit.sim import run_slots

    jobs = [WorkloadJob("a", 0.0, "imagenet", 8, 3200), WorkloadJob("b", 0.0, "cifar10", 4, 512),
            WorkloadJob("c", 0.0, "ncf", 1, 256)]
    sim = E.SimConfig(cluster=ClusterSpec(4, gpus=4, cpus=48, mem_gb=192), slot_seconds=60.0, slot_noise=0.0,
                      max_workers=16, max_ps=2)
    _, views = run_slots(TR.from_workload(jobs, 60.0, interference_sigma=0.0), elastic_srtf, 1, sim)
    view = views[0][0]
    cfg = T.TargetConfig(max_workers=16, max_ps=2, hidden=16)
    params = T.init_params(cfg, jax.random.PRNGKey(0))
    obs = TV.view_obs(cfg, view)
    action = np.array([cfg.levels.index(w) * len(cfg.ps_levels) for w in (10, 6, 1)])
    plain = TV.TargetPolicy(cfg, params).place(view, action, obs)
    whole = TV.TargetPolicy(cfg, params, whole_nodes=True).place(view, action, obs)
    assert list(map(int, whole.workers)) == [8, 4, 1]
    assert int(plain.workers[1]) == 6 and int(plain.workers.sum()) == 16
    for servers in whole.worker_servers:
        if len(set(servers)) > 1:
            assert all(servers.count(s) == 4 for s in set(servers))
    assert [whole_nodes_of(k, 4) for k in (0, 3, 4, 5, 8, 11, 16)] == [0, 3, 4, 4, 8, 8, 16]
    assert whole_nodes_of(7, 0) == 7
    built = registry.build("dl2-target", registry.PolicyOptions(allow_untrained=True, whole_nodes=True))
    assert built.whole_nodes and not registry.build("dl2-target", registry.PolicyOptions(allow_untrained=True)).whole_nodes
