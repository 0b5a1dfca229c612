from __future__ import annotations

from dl2d.agents.features import job_gpu_features


def gpu(uuid, util, procs):
    return {"uuid": uuid, "util_gpu_pct": util,
            "processes": [{"pid": p, "used_mem_bytes": m, "slurm_job_id": j} for p, m, j in procs]}


def test_job_features_over_nodes_and_time():
    samples = [
        {"node": "a", "ts": 10.0, "gpus": [gpu("A0", 90, [(1, 100, "7")]),
                                            gpu("A1", 70, [(2, 300, "7"), (3, 50, "8")])]},
        {"node": "b", "ts": 12.0, "gpus": [gpu("B0", 50, [(4, 200, "7"), (5, 0, None)]),
                                            gpu("B1", 0, [])]},
        {"node": "a", "ts": 20.0, "gpus": [gpu("A0", 80, [(1, 120, "7")]),
                                            gpu("A1", None, [(3, 60, "8")])]},
        {"node": "c", "ts": 20.0, "gpus": [], "gpu_error": "no driver"},
    ]
    f = job_gpu_features(samples)
    assert set(f) == {"7", "8"}
    j7 = f["7"]
    assert (j7["gpus"], j7["nodes"], j7["observations"]) == (3, ["a", "b"], 4)
    assert j7["gpu_util_mean_pct"] == (90 + 70 + 50 + 80) / 4
    assert j7["gpu_mem_per_gpu_mean_bytes"] == (100 + 300 + 200 + 120) / 4
    assert j7["gpu_mem_per_gpu_max_bytes"] == 300 and j7["shared_gpu"] is True
    assert (j7["ts_first"], j7["ts_last"]) == (10.0, 20.0)
    j8 = f["8"]
    assert j8["gpu_util_mean_pct"] == 70 and j8["observations"] == 2 and j8["shared_gpu"] is True


def test_no_samples_no_jobs():
    assert job_gpu_features([]) == {}
    assert job_gpu_features([{"node": "a", "ts": 1.0, "gpus": [gpu("x", 3, [(1, 5, None)])]}]) == {}
