"""Per-job slot measurements (dl2d.daemon.jobstats) on hand-made statuses and agent samples."""
from __future__ import annotations

import numpy as np
import pytest

from dl2d.daemon.backend import FINISHED, RUNNING, JobStatus
from dl2d.daemon.jobstats import (
    JobSlotStats,
    RanJob,
    job_flags,
    measure_slot,
    predicted_epochs_per_s,
    speed_factor_estimate,
)
from dl2d.sim.engine import epochs_per_slot
from dl2d.workload.jobtypes import BATCHES_PER_EPOCH, type_index
from dl2d.workload.speed import speed_table

TABLE = speed_table("measured")


def gpu(uuid, util, procs):
    return {"uuid": uuid, "util_gpu_pct": util,
            "processes": [{"pid": p, "used_mem_bytes": m, "slurm_job_id": j} for p, m, j in procs]}


def status(job_id, epochs, state=RUNNING, ref=None):
    return JobStatus(job_id, state, 0, 0, epochs, backend_ref=ref if ref is not None else f"s{job_id}")


def test_prediction_is_the_simulators_epochs_per_slot():
    t = type_index("resnet-50")
    want = epochs_per_slot(TABLE, np.array([t]), np.array([2]), np.array([4]), 1.0, 1200.0)[0] / 1200.0
    assert predicted_epochs_per_s(TABLE, "resnet-50", 4, 2) == pytest.approx(want)
    assert predicted_epochs_per_s(TABLE, "resnet-50", 4, 2) > predicted_epochs_per_s(TABLE, "resnet-50", 1, 1) > 0
    assert BATCHES_PER_EPOCH[t] > 0


def test_measured_speed_factor_and_gpu_features():
    pred = predicted_epochs_per_s(TABLE, "resnet-50", 2, 1)
    ran = [RanJob(1, "resnet-50", 2, 1, 10.0),   # ran at 0.5x the model's speed
           RanJob(2, "resnet-50", 2, 1, 3.0),    # finished mid-slot: no factor
           RanJob(3, "resnet-50", 0, 0, 0.0),    # not running: no stats
           RanJob(4, "vgg-16", 1, 1, 0.0)]       # backend does not know it: no stats
    statuses = {1: status(1, 10.0 + 0.5 * pred * 100), 2: status(2, 3.5, FINISHED), 3: status(3, 0.0)}
    samples = [{"node": "a", "ts": 1.0, "gpus": [gpu("A0", 80, [(11, 100, "s1")]),
                                                 gpu("A1", 60, [(12, 300, "s1"), (21, 50, "s2")])]},
               {"node": "a", "ts": 2.0, "gpus": [gpu("A0", 90, [(11, 200, "s1")]), gpu("A1", 0, [])]},
               {"node": "b", "ts": 2.0, "gpus": [gpu("B0", 99, [(99, 1, "unknown-slurm-job")])]}]
    s1, s2 = measure_slot(ran, statuses, samples, 100.0, TABLE)
    assert (s1.job_id, s1.workers, s1.ps) == (1, 2, 1)
    assert s1.epochs == pytest.approx(0.5 * pred * 100) and s1.epochs_per_s == pytest.approx(0.5 * pred)
    assert s1.predicted_epochs_per_s == pytest.approx(pred) and s1.speed_factor == pytest.approx(0.5)
    assert (s1.gpus, s1.gpu_observations, s1.shared_gpu) == (2, 3, True)
    assert s1.gpu_util_mean_pct == pytest.approx((80 + 60 + 90) / 3) and s1.gpu_mem_per_gpu_max_bytes == 300
    assert s2.ended and s2.speed_factor is None and s2.epochs == pytest.approx(0.5) and s2.shared_gpu is True
    # no samples: speed only
    (s,) = measure_slot(ran[:1], statuses, [], 100.0, TABLE)
    assert s.speed_factor == pytest.approx(0.5) and s.gpus is None and s.shared_gpu is None
    # progress never goes backwards into a negative speed (e.g. a restart from an older checkpoint)
    (s,) = measure_slot([RanJob(1, "resnet-50", 2, 1, 99.0)], statuses, [], 100.0, TABLE)
    assert s.epochs == 0 and s.speed_factor == 0


def st(factor, shared=None):
    return JobSlotStats(0, 1, 1, 1.0, 1.0, 1.0, factor, shared_gpu=shared)


def test_flags_need_a_persistently_low_factor_or_a_shared_gpu():
    hist = {1: [st(0.5), st(0.6), st(0.7)],             # low 3 slots: slow
            2: [st(0.5), st(0.6), st(0.9)],             # recovered
            3: [st(0.5), st(None), st(0.6)],            # only 2 measured slots
            4: [st(1.0, True), st(1.0, None)],          # last slot with samples shared
            5: [st(1.0, True), st(1.0, False)],         # no longer shared
            6: [st(0.1), st(0.1), st(0.1, True)]}
    assert job_flags(hist) == {1: ["slow"], 4: ["shared_gpu"], 6: ["slow", "shared_gpu"]}
    assert job_flags(hist, low=0.95, slots=2) == {1: ["slow"], 2: ["slow"], 3: ["slow"], 4: ["shared_gpu"],
                                                   6: ["slow", "shared_gpu"]}
    est = speed_factor_estimate(hist)
    assert est[1] == pytest.approx(0.6) and est[3] == pytest.approx(0.55) and est[4] == 1.0
    assert speed_factor_estimate({7: [st(None)]}) == {}


def test_view_carries_the_measurements_and_the_baselines_ignore_them():
    from dl2d.daemon import plan as P
    from dl2d.daemon.backend import NodeInfo
    from dl2d.policy.registry import make_heuristic
    from dl2d.policy.registry import names as policy_names

    nodes = [NodeInfo(f"n{i}", 2, 8, 48.0) for i in range(4)]
    rows = [P.JobRow(i, t, 20.0, 1.0, 1, 1, 2) for i, t in ((3, "resnet-50"), (5, "vgg-16"), (8, "resnet-50"))]
    plain = P.build_view(4, rows, nodes)
    assert plain.job_speed_factor is None and plain.job_shared_gpu is None
    v = P.build_view(4, rows, nodes, speed_factor={5: 0.4, 8: 1.1}, shared_gpu={3: True, 99: True})
    assert np.isnan(v.job_speed_factor[0]) and v.job_speed_factor[1:].tolist() == [0.4, 1.1]
    assert v.job_shared_gpu.tolist() == [True, False, False]
    d = P.view_digest_input(v)
    assert d["speed_factor"] == [None, 0.4, 1.1] and d["shared_gpu"] == [True, False, False]
    assert "speed_factor" not in P.view_digest_input(plain)
    for name in policy_names(heuristic=True):
        a, b = make_heuristic(name)(plain), make_heuristic(name)(v)
        assert a.workers.tolist() == b.workers.tolist() and a.ps.tolist() == b.ps.tolist(), name
