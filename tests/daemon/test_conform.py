"""The conformance harness's pure parts and its twin (dl2d.daemon.conform), and the demo program's declared
speed curve that lets a real job train as fast as its twin."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dl2d.daemon.conform.compare import WorldRecord, compare, ordering
from dl2d.daemon.conform.trace import make_trace, slurm_layout, speed_curve
from dl2d.daemon.conform.worlds import ClusterShape, run_twin
from dl2d.daemon.plan import even_workers
from dl2d.sim import allreduce


def test_the_trace_is_seeded_and_its_curves_are_the_measured_throughput_on_slurms_layout():
    a, b = make_trace(seed=3), make_trace(seed=3)
    assert a == b and a != make_trace(seed=4) and len(a) == 12 and a[0].arrival == 0
    assert slurm_layout(9, 4) == [0, 0, 0, 1, 1, 1, 2, 2, 2] and slurm_layout(3, 4) == [0, 0, 0]
    job = a[0]
    curve = dict(speed_curve(job.model, job.batch, 4, 16))
    assert curve[6] == pytest.approx(allreduce.epoch_rates([job.model], [job.batch], [[0, 0, 0, 1, 1, 1]], [1])[0])
    for j in a:  # a few slots of 3 s at its asked size
        assert 3 * 3.0 * 0.99 <= j.epochs / dict(j.speed)[j.workers] <= 10 * 3.0 * 1.01


def _world(name, alloc, finish, slots=4):
    return WorldRecord(world=name, policy="p", gpus=4, slots=slots, alloc=alloc, ran=dict(alloc),
                       epochs={k: 1.0 for k in alloc}, flags={}, events=[(0, "a", "start"), (2, "a", "relaunch")],
                       arrival={"a": 0, "b": 1}, finish_s=finish, jct_s=dict(finish), slot_s=1.0)


def test_compare_counts_job_slots_and_names_the_first_divergence():
    real = _world("real", {(0, "a"): 2, (1, "a"): 2, (1, "b"): 2, (2, "a"): 4}, {"a": 3.0, "b": 2.0})
    twin = _world("twin", {(0, "a"): 2, (1, "a"): 2, (1, "b"): 2, (2, "a"): 2, (2, "b"): 2}, {"a": 3.5, "b": 3.0})
    rep = compare(real, twin)
    # job-slots: a in 0-2 and 3 (the twin's a runs into slot 3), b in 1 and 2 (twin only): 6; a in 0, 1 and 3
    # (0 in both) and b in 1 agree
    assert (rep["job_slots"], rep["same_allocation"]) == (6, 4)
    first = rep["divergences"][0]
    assert (first["slot"], first["job"], first["real"], first["twin"]) == (2, "a", 4, 2)
    assert rep["real"]["resizes"]["relaunch"] == 1 and rep["real"]["starts"] == 1
    assert rep["avg_jct_ratio"] == pytest.approx(2.5 / 3.25, abs=1e-4)
    assert ordering([rep, {**rep, "policy": "q", "real": {"avg_jct_s": 1.0}}], "real") == ["q", "p"]


def test_the_twin_runs_the_daemon_and_sizes_jobs_as_slurm_holds_them(tmp_path):
    jobs = make_trace(seed=0)
    rec = run_twin(jobs, "drf", 3.0, ClusterShape(4, 4, 16, 15.625), tmp_path, restart_s=1.0)
    assert len(rec.jct_s) == len(jobs)  # every job finished
    assert all(w == even_workers(w, 4) for w in rec.alloc.values())  # no size Slurm would round up
    per_slot = {}
    for (slot, _), w in rec.alloc.items():
        per_slot[slot] = per_slot.get(slot, 0) + w
    assert max(per_slot.values()) <= 16
    s = rec.summary()
    assert s["starts"] >= len(jobs) and sum(s["resizes"].values()) > 0


def _demo(tmp_path, epochs: float, speed: str, workers: int):
    env = {**os.environ, "DL2D_WORKERS": str(workers)}
    return subprocess.Popen([sys.executable, "-m", "dl2d.slurm.demo_job", "--epochs", str(epochs), "--speed", speed,
                             "--checkpoint", str(tmp_path / "ckpt.json"), "--progress", str(tmp_path / "p.json"),
                             "--report-s", "0.1"], env=env, stdout=subprocess.PIPE, text=True)


def test_the_demo_job_trains_at_its_declared_speed_for_its_workers_and_checkpoints_the_fraction(tmp_path):
    t0 = time.monotonic()
    p = _demo(tmp_path, 0.6, "1:0.25,2:1.0,4:1.5", workers=2)  # 0.6 epochs at 1 epoch/s
    assert p.wait(timeout=30) == 0
    took = time.monotonic() - t0
    done = json.loads((tmp_path / "p.json").read_text())
    assert done["status"] == "done" and done["epoch"] == pytest.approx(0.6) and took >= 0.6
    for f in ("p.json", "ckpt.json"):
        (tmp_path / f).unlink()
    p = _demo(tmp_path, 100.0, "1:1.0", workers=3)  # a size the curve lacks: the nearest smaller one's speed
    deadline = time.monotonic() + 30
    while not (tmp_path / "p.json").exists() or json.loads((tmp_path / "p.json").read_text())["epoch"] < 0.3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    p.send_signal(signal.SIGUSR1)
    assert p.wait(timeout=30) == 0
    saved = json.loads((tmp_path / "ckpt.json").read_text())["epoch"]
    assert 0.3 <= saved < 100 and saved != int(saved)  # the fraction trained, kept
    p = _demo(tmp_path, saved + 0.2, "1:1.0", workers=1)  # resumed from it
    assert p.wait(timeout=30) == 0
    again = json.loads((tmp_path / "p.json").read_text())
    assert again["resumed_from"] == pytest.approx(saved) and again["epoch"] == pytest.approx(saved + 0.2)
