"""The five baselines on hand-made slot views whose right answer can be worked out by hand, and a property
test that no baseline ever exceeds a server's capacity or a job's task limits."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit.sim import make_view, server_usage

from dl2d.core.placement import place
from dl2d.policy.baselines import heuristics as B
from dl2d.policy import registry
from dl2d.policy.baselines.optimus import Optimus
from dl2d.policy.registry import make_heuristic
from dl2d.sim.cluster import ClusterSpec
from dl2d.workload.jobtypes import BATCHES_PER_EPOCH, TYPE_NAMES
from dl2d.workload.speed import speed_table

# A bundle is a worker (1 GPU, 2 cores, 8 GB) + a PS (2 cores, 4 GB). Most cases use one big server that holds
# exactly 8 bundles (BIG8): with several small servers the least-loaded placement puts a job's worker and PS on
# different servers and can strand capacity (4 default servers take 7 bundles, not 8), which is the placer's
# business, tested in test_sim_engine.py, not the policy's.
BIG8 = ClusterSpec(1, gpus=8, cpus=32, mem_gb=192)
BIG12 = ClusterSpec(1, gpus=12, cpus=48, mem_gb=288)


def counts(alloc):
    return alloc.workers.tolist(), alloc.ps.tolist()


def test_add_sizes_gives_a_ps_job_its_bundle_first_then_workers_then_ps_as_far_as_they_fit():
    view = make_view(["resnet-50"] * 3, spec=BIG8)
    b = B.AllocationBuilder(view)
    b.add_sizes(0, 3, 5)  # 3 GPUs, 16 of the 32 cores
    b.add_sizes(1, 6, 1)  # a bundle, then 4 of the 5 further workers: the GPUs run out
    b.add_sizes(2, 2, 2)  # no GPU left: no bundle, so no PS waits without a worker
    assert counts(b.allocation()) == ([3, 5, 0], [5, 1, 0])


# ---------------------------------------------------------------- FIFO / SRTF

def test_fifo_gives_the_first_arrival_everything_it_may_have():
    view = make_view(["resnet-50", "vgg-16"], spec=BIG8)
    assert counts(B.fifo(view)) == ([8, 0], [8, 0])


def test_fifo_orders_by_arrival_not_by_row_and_respects_the_per_job_maximum():
    view = make_view(["resnet-50"] * 3, spec=BIG8, arrival=[5, 2, 9], max_workers=3, max_ps=3)
    w, p = counts(B.fifo(view))
    assert w == [3, 3, 2] and p == [3, 3, 2]  # row 1 arrived first, row 0 second, row 2 gets the rest
    view = make_view(["resnet-50"] * 3, spec=BIG8, arrival=[9, 2, 5], max_workers=3, max_ps=3)
    assert counts(B.fifo(view))[0] == [2, 3, 3]


def test_srtf_serves_the_shortest_remaining_job_first():
    view = make_view(["resnet-50"] * 3, spec=BIG8, est=[100, 10, 50], max_workers=3, max_ps=3)
    assert counts(B.srtf(view))[0] == [2, 3, 3]
    # remaining = estimate - done: the job with 95 of 100 epochs done is the shortest now
    view = make_view(["resnet-50"] * 2, spec=BIG8, est=[100, 20], done=[95, 0], max_workers=5, max_ps=5)
    assert counts(B.srtf(view))[0] == [5, 3]


def test_srtf_remaining_time_uses_the_type_step_time():
    # same epochs, but one resnext-110 epoch takes 390*100*0.226 s of compute and a resnet-50 one 115*100*0.449 s
    view = make_view(["resnext-110", "resnet-50"], servers=1, est=[10, 10])
    rt = B.remaining_time_estimate(view)
    assert rt == pytest.approx([10 * 39000 * 0.226, 10 * 11500 * 0.449])
    first = int(np.argmin(rt))
    assert counts(B.srtf(view))[0][first] == 2


# ---------------------------------------------------------------- DRF

def dominant_shares(view, alloc):
    cap = view.total_capacity
    used = alloc.workers[:, None] * view.worker_demand + alloc.ps[:, None] * view.ps_demand
    return (used / cap).max(axis=1)


def test_drf_splits_equal_jobs_equally():
    view = make_view(["resnet-50", "vgg-16"], spec=BIG8)
    assert counts(B.drf(view)) == ([4, 4], [4, 4])  # FIFO gave [8, 0]


def test_drf_equalises_dominant_shares_across_types_within_one_bundle():
    # a GPU job and a CPU-only job: both bundles take 4 of the 32 cores (1/8), the GPU one also 1 of 8 GPUs
    view = make_view(["resnet-50", "dssm", "seq2seq"], spec=BIG8)
    alloc = B.drf(view)
    assert alloc.workers.tolist() == [3, 3, 2]  # 8 bundles, the earliest arrivals get the odd ones
    shares = dominant_shares(view, alloc)
    assert shares.max() - shares.min() <= 0.125 + 1e-9
    assert alloc.workers.sum() == 8  # work-conserving: the cluster is full


def test_drf_gives_what_a_capped_job_cannot_take_to_the_others():
    view = make_view(["resnet-50"] * 3, spec=BIG12, max_workers=2, max_ps=2)  # 12 bundles, jobs capped at 2
    assert counts(B.drf(view))[0] == [2, 2, 2]


# ---------------------------------------------------------------- Tetris

def test_tetris_without_threshold_gives_the_shortest_job_all_it_may_have():
    view = make_view(["resnet-50"] * 3, spec=BIG8, est=[100, 10, 50])
    assert counts(B.tetris(view))[0] == [0, 8, 0]


@pytest.mark.parametrize("k, expected", [(1, [1, 1, 1]), (3, [2, 3, 3]), (5, [0, 5, 3]), (None, [0, 8, 0])])
def test_tetris_task_threshold_moves_on_after_k_bundles(k, expected):
    view = make_view(["resnet-50"] * 3, spec=BIG8, est=[100, 10, 50])
    assert counts(B.tetris(view, task_threshold=k))[0] == expected


def test_tetris_packing_beats_a_slightly_shorter_job():
    # a resnet-50 job and a CPU-only CTC job with 10% less estimated remaining compute: the resnet bundle uses
    # GPUs, cores and memory of the free cluster, the CTC bundle only cores and memory, so its alignment
    # (bundle . free, normalised) is larger: 0.3125 vs 0.1875, which outweighs the urgency difference.
    per_epoch = BATCHES_PER_EPOCH * B.LOCAL_COMP_TIME
    resnet, ctc = TYPE_NAMES.index("resnet-50"), TYPE_NAMES.index("cnn-text-classification")
    est_ctc = 10.0
    est_resnet = est_ctc * per_epoch[ctc] / per_epoch[resnet] / 0.9
    view = make_view(["resnet-50", "cnn-text-classification"], servers=1, est=[est_resnet, est_ctc])
    assert B.remaining_time_estimate(view)[1] < B.remaining_time_estimate(view)[0]
    assert counts(B.tetris(view))[0] == [2, 0]
    # when the CTC job is much shorter, urgency wins
    view = make_view(["resnet-50", "cnn-text-classification"], servers=1, est=[est_resnet, est_ctc / 10])
    assert counts(B.tetris(view))[0] == [0, 2]


# ---------------------------------------------------------------- Optimus

def test_optimus_gives_every_job_a_starting_bundle():
    view = make_view(TYPE_NAMES, spec=BIG8)  # 8 jobs, 8 bundles: nothing left over
    alloc = Optimus()(view)
    assert counts(alloc) == ([1] * 8, [1] * 8)


def test_optimus_gives_the_last_task_to_the_largest_marginal_gain():
    # one server with 10 cores: after two starting bundles only one more PS (2 cores) fits. Both jobs are
    # resnet-50 so a PS gains the same fraction of time; the one with more work left gains more seconds.
    spec = ClusterSpec(1, gpus=2, cpus=10, mem_gb=48)
    view = make_view(["resnet-50", "resnet-50"], spec=spec, est=[5, 50])
    assert counts(Optimus()(view)) == ([1, 1], [1, 2])
    view = make_view(["resnet-50", "resnet-50"], spec=spec, est=[50, 5])
    assert counts(Optimus()(view)) == ([1, 1], [2, 1])


def test_optimus_gain_is_per_unit_of_dominant_share():
    opt = Optimus()
    table = speed_table("parametric")
    spec = ClusterSpec(1, gpus=2, cpus=10, mem_gb=48)
    view = make_view(["vgg-16", "wlm"], spec=spec, est=[40, 40])
    steps = view.est_epochs * BATCHES_PER_EPOCH[view.type_idx]
    gains = [steps[j] / table[t, 1, 1] - steps[j] / table[t, 2, 1] for j, t in enumerate(view.type_idx)]
    expected = int(np.argmax(gains))  # a PS costs the same 2/10 cores for both jobs
    assert counts(opt(view))[1][expected] == 2 and counts(opt(view))[1][1 - expected] == 1


def test_optimus_stops_where_its_model_says_more_tasks_do_not_help():
    # On a 40-server cluster a lone job could take 16 workers and 16 PS. Optimus adds tasks only while its
    # fitted model predicts a gain, so it stops at a point where neither one more worker nor one more PS
    # helps (or at the limit). For five of the eight models the fit to the authors' data has no compute term
    # (total speed = 1 / (c/p + d), flat in workers), so Optimus keeps them at one worker and adds PS.
    opt = Optimus()
    table = speed_table("parametric")
    stopped_below_the_worker_limit = []
    for name in TYPE_NAMES:
        view = make_view([name], servers=40, est=[100])
        alloc = opt(view)
        t, w, p = int(view.type_idx[0]), int(alloc.workers[0]), int(alloc.ps[0])
        assert w == 16 or table[t, p, w + 1] <= table[t, p, w] * (1 + 1e-12), name
        assert p == 16 or table[t, p + 1, w] <= table[t, p, w] * (1 + 1e-12), name
        if w < 16:
            stopped_below_the_worker_limit.append(name)
    assert {"resnet-50", "vgg-16", "wlm"} <= set(stopped_below_the_worker_limit)


# ---------------------------------------------------------------- every baseline: capacity and limits

POLICIES = {name: make_heuristic(name) for name in registry.names(heuristic=True)}
POLICIES["tetris-k4"] = lambda v: B.tetris(v, task_threshold=4)


@st.composite
def views(draw):
    n_servers = draw(st.integers(1, 6))
    spec = ClusterSpec(n_servers, gpus=draw(st.sampled_from([0.0, 1.0, 2.0, 4.0])),
                       cpus=draw(st.sampled_from([2.0, 4.0, 8.0, 12.0])), mem_gb=draw(st.sampled_from([16.0, 48.0])))
    cap = spec.empty()
    used = np.array([[draw(st.floats(0, 1)) for _ in range(3)] for _ in range(n_servers)])
    free = np.round(cap * (1 - used * draw(st.sampled_from([0.0, 0.5, 1.0]))), 3)
    n_jobs = draw(st.integers(1, 8))
    types = draw(st.lists(st.sampled_from(TYPE_NAMES), min_size=n_jobs, max_size=n_jobs))
    est = draw(st.lists(st.floats(1, 300), min_size=n_jobs, max_size=n_jobs))
    done = [e * draw(st.floats(0, 1.2)) for e in est]
    arrival = sorted(draw(st.lists(st.integers(0, 20), min_size=n_jobs, max_size=n_jobs)))
    return make_view(types, spec=spec, arrival=arrival, est=est, done=done, free=free,
                     max_workers=draw(st.integers(1, 16)), max_ps=draw(st.integers(1, 16)))


@settings(max_examples=60, deadline=None)
@given(views())
def test_no_baseline_exceeds_a_server_or_a_job_limit(view):
    for name, policy in POLICIES.items():
        alloc = policy(view)
        used = server_usage(view, alloc)
        assert np.all(used <= view.free + 1e-9), f"{name} overflows a server"
        assert np.all(alloc.workers <= view.max_workers) and np.all(alloc.ps <= view.max_ps), name
        assert all(len(s) == w for s, w in zip(alloc.worker_servers, alloc.workers)), name
        usage, w, p = place(view, alloc)  # the engine accepts it as is
        assert np.allclose(usage, used) and w.tolist() == alloc.workers.tolist(), name
        if name in ("drf", "fifo", "srtf", "tetris"):
            assert alloc.workers.tolist() == alloc.ps.tolist(), f"{name} adds a worker and a PS together"


def test_unknown_baseline_is_rejected_by_name():
    with pytest.raises(ValueError, match="unknown policy 'sjf'.*drf"):
        make_heuristic("sjf")
