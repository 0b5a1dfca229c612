"""Which run of a job this is: dl2d restarts a job by submitting a new Slurm job, so ``SLURM_RESTART_COUNT`` is 0
on every run; the count that goes on is the progress file's ``runs``, and the example jobs print it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import dl2d.job

REPO = Path(__file__).resolve().parents[2]


def contract_env(tmp_path: Path, rank: int = 0, world: int = 1) -> dict[str, str]:
    env = {"DL2D_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "DL2D_PROGRESS_FILE": str(tmp_path / "progress.json"),
           "SLURM_RESTART_COUNT": "0"}  # what every run dl2d resubmits sees
    if world > 1:
        env.update(SLURM_PROCID=str(rank), SLURM_NTASKS=str(world), SLURM_LOCALID=str(rank),
                   DL2D_COORDINATOR="127.0.0.1:29500")
    return env


def test_rank_0_counts_its_runs_from_the_progress_file(tmp_path):
    seen = []
    for _ in range(3):
        run = dl2d.job.start(total_steps=10, env=contract_env(tmp_path), install_handlers=False)
        assert run.run_number is None  # not before resumed(): the file is read there
        run.resumed(0)
        seen.append(run.run_number)
        run.checkpointed(0)
    assert seen == [1, 2, 3]


def test_other_ranks_do_not_read_the_progress_file_and_say_so(tmp_path):
    run = dl2d.job.start(total_steps=10, env=contract_env(tmp_path, rank=1, world=2), install_handlers=False)
    run.resumed(0)
    assert run.run_number is None


def test_the_jax_example_prints_the_run_number_not_slurms_restart_count(tmp_path):
    pytest.importorskip("flax")
    pytest.importorskip("orbax.checkpoint")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("DL2D_", "SLURM_"))},
           **contract_env(tmp_path)}
    outs = []
    for _ in range(2):  # the second run resumes where the first ended
        cp = subprocess.run([sys.executable, str(REPO / "examples" / "jax_allreduce.py"), "--steps", "4"],
                            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert cp.returncode == 0, cp.stderr[-3000:]
        outs.append(cp.stdout)
    assert "run 1: 1 processes, resuming at step 0" in outs[0], outs[0]
    assert "run 2: 1 processes, resuming at step 4" in outs[1], outs[1]
