"""GPU reader over the injected FakeNVML, the no-driver path, PID -> job."""

from __future__ import annotations

import os
import subprocess
import sys

from testkit.agents import wait_until

from dl2d.agents.nvml import (
    FakeGPU,
    FakeNVML,
    FakeProcess,
    GPUReader,
    load_pynvml,
    slurm_job_of_pid,
)


def two_gpus() -> FakeNVML:
    return FakeNVML([
        FakeGPU(uuid="GPU-a", util_gpu=90, util_mem=40, mem_used=30 * 2**30, power_mw=512_345,
                temp_c=61, processes=[FakeProcess(101, 20 * 2**30), FakeProcess(102, 10 * 2**30)]),
        FakeGPU(uuid="GPU-b", util_gpu=5, processes=[FakeProcess(103, None)]),
    ])


def test_fake_nvml_stats_and_job_mapping():
    jobs = {101: "7001", 102: "7001", 103: None}
    rep = GPUReader(two_gpus(), job_of_pid=jobs.get).read()
    assert rep.error is None and rep.driver_version == "550.54.15"
    a, b = rep.gpus
    assert (a["index"], a["uuid"], a["name"]) == (0, "GPU-a", "NVIDIA H100 80GB HBM3")
    assert (a["util_gpu_pct"], a["util_mem_pct"], a["temp_c"]) == (90, 40, 61)
    assert a["mem_used_bytes"] == 30 * 2**30 and a["mem_total_bytes"] == 80 * 2**30
    assert a["power_w"] == 512.345 and a["power_limit_w"] == 700.0
    assert (a["clock_sm_mhz"], a["clock_mem_mhz"]) == (1980, 2619)
    assert (a["ecc_corrected"], a["ecc_uncorrected"]) == (0, 0)
    assert a["processes"] == [
        {"pid": 101, "used_mem_bytes": 20 * 2**30, "slurm_job_id": "7001"},
        {"pid": 102, "used_mem_bytes": 10 * 2**30, "slurm_job_id": "7001"},
    ]
    assert b["processes"] == [{"pid": 103, "used_mem_bytes": None, "slurm_job_id": None}]


def test_unsupported_fields_become_none_without_failing_the_gpu():
    nv = two_gpus()
    nv.gpus[0].unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetComputeRunningProcesses",
                              "nvmlDeviceRegisterEvents"}
    nv.gpus[0].ecc_uncorrected = None  # consumer GPU: no ECC
    g = GPUReader(nv, job_of_pid=lambda pid: None).read().gpus[0]
    assert g["power_w"] is None and g["processes"] is None and g["xid_errors"] is None
    assert g["ecc_uncorrected"] is None and g["ecc_corrected"] == 0
    assert g["util_gpu_pct"] == 90  # the rest still read


def test_xid_events_accumulate_across_reads():
    nv = two_gpus()
    r = GPUReader(nv, job_of_pid=lambda pid: None)
    assert r.read().gpus[1]["xid_errors"] == []
    nv.gpus[1].pending_xids += [79, 48]
    assert r.read().gpus[1]["xid_errors"] == [79, 48]
    nv.gpus[1].pending_xids.append(13)
    assert r.read().gpus[1]["xid_errors"] == [79, 48, 13]
    assert r.read().gpus[0]["xid_errors"] == []


def test_no_driver_reports_zero_gpus_with_reason_then_recovers():
    nv = two_gpus()
    nv.init_error = "Driver Not Loaded"
    r = GPUReader(nv)
    rep = r.read()
    assert rep.gpus == [] and "Driver Not Loaded" in rep.error
    nv.init_error = None  # driver loaded later: init is retried
    rep = r.read()
    assert len(rep.gpus) == 2 and rep.error is None
    r.close()
    assert not nv.initialised


def test_zero_devices_and_missing_pynvml_have_reasons():
    assert GPUReader(FakeNVML([])).read().error == "NVML reports 0 GPUs"
    rep = GPUReader(None, "pynvml not importable: No module named 'pynvml'").read()
    assert rep.gpus == [] and "pynvml" in rep.error


def test_real_pynvml_on_this_machine():
    """The real path (pynvml module as backend) never raises. Without an NVIDIA
    driver (as on CI) it reports zero GPUs and why."""
    nvml, reason = load_pynvml()
    rep = GPUReader(nvml, reason).read()
    if not os.path.exists("/dev/nvidiactl"):
        assert rep.gpus == [] and rep.error
    else:
        assert rep.gpus or rep.error


def test_slurm_job_from_environ_and_cgroup(tmp_path):
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "environ").write_bytes(b"PATH=/bin\0SLURM_JOB_ID=4321\0SLURM_STEP_ID=0\0")
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_987/step_0/user/task_0\n")
    (tmp_path / "13").mkdir()
    (tmp_path / "13" / "cgroup").write_text("0::/user.slice\n")
    assert slurm_job_of_pid(11, str(tmp_path)) == "4321"
    assert slurm_job_of_pid(12, str(tmp_path)) == "987"
    assert slurm_job_of_pid(13, str(tmp_path)) is None
    assert slurm_job_of_pid(14, str(tmp_path)) is None  # no such process


def test_slurm_job_of_real_process():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                         env=dict(os.environ, SLURM_JOB_ID="5555"))
    try:  # right after spawn /proc may still show the pre-exec environment
        assert wait_until(lambda: slurm_job_of_pid(p.pid) == "5555", timeout=10)
    finally:
        p.kill()
        p.wait()
