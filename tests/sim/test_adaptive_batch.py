"""Jobs whose batch the scheduler chooses: the trace's ``adaptive`` flag, an allocation's ``batch_size``, the
engine training each epoch at its own statistical efficiency (the progress rule) at the chosen batch, a batch
change costing a restart, and the goodput-optimal batch any policy can give (dl2d.policy.elastic.goodput)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from dl2d.cli.main import cli
from dl2d.core.contract import Allocation
from dl2d.policy import registry
from dl2d.sim import allreduce as A
from dl2d.sim import engine as E
from dl2d.sim import presets
from dl2d.sim import trace as T
from dl2d.sim.cluster import ClusterSpec, T4_NODE
from dl2d.sim.worlds import world
from dl2d.workload import catalog, efficiency, goodput
from dl2d.workload.workloads import WorkloadJob, packaged_workload

RULES = presets.speed_rules(presets.resolve("reference", {}))


def cfg(**over):
    """The reference preset's rules, a batch changing at a restart unless ``batch_in_place``."""
    base = presets.sim_config(presets.resolve("reference", {}), world("today").sim_config())
    return replace(base, cluster=ClusterSpec(2, **T4_NODE), **{"batch_in_place": False, **over})


def one_job(model="cifar10", batch=128.0, adaptive=True, epochs=None):
    tr = T.from_workload([WorkloadJob("a", 0.0, model, 4, batch)], 60.0, interference_sigma=0.0, adaptive=adaptive)
    if epochs is not None:
        tr = replace(tr, est_epochs=np.array([epochs]), true_epochs=np.array([epochs]))
    return tr


class Fixed:
    """Four GPUs on node 0, and a total batch (0: the job's own) every slot."""

    name = "fixed"

    def __init__(self, batch=0.0):
        self.batch = batch

    def __call__(self, view):
        n = len(view)
        return Allocation(np.full(n, 4), np.zeros(n, int), tuple((0, 0, 0, 0) for _ in range(n)),
                          tuple(() for _ in range(n)), np.full(n, self.batch))


def test_the_walk_over_epochs_takes_what_the_jobs_progress_needs():
    """Under the progress rule a job keeping batch M trains epoch by epoch at each epoch's gain; done, it has
    taken efficiency.iterations_to_finish(M) iterations, and its first epochs (least noise: a large batch is
    worth least) go slower than the mean."""
    step, trained = catalog.iteration_seconds("yolov3", 64.0, (4,), RULES)
    whole = efficiency.iterations_to_finish("yolov3", trained) * step
    assert A.progress_epochs("yolov3", trained, step, 0.0, whole) == pytest.approx(50.0, rel=1e-9)
    mean = 50.0 / whole
    assert A.progress_epochs("yolov3", trained, step, 0.0, 600.0) < 0.5 * mean * 600.0
    half = A.progress_epochs("yolov3", trained, step, 0.0, whole / 2)
    assert A.progress_epochs("yolov3", trained, step, half, whole / 2) == pytest.approx(50.0 - half, rel=1e-9)


def test_an_adaptive_job_at_its_own_batch_trains_as_a_fixed_one_and_a_new_batch_costs_a_restart():
    own = E.run(one_job(adaptive=False), Fixed(), cfg())
    same = E.run(one_job(), Fixed(128.0), cfg())
    assert same.jct_slots[0] == pytest.approx(own.jct_slots[0], rel=1e-12)
    larger = E.run(one_job(), Fixed(1024.0), cfg())  # 4 GPUs train 1024 faster than 128 (cifar10)
    assert larger.jct_slots[0] < own.jct_slots[0]
    tr = one_job()
    state = replace(E.SimState.initial(1), slot=0)
    rng = np.random.default_rng(0)
    state, _, _ = E.step(tr, state, Fixed(128.0)(E.view_of(tr, state, cfg())), cfg(), rng)
    state, _, info = E.step(tr, state, Fixed(256.0)(E.view_of(tr, state, cfg())), cfg(), rng)
    assert info["resized"] == 1 and state.batch[0] == 256.0  # same GPUs, a new batch: a restart
    assert E.view_of(tr, state, cfg()).batch_size[0] == 256.0


def test_a_batch_the_job_does_not_allow_is_refused():
    tr = one_job(adaptive=False)
    with pytest.raises(ValueError, match="does not allow it"):
        E.run(tr, Fixed(256.0), cfg())
    with pytest.raises(ValueError, match="outside its model's"):
        E.run(one_job(), Fixed(64.0), cfg())  # below cifar10's initial 128


def test_a_trace_file_keeps_which_jobs_adapt(tmp_path):
    tr = T.from_workload(packaged_workload(1, "workloads-realistic")[:5], 60.0, adaptive=True)
    for name in ("t.json", "t.csv"):
        T.save(tr, tmp_path / name)
        assert T.load(tmp_path / name).adaptive.tolist() == [True] * 5
    bad = {"format": "dl2d-trace", "version": 1, "jobs": [
        {"id": 0, "arrival_slot": 0, "type": "resnet-50", "est_epochs": 5, "true_epochs": 5, "speed_factor": 1,
         "adaptive_batch": 1}]}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(T.TraceError, match="adaptive_batch"):
        T.load(tmp_path / "bad.json")


def test_the_best_batch_grows_as_the_gradients_get_noisier():
    early, _ = goodput.best_batch("cifar10", (4, 4), 0)
    late, _ = goodput.best_batch("cifar10", (4, 4), 90)
    assert 128 <= early < late <= 4096
    assert goodput.goodput("cifar10", (1,), 128.0, 0) == pytest.approx(
        1 / catalog.iteration_seconds("cifar10", 128.0, (1,))[0])  # at the initial batch: one iteration each


@pytest.mark.parametrize("model", catalog.ALLREDUCE_MODELS)
def test_the_best_batch_is_the_first_best_candidate_one_at_a_time(model):
    """best_batch scores its candidates at once; it gives what scoring each one at a time gives (a step's seconds,
    dl2d.workload.batching, and its gain, dl2d.workload.efficiency), the first of the best, exactly, with and
    without a job's own statistics and per-GPU limit, in both rules' step times; goodput() is that score."""
    from dl2d.workload import batching, efficiency

    r = efficiency.runs(model)
    for placement in ((1,), (2,), (4, 2), (4, 4, 4, 4), (8,)):
        for epoch in (0, 7, 60, 500):
            for stats, off_table, one, local in ((None, "fit", False, None), ((1.0, 5.0), "interpolate", True, 8.0)):
                best = (0.0, 0.0)
                for m in goodput.candidates(model, sum(placement)):
                    seconds, trained = batching.iteration_seconds(model, placement, float(m), off_table, one, local)
                    gain = efficiency.gain(r, trained, epoch) if stats is None else efficiency.gain_of(stats, trained,
                                                                                                      r.init)
                    g = gain / seconds
                    assert goodput.goodput(model, placement, float(m), epoch, stats, off_table, one, local) == g
                    best = (float(m), g) if g > best[1] else best
                assert goodput.best_batch(model, placement, epoch, stats, None, off_table, one, local) == best


def test_goodput_batches_speed_up_users_small_jobs():
    """The Pollux workloads as users submitted them (one GPU, a small batch each): elastic with the goodput
    batch against elastic with the submitted batches, in the reference preset, the first 30 jobs."""
    jobs = packaged_workload(1, "workloads-realistic")[:30]
    c = presets.sim_config(presets.resolve("reference", {}), world("today").sim_config("t4-16"))
    fixed = E.run(T.from_workload(jobs, 60.0, interference_sigma=0.0), registry.build("elastic"), c)
    chosen = E.run(T.from_workload(jobs, 60.0, interference_sigma=0.0, adaptive=True),
                   registry.build("elastic", registry.PolicyOptions(batch="goodput")), c)
    assert chosen.avg_jct_slots < 0.85 * fixed.avg_jct_slots
    assert registry.build("elastic", registry.PolicyOptions(batch="goodput")).name == "elastic+goodput"


def test_the_simulator_command_adapts_batches_and_records_it():
    r = CliRunner().invoke(cli, ["sim", "--jobs", "30", "--adaptive-batch", "--batch", "goodput",
                                 "--policy", "elastic", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["trace"]["adaptive_batch"] is True and out["sim"]["batch"] == "goodput"
    assert out["results"][0]["policy"] == "elastic+goodput"


def test_a_job_choosing_its_own_batch_in_place_grows_it_epoch_by_epoch_without_a_restart():
    """--batch-change in-place (the reference preset's): an AdaptDL job re-chooses its goodput-optimal batch at every
    epoch; it is never restarted for it, and it finishes before the same job held at its submitted batch."""
    batches = []
    res = E.run(one_job(epochs=100.0), Fixed(), cfg(batch_in_place=True), on_slot=lambda s: batches.append(s.batch[0]))
    held = E.run(one_job(epochs=100.0), Fixed(), cfg(batch_in_place=False))
    assert res.resizes == 1 and held.resizes == 1  # the start only
    assert len(set(batches)) > 2 and batches[-1] > batches[0]
    assert res.jct_slots[0] < held.jct_slots[0]


def test_a_policy_sizes_an_adaptive_job_on_the_speeds_of_its_best_batch():
    """goodput_speeds: an adaptive job's believed speed at each size is its one-GPU speed times its best goodput
    there over its goodput on one GPU at its own batch, in the epoch it is in (so never below its own batch's
    there); a fixed job's is left alone. Elastic then gives the adaptive job more GPUs than it would at its
    submitted batch, which saturates."""
    from dl2d.policy.elastic.goodput import goodput_speeds

    jobs = [WorkloadJob("a", 0.0, "cifar10", 1, 128.0), WorkloadJob("b", 0.0, "cifar10", 1, 128.0)]
    c = replace(cfg(), cluster=ClusterSpec(4, **T4_NODE))
    tr = T.from_workload(jobs, 60.0, interference_sigma=0.0, adaptive=True)
    tr = replace(tr, adaptive=np.array([True, False]))
    view = E.view_of(tr, replace(E.SimState.initial(2), slot=int(tr.arrival_slot.max())), c)
    seen = goodput_speeds(view)
    own, best = view.est_speed[0, 0], seen.est_speed[0, 0]
    one = goodput.goodput("cifar10", (1,), 128.0, 0)
    for w, placement in ((1, (1,)), (4, (4,)), (16, (4, 4, 4, 4))):
        assert best[w] == pytest.approx(own[1] * goodput.best_batch("cifar10", placement, 0)[1] / one, rel=1e-12)
        assert best[w] >= own[1] * goodput.goodput("cifar10", placement, 128.0, 0) / one * (1 - 1e-12)
    assert best[0] == 0 and best[16] > 1.5 * own[16]  # 16 GPUs at batch 128 are mostly idle
    np.testing.assert_array_equal(seen.est_speed[1], view.est_speed[1])
    fixed = registry.build("elastic")(view)
    adapting = registry.build("elastic", registry.PolicyOptions(batch="goodput"))(view)
    assert adapting.workers[0] > fixed.workers[0] and adapting.batch_size[0] > 128


@pytest.mark.parametrize("preset", ["reference", "dl2d"])
def test_the_bound_with_batches_the_schedulers_holds_for_batch_adapting_policies(preset):
    """dl2d.sim.bound on a trace whose jobs adapt their batch: each at its best batch too, so at or below the bound
    at their submitted batches, and no batch-adapting policy beats it (the Pollux workload as submitted, its first
    20 jobs on 4 nodes; under the reference preset's progress rule and dl2d's iterations rule)."""
    from dl2d.sim.bound import lower_bound

    jobs = packaged_workload(1, "workloads-realistic")[:20]
    settings = presets.resolve(preset, {} if preset == "reference" else
                               {"interference": 0.0, "slot_noise": 0.0, "shared_node_slowdown": 0.0})
    c = replace(presets.sim_config(settings, world("today").sim_config("t4-16")), cluster=ClusterSpec(4, **T4_NODE))
    fixed, adaptive = (T.from_workload(jobs, 60.0, interference_sigma=0.0, adaptive=a) for a in (False, True))
    at_own, with_batches = lower_bound(fixed, c), lower_bound(adaptive, c)
    assert with_batches.avg_jct_slots < at_own.avg_jct_slots
    assert np.all(with_batches.min_seconds <= at_own.min_seconds * (1 + 1e-9))
    for policy in (registry.build("elastic", registry.PolicyOptions(batch="goodput")),):
        assert E.run(adaptive, policy, c).avg_jct_slots >= with_batches.avg_jct_slots
