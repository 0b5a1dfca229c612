"""The baselines a cluster would run instead of dl2d: Slurm as it is (FIFO + EASY backfill, never resized) and
Tiresias (discretised 2D least-attained-service); and the lower bound every figure is read against."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from testkit.sim import run_slots as simulate

from dl2d.policy import registry
from dl2d.policy.baselines.slurm_fifo import slurm_fifo
from dl2d.policy.baselines.tiresias import Tiresias
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.sim.bound import srpt_completions
from dl2d.sim.cluster import ClusterSpec
from dl2d.workload.workloads import WorkloadJob

NODES = ClusterSpec(2, gpus=4, cpus=48, mem_gb=192)  # 8 GPUs


def trace_of(*jobs):
    """jobs: (arrival_slot, model, GPUs asked, total batch)."""
    wl = [WorkloadJob(f"j{i}", a * 60.0, m, g, b) for i, (a, m, g, b) in enumerate(jobs)]
    return T.from_workload(wl, 60.0, interference_sigma=0.0)


def cfg(cluster=NODES):
    return E.SimConfig(cluster=cluster, slot_seconds=60.0, slot_noise=0.0, max_workers=16, max_ps=2,
                       resize_overhead_s=30.0)


def run_slots(tr, policy, n, config=None, state=None):
    return simulate(tr, policy, n, config or cfg(), state)


def test_slurm_gives_exactly_what_was_asked_and_never_moves_a_job():
    tr = trace_of((0, "cifar10", 3, 384), (0, "ncf", 2, 512), (1, "ncf", 1, 256))
    state, views = run_slots(tr, registry.build("slurm"), 4)
    for view, alloc in views:
        assert np.all((alloc.workers == 0) | (alloc.workers == view.requested))
        assert np.all(alloc.ps == 0)
    first = {int(j): s for j, s in zip(views[1][0].job_ids, views[1][1].worker_servers)}
    for view, alloc in views[2:]:
        for j, s in zip(view.job_ids, alloc.worker_servers):
            if int(j) in first and first[int(j)]:
                assert sorted(s) == sorted(first[int(j)])


def test_slurm_backfills_a_short_job_but_not_one_that_would_delay_the_head():
    # 8 GPUs: A holds 6 for a long time; B (head of the queue) wants 4 and must wait for A;
    # C (1 GPU, short) may backfill: it ends before A; D (2 GPUs, long) would delay B: it waits.
    tr = trace_of((0, "imagenet", 6, 1200), (1, "cifar10", 4, 512), (1, "ncf", 1, 256), (1, "imagenet", 2, 400))
    state, views = run_slots(tr, slurm_fifo, 3)
    view, alloc = views[-1]
    got = dict(zip(view.job_ids.tolist(), alloc.workers.tolist()))
    assert got[0] == 6 and got[1] == 0 and got[2] == 1 and got[3] == 0


def test_slurm_backfills_a_long_job_into_gpus_the_head_will_not_need():
    # A holds 4 of 8 GPUs; B (head) wants 6 and waits for A; D (long, 1 GPU) fits in the 2 GPUs B leaves.
    tr = trace_of((0, "imagenet", 4, 800), (1, "cifar10", 6, 768), (1, "imagenet", 1, 200))
    _, views = run_slots(tr, slurm_fifo, 3)
    view, alloc = views[-1]
    got = dict(zip(view.job_ids.tolist(), alloc.workers.tolist()))
    assert got == {0: 4, 1: 0, 2: 1}


def test_tiresias_preempts_the_job_with_the_most_service_for_a_newcomer():
    # A 8-GPU job runs alone and passes the first threshold (1 GPU-hour: 8 GPUs x 8 minutes); then a job
    # arrives that wants all 8 GPUs: it has had no service, so it is served first and A is preempted.
    tr = trace_of((0, "imagenet", 8, 1600), (9, "imagenet", 8, 1600))
    policy = Tiresias()
    state, views = run_slots(tr, policy, 12)
    view, alloc = views[-1]
    got = dict(zip(view.job_ids.tolist(), alloc.workers.tolist()))
    assert got == {0: 0, 1: 8}
    assert policy.attained[0] >= 3600.0 and list(policy.queues(view)) == [1, 0]


def test_tiresias_promotes_a_starving_job():
    policy = Tiresias(thresholds=(60.0,), starvation_factor=1.0)
    tr = trace_of((0, "imagenet", 8, 1600), (1, "imagenet", 8, 1600))
    _, views = run_slots(tr, policy, 6)
    served = [dict(zip(v.job_ids.tolist(), a.workers.tolist())) for v, a in views]
    assert any(s.get(0) == 8 for s in served[2:]) and any(s.get(1) == 8 for s in served[1:])  # they take turns


def test_the_artifacts_tiresias_serves_a_queue_in_the_order_jobs_entered_it_and_never_moves_a_running_job():
    """Tiresias.REFERENCE (the Pollux artifact's): B, submitted after A, passes 16 GPU-hours first and is served
    before A in the second queue; a running job keeps its servers when a newcomer starts beside it."""
    from dl2d.policy.baselines.tiresias import REFERENCE

    policy = Tiresias(**REFERENCE)
    assert list(policy.thresholds) == [16 * 3600.0] and policy.starvation_factor == 0
    # A (4 GPUs) and B (8 GPUs) arrive together; B passes 16 GPU-hours at slot 120, A only at slot 240
    tr = trace_of((0, "imagenet", 4, 800), (0, "imagenet", 8, 1600))
    view = E.view_of(tr, replace(E.SimState.initial(2), slot=300), cfg())
    service = {0: 16 * 3600.0 + 1, 1: 16 * 3600.0 + 1}
    policy.attained = dict(service)
    policy.entered = {1: (1, 120), 0: (1, 240)}  # as its own count saw them enter the second queue
    assert policy.order(view).tolist() == [1, 0]
    by_arrival = Tiresias(thresholds=(16 * 3600.0,), starvation_factor=0.0)  # dl2d's order: by arrival, A first
    by_arrival.attained = dict(service)
    assert by_arrival.order(view).tolist() == [0, 1]
    # a running job stays where it is when a job of a higher queue starts (dl2d's Tiresias places the newcomer
    # first, where the running one was, and moves it: a restart)
    tr = trace_of((0, "cifar10", 3, 384), (2, "ncf", 4, 1024))
    spread = replace(cfg(), allreduce_placement="spread")
    moved = {}
    for keep in (True, False):
        _, views = run_slots(tr, Tiresias(**{**REFERENCE, "thresholds": (60.0,), "keep_running": keep}), 4, spread)
        before = sorted(views[1][1].worker_servers[0])
        assert all(a.workers.tolist() == [3, 4] for _, a in views[2:])
        moved[keep] = any(sorted(a.worker_servers[0]) != before for _, a in views[2:])
    assert moved == {True: False, False: True}


def test_srpt_on_one_machine():
    done = srpt_completions(np.array([0.0, 1.0, 2.0]), np.array([4.0, 1.0, 5.0]))
    assert list(done) == [5.0, 2.0, 10.0]


# ---------------------------------------------------------------- elastic (dl2d's own heuristic)

def test_efficient_size_is_the_largest_that_keeps_the_efficiency_and_gets_faster():
    from dl2d.policy.elastic.srtf import efficient_sizes
    curves = np.array([[0, 1, 2, 2.9, 3.5, 3.6, 3.0],  # linear to 2, 3.5 at 4 = 0.875/GPU, 3.6 at 5 = 0.72
                       [0, 1, 0.9, 1.5, 1.6, 1.7, 1.8],  # 2 is slower than 1: never "efficient" at 2
                       [0, 1, 1.0, 1.0, 1.0, 1.0, 1.0]])
    assert list(efficient_sizes(curves, 0.7)) == [5, 1, 1]
    assert list(efficient_sizes(curves, 0.8)) == [4, 1, 1]
    assert list(efficient_sizes(curves, 0.25)) == [5, 6, 1]


def test_elastic_orders_by_remaining_work_and_sizes_jobs_efficiently():
    # 8 GPUs; a short ncf job and a long imagenet job arrive together: the short one is served first at
    # its efficient size, the rest goes to the long one; no PS anywhere.
    tr = trace_of((0, "imagenet", 1, 1600), (0, "ncf", 1, 256))
    _, views = run_slots(tr, registry.build("elastic"), 1)
    view, alloc = views[0]
    from dl2d.policy.elastic.srtf import efficient_sizes, size_curves
    want = efficient_sizes(size_curves(view), 0.6)
    assert alloc.workers[1] == min(want[1], 8) and alloc.workers.sum() <= 8 and np.all(alloc.ps == 0)
    assert alloc.workers.sum() == min(8, int(size_curves(view).argmax(axis=1).sum()))


def test_elastic_keeps_a_running_size_when_a_resize_would_gain_little():
    from dl2d.policy.elastic.srtf import elastic_srtf
    tr = trace_of((0, "cifar10", 1, 512))
    state, views = run_slots(tr, elastic_srtf, 2)
    size = int(views[-1][1].workers[0])
    assert size >= 1
    view = E.view_of(tr, state, cfg())
    near = int(size) - 1 if size > 1 else size + 1
    nudged = replace(view, prev_workers=np.array([near]))
    kept = elastic_srtf(nudged, keep_gain=10.0)  # any change gains less than 1000 %: keep
    assert kept.workers[0] == near
    moved = elastic_srtf(nudged, keep_gain=0.0)
    assert moved.workers[0] == size


def test_elastic_thresholds_given_per_job_are_each_jobs_own_and_default_to_the_policy():
    """The registered policy's thresholds given one per job are the policy; a threshold per job is each job's
    own."""
    from dl2d.policy.elastic.srtf import efficient_sizes, elastic_srtf, size_curves
    tr = trace_of((0, "imagenet", 8, 3200), (0, "ncf", 1, 256), (0, "cifar10", 4, 512))
    _, views = run_slots(tr, elastic_srtf, 1)
    view, plain = views[0]
    n = len(view)
    same = elastic_srtf(view, efficiency=np.full(n, 0.6), keep_gain=np.full(n, 0.3))
    assert np.array_equal(same.workers, plain.workers) and same.worker_servers == plain.worker_servers
    assert plain.workers.sum() == 8 and plain.workers[0] < 8  # contended: the long imagenet job gets what is left
    curves = size_curves(view)  # a threshold per job is each row's own
    per_job = efficient_sizes(curves, np.array([0.95, 0.6, 0.2]))
    assert list(per_job) == [int(efficient_sizes(curves[i:i + 1], e)[0]) for i, e in enumerate((0.95, 0.6, 0.2))]
    assert per_job[0] < efficient_sizes(curves, 0.6)[0]


def test_elastic_steps_an_adaptive_job_to_the_size_ahead_and_grows_a_kept_one_where_it_pays():
    """A job whose batch the scheduler chooses has a curve that is not concave (its batch fits a node, then a
    larger one pays over two): elastic gives it the size ahead that saves the most per GPU, where it stops a
    fixed-batch job at the first size that is slower; kept at its size it grows only for ADAPTIVE_KEEP_GAIN."""
    from dl2d.policy.elastic.srtf import ADAPTIVE_KEEP_GAIN, elastic_srtf
    tr = trace_of((0, "cifar10", 1, 512))
    _, views = run_slots(tr, elastic_srtf, 1)
    view = views[0][0]
    curve = np.zeros(view.est_speed.shape[2])
    curve[1:9] = [1.0, 1.9, 1.8, 1.7, 1.5, 1.5, 1.5, 4.0]  # 2 is efficient (0.6), 8 is fastest
    est = np.zeros_like(view.est_speed)
    est[0, 0, :] = curve * 1e-3
    fixed = replace(view, est_speed=est, prev_workers=np.array([0]))
    adaptive = replace(fixed, adaptive=np.array([True]))
    assert elastic_srtf(fixed).workers[0] == 2 and elastic_srtf(adaptive).workers[0] == 8
    kept = replace(adaptive, prev_workers=np.array([2]))
    assert 4.0 / 1.9 > 1 + ADAPTIVE_KEEP_GAIN  # 8 saves more than the gain asked of a kept job
    assert elastic_srtf(kept).workers[0] == 8 and elastic_srtf(replace(kept, adaptive=None)).workers[0] == 2
    est[0, 0, 8] = 1.9 * (1 + ADAPTIVE_KEEP_GAIN) * 0.99e-3  # 8 just short of it: the job keeps its 2
    assert elastic_srtf(replace(kept, est_speed=est)).workers[0] == 2


def test_elastic_whole_nodes_give_multi_node_jobs_whole_nodes_and_default_to_the_policy():
    """``node_workers``: a job of more workers than a node holds gets a multiple of it, on whole nodes; the GPUs
    that frees are not handed out as partial nodes either; 0 is the registered policy's default, and the site's
    ``whole_nodes`` turns it on there. The same jobs without it give the long job 11 GPUs over three nodes, so the
    rule is what changes them."""
    from dl2d.policy.elastic.srtf import allowed_sizes, elastic_srtf, next_sizes, node_workers
    assert list(np.flatnonzero(allowed_sizes(16, 4))) == [0, 1, 2, 3, 4, 8, 12, 16]
    assert allowed_sizes(6, 0).all() and list(next_sizes(allowed_sizes(9, 4))) == [1, 2, 3, 4, 8, 8, 8, 8, 10, 10]
    four_nodes = cfg(ClusterSpec(4, gpus=4, cpus=48, mem_gb=192))
    tr = trace_of((0, "imagenet", 8, 3200), (0, "cifar10", 4, 512), (0, "ncf", 1, 256))
    _, views = run_slots(tr, elastic_srtf, 1, four_nodes)
    view, plain = views[0]
    assert int(plain.workers[0]) == 11 and len(set(plain.worker_servers[0])) == 3
    off = elastic_srtf(view, node_workers=0)
    assert np.array_equal(off.workers, plain.workers) and off.worker_servers == plain.worker_servers
    whole = elastic_srtf(view, node_workers=4)
    assert list(map(int, whole.workers)) == [8, 4, 1]
    for servers in whole.worker_servers:
        if len(set(servers)) > 1:  # a multi-node job holds each of its nodes whole
            assert all(servers.count(s) == 4 for s in set(servers))
    for w in (0.5, 0.8):  # whatever the threshold, no count above a node's is a partial node
        counts = elastic_srtf(view, efficiency=w, node_workers=4).workers
        assert all(k <= 4 or k % 4 == 0 for k in counts)
    # the site's setting: the registered policy reads each job's node size from the view (4 GPUs, a GPU a worker)
    assert list(node_workers(view)) == [4, 4, 4]
    site = registry.build("elastic", registry.PolicyOptions(whole_nodes=True))(view)
    assert list(map(int, site.workers)) == [8, 4, 1] and site.worker_servers == whole.worker_servers
    assert np.array_equal(registry.build("elastic")(view).workers, plain.workers)
    # a node's size is in the job's workers: two GPUs a worker make a node of two workers, and one job's size
    # leaves the others' alone
    wide = replace(view, worker_demand=view.worker_demand * np.array([[2.0, 1.0, 1.0], [1, 1, 1], [1, 1, 1]]))
    assert list(node_workers(wide)) == [2, 4, 4]
    per_job = elastic_srtf(wide, node_workers=node_workers(wide))
    assert int(per_job.workers[0]) % 2 == 0 and all(k <= 4 or k % 4 == 0 for k in per_job.workers[1:])


@pytest.mark.parametrize("name", registry.names())
def test_every_policy_schedules_a_model_never_seen(name):
    """The daemon gives an all-reduce job of a model outside the catalog the class catalog.UNSEEN and a prior
    speed estimate (dl2d.daemon.jobmodel); every policy must take it like any other job."""
    from testkit.policy import build_any

    from dl2d.workload.catalog import UNSEEN
    tr = trace_of((0, "cifar10", 2, 256), (0, "ncf", 1, 256))
    view = E.view_of(tr, E.SimState.initial(len(tr)), cfg())
    view = replace(view, type_idx=np.array([UNSEEN, view.type_idx[1]]))
    alloc = build_any(name)(view)
    assert np.all(np.asarray(alloc.ps) == 0) and np.all(np.asarray(alloc.workers) >= 0)
