"""A real data-parallel JAX job (examples/jax_allreduce.py: Flax, jax.distributed over gloo on CPU, orbax
checkpoints) under dl2d's Slurm backend on the real local Slurm (4 nodes x 4 fake GPUs): started as 2
processes on 2 nodes, shrunk to 1 and grown to 3 by checkpoint-restart. Every global step runs exactly once,
and the parameters at the end equal those of one uninterrupted process that trained the same steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dl2d.daemon.backend import FINISHED, RESTART, RUNNING, START, JobRequest, Target
from dl2d.daemon.slurm.backend import SlurmBackend
from dl2d.daemon.slurm.settings import SlurmBackendConfig

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "jax_allreduce.py"
STEPS = 150
SEED = 3


def example_command(extra: str = "") -> str:
    return (f"{sys.executable} {EXAMPLE} --steps {STEPS} --seed {SEED} --checkpoint-every 40 --step-seconds 0.05"
            ' --step-log "$DL2D_JOB_DIR/steps.log" --params-out "$DL2D_JOB_DIR/params.npz"' + extra)


def allreduce_request(job_id: int, command: str) -> JobRequest:
    # 4 GPUs per worker: one process per node, so the process count is the node count
    return JobRequest(job_id=job_id, job_type="mlp", total_epochs=1.0, spec={
        "kind": "allreduce", "command": command, "time_limit_min": 10,
        "worker": {"gpus": 4, "cpus": 1, "mem_gb": 0}, "ps": {"gpus": 0, "cpus": 0, "mem_gb": 0}})


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("DL2D_", "SLURM_"))}


def reference_params(tmp_path: Path) -> dict[str, np.ndarray]:
    """The same steps in one process, never interrupted, outside Slurm."""
    out = tmp_path / "reference.npz"
    cp = subprocess.run([sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--seed", str(SEED),
                         "--checkpoint-dir", str(tmp_path / "reference-ckpt"), "--params-out", str(out)],
                        capture_output=True, text=True, timeout=300, env=clean_env(), cwd=REPO)
    assert cp.returncode == 0, cp.stderr[-3000:]
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def progress(b: SlurmBackend, job_id: int) -> dict:
    try:
        return json.loads((b.job_dir(job_id) / "job" / "progress.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def test_a_jax_job_is_started_at_2_shrunk_to_1_and_grown_to_3_losing_no_step(slurm, wait_for, tmp_path):
    ref = reference_params(tmp_path)
    b = SlurmBackend(slurm.driver(), SlurmBackendConfig(state_dir=tmp_path / "state", workdir=str(REPO),
                                                        run_jobs_as="daemon",  # the test's (root's) jobs
                                                        checkpoint_timeout_s=60))
    job = allreduce_request(401, example_command())

    def running_at(world: int, past_step: int):
        def check():
            st = b.observe().get(401)
            p = progress(b, 401)
            if st is None or st.state != RUNNING or p.get("world_size") != world \
                    or p.get("state") != "running" or p.get("step", 0) <= past_step:
                return None
            return st, p
        return wait_for(check, 120, f"the job running as {world} processes past step {past_step}")

    assert b.apply(job, Target(2, 0)).method == START
    st, p = running_at(2, 5)
    assert len(st.nodes) == 2 and p["runs"] == 1
    assert b.apply(job, Target(1, 0)).method == RESTART  # one process per worker: a new size is a new run
    st, p1 = running_at(1, p["step"])
    assert len(st.nodes) == 1 and p1["runs"] == 2 and p1["resumed_from"] >= p["step"]
    assert b.apply(job, Target(3, 0)).method == RESTART
    st, p2 = running_at(3, p1["step"])
    assert len(st.nodes) == 3 and p2["runs"] == 3 and p2["resumed_from"] >= p1["step"]
    assert b.apply(job, Target(3, 0)).method != RESTART  # at its size: left alone

    wait_for(lambda: (s := b.observe().get(401)) is not None and s.state == FINISHED, 300, "the job done")
    final = progress(b, 401)
    assert (final["state"], final["step"], final["runs"], final["lost_steps"]) == ("done", STEPS, 3, 0)
    assert b.observe()[401].epochs_done == pytest.approx(1.0)

    # every global step ran exactly once, in order, at the sizes dl2d gave
    log = [tuple(map(int, line.split())) for line in (b.job_dir(401) / "job" / "steps.log").read_text().splitlines()]
    assert [s for _, s in log] == list(range(1, STEPS + 1))
    sizes = [w for w, _ in log]
    assert [w for i, w in enumerate(sizes) if i == 0 or sizes[i - 1] != w] == [2, 1, 3]

    with np.load(b.job_dir(401) / "job" / "params.npz") as z:
        got = {k: z[k] for k in z.files}
    assert got.keys() == ref.keys()
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_job_that_ignores_the_signal_is_killed_after_the_deadline_and_its_lost_steps_reported(slurm, wait_for,
                                                                                                tmp_path):
    """It breaks the contract: dl2d waits the deadline, cancels it, starts it at the new size; it resumes from
    the last checkpoint it did save (none: it saves only on the signal it ignores), and every step it had
    reported is lost work, in its progress and in what the backend reports to the daemon. (With periodic saves
    the lost steps could be 0 by timing: a kill landing right after a save, as one CI run saw.)"""
    b = SlurmBackend(slurm.driver(), SlurmBackendConfig(state_dir=tmp_path / "state", workdir=str(REPO),
                                                        run_jobs_as="daemon",  # the test's (root's) jobs
                                                        checkpoint_timeout_s=8))
    steps = 2000  # it trains on through the 8 s deadline
    command = (f"{sys.executable} {EXAMPLE} --steps {steps} --checkpoint-every 0 --step-seconds 0.05"
               " --ignore-signal")
    job = allreduce_request(402, command)
    assert b.apply(job, Target(2, 0)).method == START
    wait_for(lambda: progress(b, 402).get("step", 0) > 30, 120, "the job 30 steps in")
    assert b.apply(job, Target(1, 0)).method == RESTART  # it ignores USR1: killed after 8 s
    after = wait_for(lambda: (p := progress(b, 402)).get("runs") == 2 and p.get("state") == "running" and p,
                     120, "the second run going")
    assert after["world_size"] == 1 and after["resumed_from"] == 0 and after["lost_steps"] > 30
    st = b.observe()[402]
    assert st.lost_epochs == pytest.approx(after["lost_steps"] / steps)  # 1 epoch = all its steps
