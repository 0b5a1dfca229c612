"""The speed oracle (dl2d.policy.baselines.oracle): its choice per type, what it does when the cluster binds, and that on
an uncontended cluster without slot noise no baseline finishes any job before it does."""
from __future__ import annotations

import numpy as np
from testkit.sim import make_view, server_usage

from dl2d.policy import registry
from dl2d.policy.baselines.oracle import SpeedOracle, fastest_configs
from dl2d.policy.registry import make_heuristic
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.sim.cluster import ClusterSpec
from dl2d.workload.speed import measured_table


def test_fastest_configs_stays_within_the_limits_and_breaks_ties_towards_fewer_ps():
    table = np.zeros((2, 4, 4))
    table[0, 3, 3] = 9.0  # type 0: best overall at (3, 3), but only (2, 1) and (1, 2) are within limits 2 / 2
    table[0, 2, 1] = 5.0
    table[0, 1, 2] = 4.0
    table[1, 2, 2] = table[1, 1, 2] = 7.0  # type 1: a tie, the one with fewer PS wins
    ps, workers = fastest_configs(table, max_ps=2, max_workers=2)
    assert ps.tolist() == [2, 1] and workers.tolist() == [1, 2]


def test_an_idle_cluster_gives_each_job_its_fastest_measured_configuration():
    view = make_view(["resnet-50", "seq2seq", "dssm"], servers=40)
    oracle = SpeedOracle()
    alloc = oracle(view)
    ps, workers = fastest_configs(measured_table(), 16, 16)
    assert alloc.ps.tolist() == ps[view.type_idx].tolist()
    assert alloc.workers.tolist() == workers[view.type_idx].tolist()
    assert oracle.short_job_slots == 0
    # the measured data's shape: ResNet-50 is fastest with more PS than workers (DL2 Fig. 2's point)
    assert alloc.ps[0] > alloc.workers[0]


def test_a_binding_cluster_is_counted_and_never_overflowed():
    view = make_view(["resnet-50", "vgg-16", "resnet-50"], spec=ClusterSpec(1))  # 2 GPUs, 8 cores: far too small
    oracle = SpeedOracle()
    alloc = oracle(view)
    assert np.all(server_usage(view, alloc) <= view.free + 1e-9)
    assert oracle.short_job_slots == 3


def test_without_contention_or_noise_no_baseline_finishes_any_job_before_the_oracle():
    trace = T.generate(T.TraceConfig(num_jobs=12, max_arrivals_per_slot=2), seed=3)
    cfg = E.SimConfig(cluster=ClusterSpec(60), slot_noise=0.0)
    oracle = SpeedOracle()
    bound = E.run(trace, oracle, cfg, seed=0)
    assert oracle.short_job_slots == 0
    runs = {name: E.run(trace, make_heuristic(name), cfg, seed=0) for name in registry.names(heuristic=True)}
    for name, other in runs.items():
        assert np.all(bound.jct_slots <= other.jct_slots + 1e-9), name
    assert bound.avg_jct_slots < runs["optimus"].avg_jct_slots
