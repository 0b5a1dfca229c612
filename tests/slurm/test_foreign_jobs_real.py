"""GPUs held by Slurm jobs that are not dl2d's (a user's own sbatch, a job planted with dl2d's name and comment)
are never counted free: the Slurm backend takes them off its nodes, so the daemon's view and its allocation
leave them alone. Real local Slurm (4 nodes x 4 fake GPUs, conftest)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dl2d.daemon.backend import JobRequest, Target
from dl2d.daemon.slurm.backend import SlurmBackend
from dl2d.daemon.slurm.settings import SlurmBackendConfig

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]


def sbatch(slurm, *args: str) -> str:
    cp = subprocess.run(["sbatch", "--parsable", "--mem=100M", "-c", "2", "-o", "/dev/null", *args,
                         "--wrap", "sleep 120"], capture_output=True, text=True,
                        env={"PATH": "/usr/bin:/bin", **slurm.env}, timeout=30)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout.strip().split(";")[0]


def test_gpus_of_jobs_that_are_not_dl2ds_are_taken_off_its_nodes(slurm, wait_for, tmp_path):
    b = SlurmBackend(slurm.driver(), SlurmBackendConfig(state_dir=tmp_path / "state", workdir=str(REPO),
                                                        run_jobs_as="daemon", job_name_prefix="fj-"))
    before = {n.name: (n.gpus, n.cpus) for n in b.nodes()}
    assert before["node1"] == (4, 16)
    own = sbatch(slurm, "-w", "node1", "--gres=gpu:3", "-J", "someones-own")
    planted = sbatch(slurm, "-w", "node2", "--gres=gpu:2", "-J", "fj-7", "--comment=dl2d:7")  # not in a record
    driver = slurm.driver()
    wait_for(lambda: all(j.state == "RUNNING" for j in driver.jobs() if j.job_id in (own, planted)), 60,
             "both foreign jobs running")
    # a job of dl2d's own on node3: its GPUs stay the daemon's to hand out
    job = JobRequest(job_id=1, job_type="cifar10", total_epochs=1,
                     spec={"kind": "allreduce", "batch_size": 128, "command": "sleep 120", "launch": "once",
                           "worker": {"gpus": 1, "cpus": 1, "mem_gb": 0.1}, "time_limit_min": 5})
    b.apply(job, Target(4, 0))
    wait_for(lambda: b.observe()[1].state == "running", 60, "dl2d's job running")
    after = {n.name: (n.gpus, n.cpus) for n in b.nodes()}
    assert after["node1"] == (1, 14) and after["node2"] == (2, 14)
    assert {k: v for k, v in after.items() if k not in ("node1", "node2")} == \
        {k: v for k, v in before.items() if k not in ("node1", "node2")}
    for j in (own, planted):
        driver.cancel(j)
    b.cancel(1)
    wait_for(lambda: {n.name: (n.gpus, n.cpus) for n in b.nodes()} == before, 60, "the nodes whole again")
