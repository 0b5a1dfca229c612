"""The conformance harness's view of a Slurm it does not have to itself (the real local Slurm, conftest): its
per-slot check counts only the trace's Slurm jobs, and a run refuses to start while other jobs hold GPUs (the twin
has the whole cluster)."""
from __future__ import annotations

import pytest

from dl2d.daemon.conform.worlds import SlurmWatch, wait_idle
from dl2d.slurm.driver import JobSpec

pytestmark = pytest.mark.slurm


def test_the_slot_check_counts_the_traces_jobs_and_a_busy_cluster_is_refused(slurm, wait_for, strangers_job):
    stranger = strangers_job(4)
    driver = slurm.driver()
    mine = driver.submit(JobSpec(name="cf-slurm-1", command="sleep 600", workdir="/tmp", output="/dev/null",
                                 gpus_per_node=2))
    wait_for(lambda: all(driver.job(j).state == "RUNNING" for j in (stranger, mine)), 30, "both jobs running")
    assert SlurmWatch(driver, prefix="cf-slurm-").held() == 2  # the stranger's 4 are not the trace's
    assert SlurmWatch(driver, prefix="cf-elastic-").held() == 0
    with pytest.raises(RuntimeError) as e:
        wait_idle(driver, timeout_s=1.0, poll_s=0.2)
    assert "Slurm holds 6 GPUs" in str(e.value) and f"{stranger} (nobody)" in str(e.value)
    for j in (stranger, mine):
        driver.cancel(j)
    wait_idle(driver, timeout_s=30.0)  # released: the run may start
