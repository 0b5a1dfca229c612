"""Generated Philly workloads and the model catalog's speed estimate."""
from __future__ import annotations

import collections

import numpy as np
import pytest

from dl2d.workload import catalog, philly, throughput


def test_generated_workloads_are_seeded_and_keep_the_model_mix():
    a = philly.generate(640, load=1.0, cluster_gpus=64, seed=4)
    assert a == philly.generate(640, load=1.0, cluster_gpus=64, seed=4)
    assert a != philly.generate(640, load=1.0, cluster_gpus=64, seed=5)
    mix = collections.Counter(j.model for j in a)
    want = dict(philly.MODEL_MIX)
    for model, count in want.items():  # the realistic workloads' proportions, to rounding
        assert abs(mix[model] - 640 * count / sum(want.values())) <= 1, model
    assert all(j.batch_size == philly.BATCH_PER_GPU[j.model] * j.gpus for j in a)
    assert sum(j.gpus == 1 for j in a) > 0.8 * len(a)  # Philly: most jobs ask for one GPU


def test_longer_philly_jobs_get_the_models_that_need_longer():
    jobs = philly.generate(2000, seed=1)
    order = [m for m, _ in philly.MODEL_MIX]
    ncf = [j for j in jobs if j.model == "ncf"]
    imagenet = [j for j in jobs if j.model == "imagenet"]
    assert ncf and imagenet and order.index("ncf") < order.index("imagenet")
    one_gpu = {m: catalog.epochs_to_converge(m) / catalog.allreduce_epoch_rate(m, philly.BATCH_PER_GPU[m], (1,))
               for m in order}
    assert list(one_gpu) == sorted(one_gpu, key=one_gpu.get)  # the mix is listed by one-GPU time


def test_tuned_style_gives_the_same_jobs_the_pollux_tuned_configurations():
    from dl2d.workload.workloads import WORKLOADS, packaged_workload

    # the table is the artifact's tuned workloads' configurations, counted
    counted = collections.Counter((j.model, j.gpus, j.batch_size) for k in WORKLOADS
                                  for j in packaged_workload(k, "workloads"))
    assert counted == {(m, g, b): n for m, menu in philly.TUNED_CONFIGS.items() for g, b, n in menu}
    submitted = philly.generate(4000, seed=3)
    tuned = philly.generate(4000, seed=3, style="tuned")
    assert submitted == philly.generate(4000, seed=3, style="realistic")  # the default draws as before
    assert [(j.name, j.arrival_s, j.model) for j in tuned] == [(j.name, j.arrival_s, j.model) for j in submitted]
    assert tuned == philly.generate(4000, seed=3, style="tuned") != philly.generate(4000, seed=4, style="tuned")
    got = collections.Counter((j.model, j.gpus, j.batch_size) for j in tuned)
    for model, menu in philly.TUNED_CONFIGS.items():
        jobs = sum(got[(model, g, b)] for g, b, _ in menu)
        assert jobs == sum(j.model == model for j in tuned)  # every job has one of its model's configurations
        for g, b, n in menu:  # in the artifact's proportions
            assert got[(model, g, b)] == pytest.approx(jobs * n / sum(c for *_, c in menu), abs=4 * jobs ** 0.5 + 1)
    assert sum(j.gpus > 1 for j in tuned) > 0.5 * len(tuned) > sum(j.gpus > 1 for j in submitted)
    assert max(j.gpus for j in philly.generate(400, seed=3, style="tuned", max_gpus=8)) == 8


@pytest.mark.parametrize("load", [1.0, 2.0])
def test_load_sets_the_arrival_rate_per_gpu(load):
    for gpus in (64, 512):
        jobs = philly.generate(4000, load=load, cluster_gpus=gpus, seed=2)
        hours = jobs[-1].arrival_s / 3600
        rate = len(jobs) / hours  # jobs per hour
        assert rate == pytest.approx(load * 20 * gpus / 64, rel=0.06)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_jobs": 0}, "num_jobs"), ({"num_jobs": 5, "load": 0}, "load"),
    ({"num_jobs": 5, "load": float("nan")}, "load"), ({"num_jobs": 5, "cluster_gpus": 0}, "cluster_gpus"),
    ({"num_jobs": 5, "style": "tunned"}, "style must be one of realistic, tuned, got 'tunned'"),
])
def test_bad_generator_settings_say_which(kwargs, message):
    with pytest.raises(ValueError, match=message):
        philly.generate(**kwargs)


def test_allreduce_estimate_is_the_measured_packed_speed():
    t = catalog.model_index("cifar10")
    est = catalog.speed_estimate([t], [128.0], max_ps=2, max_workers=8, gpus_per_node=4)
    assert est.shape == (1, 3, 9) and np.all(est[0, 1:] == 0) and est[0, 0, 0] == 0
    per_epoch = catalog.iterations_per_epoch("cifar10", 128.0)
    for w, placement in ((1, (1,)), (4, (4,)), (6, (4, 2)), (8, (4, 4))):
        step = throughput.throughput_model("cifar10").step_time(placement, 128.0 / w)
        assert est[0, 0, w] == pytest.approx(1 / (step * per_epoch)), w


def test_dl2_jobs_keep_their_type_index_and_ps_jobs_have_no_allreduce_row():
    assert catalog.MODEL_NAMES[:8] == tuple(catalog.TYPE_NAMES)
    assert not catalog.IS_ALLREDUCE[:8].any() and catalog.IS_ALLREDUCE[8:].all()
    est = catalog.speed_estimate([catalog.model_index("resnet-50")], [0.0], 4, 4, 2)
    assert np.all(est[0, 0] == 0) and np.all(est[0, 1:, 1:] > 0)
    with pytest.raises(ValueError, match="unknown model 'gpt-17'"):
        catalog.model_index("gpt-17")
