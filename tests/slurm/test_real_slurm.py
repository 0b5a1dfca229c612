"""The CLI driver against a real Slurm (4 nodes x 4 fake GPUs on localhost, see conftest)."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from dl2d.slurm.backoff import BackoffPolicy, RetryingDriver
from dl2d.slurm.driver import JobSpec, SlurmDriver, SlurmJob, SlurmUnavailable

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]


def find_job(driver: SlurmDriver, job_id: str) -> SlurmJob | None:
    return next((j for j in driver.jobs() if j.job_id == job_id), None)


def job_in(driver: SlurmDriver, job_id: str, state: str, num_nodes: int | None = None):
    """The job when it is in ``state`` (and has ``num_nodes``), else None — for wait_for."""
    job = find_job(driver, job_id)
    if job and job.state == state and (num_nodes is None or job.num_nodes == num_nodes):
        return job
    return None


def sleep_spec(slurm, name: str, nodes: int, gpus: int, seconds: int = 300, **kw) -> JobSpec:
    return JobSpec(name=name, command=f"sleep {seconds}", nodes=nodes, gpus_per_node=gpus,
                   output=str(slurm.dir / f"{name}-%j.out"), time_limit_min=10, **kw)


def demo_spec(slurm, work: Path, nodes: int, epochs: int, name: str = "demo") -> JobSpec:
    # exec: the program is the batch script itself, so it receives the checkpoint signal.
    cmd = (f"exec {sys.executable} -m dl2d.slurm.demo_job --epochs {epochs}"
           f" --checkpoint {work}/ckpt.json --progress {work}/progress.json"
           f" --seconds-per-epoch 0.5")
    return JobSpec(name=name, command=cmd, nodes=nodes, gpus_per_node=1, workdir=str(REPO),
                   output=str(work / "job-%j.out"), time_limit_min=10, dl2d_job_id=name)


def read_progress(work: Path) -> dict:
    try:
        return json.loads((work / "progress.json").read_text())
    except FileNotFoundError:
        return {}


def test_nodes_have_fake_gpus(slurm):
    nodes = {n.name: n for n in slurm.driver().nodes()}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    for n in nodes.values():
        assert n.usable, n
        assert (n.cpus, n.gpus) == (16, 4), n


def test_submit_multi_node_gpu_job_shrink_and_cancel(slurm, wait_for):
    d = slurm.driver()
    job_id = d.submit(sleep_spec(slurm, "shrinkme", nodes=3, gpus=2, dl2d_job_id="job-42"))
    job = wait_for(lambda: job_in(d, job_id, "RUNNING"), 20, "the 3-node job to run")
    assert job.num_nodes == 3 and len(job.nodes) == 3
    assert job.gpus_per_node == 2
    assert job.dl2d_job_id == "job-42"
    assert sum(n.gpus_alloc for n in d.nodes()) == 6

    d.shrink(job_id, 1)
    job = wait_for(lambda: job_in(d, job_id, "RUNNING", num_nodes=1), 10, "the job at 1 node")
    assert job.nodes == (job.batch_host,)  # Slurm keeps the batch host
    wait_for(lambda: sum(n.gpus_alloc for n in d.nodes()) == 2, 10, "released GPUs")

    d.cancel(job_id)
    job = wait_for(lambda: (j := find_job(d, job_id)) and not j.active and j, 15, "cancellation")
    assert job.state == "CANCELLED"
    d.cancel(job_id)  # cancelling a finished job is not an error


def test_checkpoint_then_requeue_bigger_resumes(slurm, wait_for, tmp_path):
    """Grow 2 → 3 nodes the only way 22.05 allows: checkpoint, requeue at the new size, resume."""
    d = slurm.driver()
    job_id = d.submit(demo_spec(slurm, tmp_path, nodes=2, epochs=8))
    wait_for(lambda: read_progress(tmp_path).get("epoch", 0) >= 2, 30, "two epochs")

    d.signal(job_id, "USR1")
    wait_for(lambda: read_progress(tmp_path).get("status") == "checkpointed", 10, "the checkpoint")
    saved = json.loads((tmp_path / "ckpt.json").read_text())["epoch"]
    assert 2 <= saved < 8
    wait_for(lambda: (j := find_job(d, job_id)) and not j.active, 15, "the job to end")

    t0 = time.monotonic()
    d.requeue(job_id, num_nodes=3)
    # Held for AuthInfo cred_expire (10 s in the local Slurm) before it may run again.
    job = wait_for(lambda: job_in(d, job_id, "RUNNING", num_nodes=3), 30, "the job at 3 nodes")
    requeue_to_running = time.monotonic() - t0
    assert job.restarts == 1

    progress = wait_for(lambda: (p := read_progress(tmp_path)).get("status") == "done" and p,
                        30, "the resumed run to finish")
    assert progress["resumed_from"] == saved
    assert progress["runs"] == 2
    assert progress["epoch"] == 8
    assert progress["slurm_job_id"] == job_id
    assert progress["nodes"] == "node[1-3]"
    assert requeue_to_running < 20, f"requeued job took {requeue_to_running:.1f}s to start"


def test_checkpoint_then_resubmit_smaller_resumes(slurm, wait_for, tmp_path):
    """The other relaunch path: a new Slurm job at the new size resumes the checkpoint."""
    d = slurm.driver()
    first = d.submit(demo_spec(slurm, tmp_path, nodes=2, epochs=6))
    wait_for(lambda: read_progress(tmp_path).get("epoch", 0) >= 1, 30, "an epoch")
    d.signal(first, "TERM")
    wait_for(lambda: read_progress(tmp_path).get("status") == "checkpointed", 10, "the checkpoint")
    saved = read_progress(tmp_path)["epoch"]

    second = d.submit(demo_spec(slurm, tmp_path, nodes=1, epochs=6))
    progress = wait_for(lambda: (p := read_progress(tmp_path)).get("status") == "done" and p,
                        30, "the resubmitted run to finish")
    assert second != first
    assert (progress["resumed_from"], progress["slurm_job_id"]) == (saved, second)


def test_drain_and_resume_node(slurm, wait_for):
    d = slurm.driver()
    d.drain_node("node4", "dl2d test: bad GPU")
    node = next(n for n in d.nodes() if n.name == "node4")
    assert node.drained and not node.usable and node.gpus_free == 0
    assert node.reason == "dl2d test: bad GPU"

    job_id = d.submit(sleep_spec(slurm, "fourwide", nodes=4, gpus=1))
    time.sleep(2)
    assert find_job(d, job_id).state == "PENDING"

    d.resume_node("node4")
    wait_for(lambda: job_in(d, job_id, "RUNNING", num_nodes=4), 20, "the 4-node job to start")
    assert next(n for n in d.nodes() if n.name == "node4").usable


def test_controller_outage_raises_quickly_then_recovers(slurm, wait_for):
    d = slurm.driver(timeout=8)
    survivor = d.submit(sleep_spec(slurm, "survivor", nodes=1, gpus=1))
    wait_for(lambda: job_in(d, survivor, "RUNNING"), 20, "a running job")

    slurm.stop_controller()  # SIGTERM: like `systemctl stop slurmctld`
    assert d.ping() is False
    for call in (d.jobs, d.nodes):
        t0 = time.monotonic()
        with pytest.raises(SlurmUnavailable):
            call()
        assert time.monotonic() - t0 < 10
    with pytest.raises(SlurmUnavailable):
        d.submit(sleep_spec(slurm, "lost", nodes=1, gpus=0))

    # The daemon's view: a retrying driver rides out the outage.
    retries: list[float] = []
    retrying = RetryingDriver(d, BackoffPolicy(base=0.5, cap=2, max_attempts=None, max_elapsed=60),
                              on_retry=lambda attempt, delay, err: retries.append(delay))
    # Slurm's clients themselves keep trying for ~MessageTimeout (5 s here) before failing, so
    # the outage must outlast one such call for the wrapper to have to retry.
    restarter = threading.Timer(7.0, slurm.start)
    restarter.start()
    try:
        t0 = time.monotonic()
        jobs = retrying.jobs()
        outage = time.monotonic() - t0
    finally:
        restarter.join()
    assert retries, "expected at least one retry during the outage"
    assert outage < 40
    assert d.ping() is True
    assert any(j.job_id == survivor and j.state == "RUNNING" for j in jobs)
    job_id = d.submit(sleep_spec(slurm, "after", nodes=1, gpus=1))
    wait_for(lambda: job_in(d, job_id, "RUNNING"), 20, "a job submitted after recovery")
