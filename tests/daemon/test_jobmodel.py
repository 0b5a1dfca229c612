"""A job's model in the daemon's view: all-reduce jobs of measured models get the catalog's speed at their batch
and GPUs per worker, a model never seen gets exactly the stated prior (dl2d.daemon.jobmodel), PS jobs are as
they were; kind, requested workers and the view's worker limit come from the specs."""
from __future__ import annotations

import numpy as np
import pytest

from dl2d.core.limits import MAX_WORKERS
from dl2d.daemon import jobmodel as M
from dl2d.daemon import plan as P
from dl2d.daemon.backend import NodeInfo
from dl2d.workload import catalog
from dl2d.workload.philly import BATCH_PER_GPU

NODES = [NodeInfo(f"n{i}", 4, 48, 192.0) for i in range(4)]  # 4-GPU nodes, as the measured cluster's
WORKER = {"gpus": 1, "cpus": 8, "mem_gb": 40}


def row(job_id: int, job_type: str, **spec) -> P.JobRow:
    return P.job_row(job_id, job_type, 10.0, 0.0, 0, 0, 0, {"worker": WORKER, **spec}, f"j{job_id}")


def median_speedup(asked_gpus: int, gpus: int) -> float:
    """The prior's curve, computed here from the measurements (not from jobmodel): the median over the six models
    of rate(k GPUs packed on 4-GPU nodes) / rate(1 GPU) at the batch their jobs use for ``asked_gpus`` GPUs."""
    ratios = [catalog.allreduce_epoch_rate(m, float(BATCH_PER_GPU[m] * asked_gpus), catalog.packed(gpus, 4))
              / catalog.allreduce_epoch_rate(m, float(BATCH_PER_GPU[m] * asked_gpus), (1,))
              for m in catalog.ALLREDUCE_MODELS]
    return float(np.median(ratios))


def test_a_model_never_seen_gets_exactly_the_stated_prior():
    view = P.build_view(0, [row(1, "my-llm", kind="allreduce", workers=8, epoch_seconds=300.0),
                            row(2, "my-llm", kind="allreduce", workers=8)], NODES)
    assert view.type_idx.tolist() == [M.UNSEEN_MODEL, M.UNSEEN_MODEL] == [len(catalog.MODEL_NAMES)] * 2
    assert view.kind == ("allreduce", "allreduce") and view.requested.tolist() == [8, 8]
    want = np.array([0.0] + [median_speedup(8, w) for w in range(1, view.max_workers + 1)])
    np.testing.assert_allclose(view.est_speed[0, 0], want / 300.0, rtol=1e-12)
    # without a hint: the median one-GPU epoch time of the six models at their one-GPU batch (459 s, as stated)
    default = float(np.median([1 / catalog.allreduce_epoch_rate(m, float(BATCH_PER_GPU[m]), (1,))
                               for m in catalog.ALLREDUCE_MODELS]))
    assert default == pytest.approx(459.0, abs=0.5)
    np.testing.assert_allclose(view.est_speed[1, 0], want / default, rtol=1e-12)
    assert not view.est_speed[:, 1:].any()  # no parameter servers
    assert view.est_speed[0, 0, 4] > view.est_speed[0, 0, 1] > 0  # a node of GPUs helps, as it does measured


def test_the_prior_follows_the_gpus_per_worker_and_the_request():
    two = P.build_view(0, [row(1, "my-llm", kind="allreduce", workers=2, worker={"gpus": 2, "cpus": 8, "mem_gb": 40})],
                       NODES, max_workers=4)
    want = [0.0] + [median_speedup(4, 2 * w) / M.default_epoch_seconds() for w in range(1, 5)]
    np.testing.assert_allclose(two.est_speed[0, 0], want, rtol=1e-12)
    assert two.worker_demand[0].tolist() == [2.0, 8.0, 40.0]


def test_a_measured_model_gets_the_catalogs_speed_at_its_batch_and_gpus_per_worker():
    spec = {"kind": "allreduce", "batch_size": 96.0, "workers": 4, "worker": {"gpus": 2, "cpus": 8, "mem_gb": 40}}
    view = P.build_view(0, [P.job_row(1, "bert", 2.0, 0.0, 0, 0, 0, spec)], NODES)
    assert view.type_idx.tolist() == [catalog.model_index("bert")] and view.max_workers == 64
    want = catalog.speed_estimate([catalog.model_index("bert")], [96.0], view.max_ps, 64, 4.0, [2])
    np.testing.assert_array_equal(view.est_speed, want)
    # one worker of 2 GPUs is bert at 96 on 2 GPUs of one node, measured
    assert view.est_speed[0, 0, 1] == catalog.allreduce_epoch_rate("bert", 96.0, (2,))


def test_ps_jobs_are_planned_as_before_and_keep_dl2s_limit():
    view = P.build_view(0, [P.JobRow(1, "resnet-50", 30.0), P.JobRow(2, "vgg-16", 30.0)], NODES)
    assert view.max_workers == MAX_WORKERS == 16 and view.kind == ("ps", "ps")
    assert view.requested.tolist() == [1, 1]
    want = catalog.speed_estimate([0, 1], [0.0, 0.0], view.max_ps, 16, 4.0)
    np.testing.assert_array_equal(view.est_speed, want)


def test_the_view_limit_is_the_jobs_own_within_the_bound():
    jobs = [P.JobRow(1, "resnet-50", 30.0), row(2, "my-llm", kind="allreduce")]
    assert jobs[1].max_workers == 64 and jobs[1].max_ps == 0  # an all-reduce job's defaults
    assert P.build_view(0, jobs, NODES).max_workers == 64
    assert P.build_view(0, jobs, NODES, worker_bound=32).max_workers == 32
    assert P.build_view(0, [jobs[0], row(3, "my-llm", kind="allreduce", max_workers=24)], NODES).max_workers == 24


def test_an_all_reduce_job_gets_no_ps_from_the_plan():
    """The plan caps an all-reduce job at 0 PS even where a spec carries a max_ps (it has none)."""
    r = row(1, "my-llm", kind="allreduce", max_ps=4)
    assert r.max_ps == 0 and r.demand.ps.as_array().tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("job_type, spec, message", [
    ("bert", {"kind": "allreduce"}, "batch_size must be a number > 0 for an all-reduce job of bert"),
    ("gpt-9", {"kind": "ps"}, "a PS job's model must be one of DL2's types"),
    ("gpt-9", {"kind": "mpi"}, "kind must be one of ps, allreduce"),
    ("gpt-9", {"workers": 0}, "workers must be a number > 0"),
    ("gpt-9", {"epoch_seconds": -1}, "epoch_seconds must be a number > 0"),
])
def test_a_bad_spec_names_its_field(job_type, spec, message):
    with pytest.raises(ValueError, match=message):
        M.model_of(job_type, spec)


def test_kind_defaults_by_model():
    assert M.model_of("resnet50", {}).kind.value == "ps"  # a DL2 type (alias)
    assert M.model_of("cifar10", {"batch_size": 128}).kind.value == "allreduce"
    assert M.model_of("CIFAR10", {"batch_size": 128}).type_idx == catalog.model_index("cifar10")
    assert M.model_of("resnet-50", {"kind": "allreduce"}).unseen  # measured only as a PS job
