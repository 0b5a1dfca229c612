"""An agent sample flattened into its node_samples row (dl2d.agents.sample.sample_to_row)."""

from __future__ import annotations

from dl2d.agents.nvml import FakeNVML, FakeProcess, GPUReader
from dl2d.agents.sample import build_sample, sample_to_row


def test_sample_to_row_summarises_gpus_and_jobs():
    nv = FakeNVML.h100s(2)
    nv.gpus[0].util_gpu, nv.gpus[1].util_gpu = 80, 20
    nv.gpus[0].mem_used, nv.gpus[1].mem_used = 10, 30
    nv.gpus[1].temp_c = 77
    nv.gpus[0].processes = [FakeProcess(1, 10)]
    nv.gpus[1].pending_xids = [79]
    rep = GPUReader(nv, job_of_pid=lambda pid: "42").read()
    s = build_sample("n1", 123.0, rep.gpus, rep.error, rep.driver_version,
                     {"cpu_percent": 5.0, "load1": 1.0, "mem_used_bytes": 7,
                      "net_rx_bps": None, "net_tx_bps": 2.0})
    r = sample_to_row(s)
    assert (r["node"], r["ts"], r["n"], r["gpu_count"]) == ("n1", 123.0, 1, 2)
    assert (r["gpu_util_mean_pct"], r["gpu_util_max_pct"], r["gpu_mem_used_bytes"]) == (50, 80, 40)
    assert (r["gpu_temp_max_c"], r["xid_count"], r["jobs"], r["gpu_power_w"]) == (77, 1, ["42"], 140.0)
    empty = sample_to_row(build_sample("n2", 1.0, [], "NVML init failed: x", None, None))
    assert empty["gpu_util_mean_pct"] is None and empty["gpu_error"] == "NVML init failed: x"
