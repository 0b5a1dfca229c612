"""The packaged Pollux workloads and the work their jobs need: all sixteen files load as documented, every
measured convergence run is reproduced, and malformed workload files are rejected with the line named."""
from __future__ import annotations

import pytest

from dl2d.workload import workloads as W
from dl2d.workload.throughput import MODELS


@pytest.mark.parametrize("folder", W.FOLDERS)
def test_the_sixteen_packaged_workloads_load(folder):
    one_gpu = total = 0
    for k in W.WORKLOADS:
        jobs = W.packaged_workload(k, folder)
        assert len(jobs) == 160 and {j.model for j in jobs} <= set(MODELS)
        assert all(a.arrival_s <= b.arrival_s for a, b in zip(jobs, jobs[1:]))
        assert 0 <= jobs[0].arrival_s and jobs[-1].arrival_s <= 8 * 3600  # sampled over 8 hours
        one_gpu += sum(j.gpus == 1 for j in jobs)
        total += len(jobs)
    if folder == "workloads-realistic":
        assert (one_gpu, total) == (1199, 1280)  # as users submitted them (README)
    else:
        assert one_gpu < total / 2  # as Pollux's evaluation tuned them: several GPUs each
    with pytest.raises(ValueError, match="packaged workloads are"):
        W.packaged_workload(9, folder)


@pytest.mark.parametrize("model", MODELS)
def test_iterations_reproduce_the_measured_runs_and_interpolate_between_them(model):
    runs = W.convergence_runs(model)
    assert len(runs) >= 6
    for b, it in runs:
        assert W.iterations_to_finish(model, b) == it
    for (b0, it0), (b1, it1) in zip(runs, runs[1:]):
        mid = W.iterations_to_finish(model, (b0 * b1) ** 0.5)
        assert it1 < mid < it0  # a larger batch, fewer iterations
    (b_lo, it_lo), (b_hi, it_hi) = runs[0], runs[-1]
    assert W.iterations_to_finish(model, b_lo / 2) == pytest.approx(2 * it_lo)  # the same samples beyond
    assert W.iterations_to_finish(model, 2 * b_hi) == pytest.approx(it_hi / 2)


def test_every_packaged_job_has_work_to_do():
    for folder in W.FOLDERS:
        for j in W.packaged_workload(1, folder):
            assert W.iterations_to_finish(j.model, j.batch_size) > 0


HEADER = "name,time,application,num_replicas,batch_size\n"


@pytest.mark.parametrize("text, message", [
    ("name,time,application\n", "missing column(s) num_replicas, batch_size"),
    (HEADER, "no jobs"),
    (HEADER + "a,0,bert,1,96\nb,5,gpt2,1,8\n", "line 3: unknown model 'gpt2'"),
    (HEADER + "a,0,bert,0,96\n", "line 2: num_replicas must be a whole number >= 1, got '0'"),
    (HEADER + "a,0,bert,1.5,96\n", "line 2: num_replicas must be a whole number >= 1"),
    (HEADER + "a,-3,bert,1,96\n", "line 2: time must be a whole number >= 0"),
    (HEADER + "a,0,bert,1,many\n", "line 2: batch_size is not a number: 'many'"),
    (HEADER + ",0,bert,1,96\n", "line 2: a job needs a name"),
    (HEADER + "a,0,bert,1,96\na,1,bert,1,96\n", "job name 'a' appears twice"),
])
def test_malformed_workloads_are_rejected_naming_the_line(text, message):
    with pytest.raises(ValueError) as e:
        W.parse_workload(text, "w.csv")
    assert str(e.value).startswith("w.csv") and message in str(e.value)


def test_bad_batches_and_models():
    with pytest.raises(ValueError, match="total batch must be > 0"):
        W.iterations_to_finish("bert", 0)
    with pytest.raises(ValueError, match="no convergence measurements for model 'gpt'"):
        W.iterations_to_finish("gpt", 32)
