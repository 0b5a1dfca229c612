"""dl2d.job as a training script uses it: a real process that trains steps, is signalled, saves, exits with
the contract's status, and resumes where its checkpoint ends; the progress it reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import dl2d.job
from dl2d.job.progress import next_report, resumed_report

#: A training script of 400 steps of 10 ms that follows the contract with dl2d.job's checkpoints.
SCRIPT = """
import sys, time
import dl2d.job
run = dl2d.job.start(total_steps=400)
latest = run.checkpoints.latest()
step = latest.step if latest else 0
run.resumed(step)
print("resumed", step, flush=True)
while step < run.total_steps:
    if run.stop_requested and "--ignore-signal" not in sys.argv:
        with run.checkpoints.save(step) as d:
            (d / "step.txt").write_text(str(step))
        run.exit_checkpointed(step)
    time.sleep(0.01)
    step += 1
    run.step_done(step, samples=step * 32)
    if step % 100 == 0:
        with run.checkpoints.save(step) as d:
            (d / "step.txt").write_text(str(step))
run.finished(step)
"""


def job_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DL2D_", "SLURM_"))}
    env.update(DL2D_CHECKPOINT_DIR=str(tmp_path / "ckpt"), DL2D_PROGRESS_FILE=str(tmp_path / "progress.json"),
               DL2D_TOTAL_EPOCHS="4", DL2D_CHECKPOINT_DEADLINE_S="5")
    return env


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, *args], env=job_env(tmp_path), stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().startswith("resumed")
    return p


def report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "progress.json").read_text())


def wait_step(tmp_path: Path, step: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if report(tmp_path).get("step", 0) >= step:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"the job never reported step {step}")


@pytest.mark.parametrize("sig, status", [(signal.SIGUSR1, 0), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_the_checkpoint_signal_saves_exits_with_the_contracts_status_and_the_next_run_resumes(tmp_path, sig,
                                                                                              status):
    p = start(tmp_path)
    wait_step(tmp_path, 30)
    p.send_signal(sig)
    assert p.wait(10) == status
    r = report(tmp_path)
    saved = dl2d.job.Checkpoints(tmp_path / "ckpt").latest()
    assert r["state"] == "checkpointed" and saved.step == r["step"] >= 30
    assert (saved.path / "step.txt").read_text() == str(saved.step)

    p = start(tmp_path)  # the next run, at whatever size: resumes where the checkpoint ends
    r2 = report(tmp_path)
    assert (r2["resumed_from"], r2["runs"], r2["lost_steps"]) == (saved.step, 2, 0)
    assert p.wait(30) == 0
    done = report(tmp_path)
    assert (done["state"], done["step"], done["total_steps"], done["epochs"]) == ("done", 400, 400, 4.0)


def test_a_run_killed_before_it_saved_resumes_from_its_last_checkpoint_and_counts_the_lost_steps(tmp_path):
    p = start(tmp_path, "--ignore-signal")
    wait_step(tmp_path, 120)
    p.send_signal(signal.SIGUSR1)  # ignored: it breaks the contract ...
    time.sleep(0.05)
    assert p.poll() is None
    p.kill()  # ... so it is killed, as dl2d does after the deadline
    p.wait(10)
    last = report(tmp_path)["step"]
    p = start(tmp_path)
    r = report(tmp_path)
    saved = dl2d.job.Checkpoints(tmp_path / "ckpt").latest().step  # saved every 100 steps
    assert r["resumed_from"] == saved and r["lost_steps"] == last - saved > 0
    p.send_signal(signal.SIGUSR1)
    p.wait(10)


def test_progress_is_replaced_atomically_a_reader_never_sees_part_of_a_report(tmp_path):
    run = dl2d.job.JobRun(dl2d.job.contract_from_env(job_env(tmp_path)), 5000, install_handlers=False,
                          progress_interval_s=0)
    run.resumed(0)
    bad: list[str] = []
    stop = threading.Event()

    def read():
        while not stop.is_set():
            text = (tmp_path / "progress.json").read_text()
            try:
                json.loads(text)
            except ValueError:
                bad.append(text)

    reader = threading.Thread(target=read)
    reader.start()
    for step in range(1, 2001):
        run.step_done(step, samples=step)
    stop.set()
    reader.join()
    assert not bad and report(tmp_path)["step"] == 2000


def test_the_report_rules():
    first = resumed_report(None, 0, 100, 2.0, 4, now=1.0)
    assert (first["runs"], first["lost_steps"], first["state"], first["samples"]) == (1, 0, "starting", 0)
    later = next_report(first, "running", 70, now=2.0, samples=700)
    again = resumed_report(later, 50, 100, 2.0, 2, now=3.0)  # 70 reported, the checkpoint holds 50
    assert (again["runs"], again["lost_steps"], again["resumed_from"], again["world_size"]) == (2, 20, 50, 2)
    assert resumed_report({"step": "x", "runs": True}, 0, 10, 1.0, 1, now=0.0)["runs"] == 1  # garbled: ignored
    with pytest.raises(ValueError, match="progress state must be one of"):
        next_report(first, "sleeping", 1, now=0.0)
    with pytest.raises(ValueError, match="resume step 11 outside 0..10"):
        dl2d.job.JobRun(dl2d.job.contract_from_env(job_env(Path("/nonexistent"))), 10,
                        install_handlers=False).resumed(11)
