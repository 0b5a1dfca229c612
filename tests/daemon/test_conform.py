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

from dl2d.daemon.backend import PENDING, RESTART, RUNNING, START, JobRequest, Target
from dl2d.daemon.conform.compare import Costs, WorldRecord, compare, ordering, restart_costs
from dl2d.daemon.conform.twin import WAITING, SlurmTwin
from dl2d.daemon.conform.trace import make_trace, slurm_layout, speed_curve
from dl2d.daemon.conform.worlds import ClusterShape, run_twin
from dl2d.daemon.plan import even_workers
from dl2d.sim import allreduce
from dl2d.sim.cluster import ClusterSpec


def test_the_trace_is_seeded_and_its_curves_are_the_measured_throughput_on_slurms_layout():
    a, b = make_trace(seed=3), make_trace(seed=3)
    assert a == b and a != make_trace(seed=4) and len(a) == 12 and a[0].arrival == 0
    assert slurm_layout(9, 4) == [0, 0, 0, 1, 1, 1, 2, 2, 2] and slurm_layout(3, 4) == [0, 0, 0]
    job = a[0]
    curve = dict(speed_curve(job.model, job.batch, 4, 16))
    assert curve[6] == pytest.approx(allreduce.epoch_rates([job.model], [job.batch], [[0, 0, 0, 1, 1, 1]], [1])[0])
    for j in a:  # a few slots of 3 s at its asked size
        assert 3 * 3.0 * 0.99 <= j.epochs / dict(j.speed)[j.workers] <= 10 * 3.0 * 1.01


def test_the_jax_jobs_are_the_recipe_as_written_and_leave_the_demo_jobs_as_they_were():
    from dl2d.daemon.conform.trace import jax_example, submission

    plain, both = make_trace(seed=0), make_trace(seed=0, jax_jobs=2)
    assert both[:12] == plain and [j.name for j in both[12:]] == ["cf-jax-0", "cf-jax-1"]
    job = both[12]
    assert job.program == "jax" and job.speed == () and 1 <= job.arrival < 8
    spec = submission(job, "/opt/dl2d/venv/bin/python", "alice")
    # docs/jobs.md: --arch allreduce --type mlp --epochs 1 --workers 2 --max-workers 4, by absolute paths
    assert (spec["kind"], spec["job_type"], spec["total_epochs"], spec["workers"], spec["max_workers"]) == \
        ("allreduce", "mlp", 1.0, 2, 4)
    assert "launch" not in spec and spec["label"] == "jax-mlp"  # one process a worker (srun), its own class
    assert spec["command"].startswith(f"/opt/dl2d/venv/bin/python {jax_example()} --steps ") and jax_example().is_file()


def test_the_twin_trains_a_job_at_the_curve_it_is_given(tmp_path):
    job = make_trace(num_jobs=2, seed=0, jax_jobs=1)[2]
    curve = {1: 0.02, 2: 0.04, 3: 0.05, 4: 0.05}
    rec = run_twin([job], "slurm", 3.0, ClusterShape(4, 4, 16, 15.625), tmp_path, Costs(),
                   curves={job.name: curve}, job_costs={job.name: Costs(4.0, 4.0)})
    # slurm runs it at its ask, 2: 4 s of start, then 1 epoch at 0.04 a second
    assert rec.jct_s[job.name] == pytest.approx(4.0 + 1 / 0.04, abs=0.01)


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


def test_a_divergence_after_progress_apart_names_the_job_and_its_epochs_on_each_side():
    """Progress apart is measured against the further of the two worlds: a job that had trained on Slurm and
    not at all in the twin is 100 % apart, not a division by nothing."""
    real = _world("real", {(0, "a"): 2, (0, "b"): 1, (1, "a"): 4, (1, "b"): 1}, {"a": 3.0, "b": 3.0})
    twin = _world("twin", {(0, "a"): 2, (0, "b"): 1, (1, "a"): 2, (1, "b"): 1}, {"a": 3.0, "b": 3.0})
    real.arrival = twin.arrival = {"a": 0, "b": 0}
    real.epochs = {(0, "a"): 0.5, (0, "b"): 0.2, (1, "a"): 1.0, (1, "b"): 0.4}
    twin.epochs = {(0, "a"): 0.5, (0, "b"): 0.0, (1, "a"): 1.0, (1, "b"): 0.2}
    first = compare(real, twin)["divergences"][0]
    assert (first["slot"], first["job"]) == (1, "a")
    assert first["cause"] == "progress differed by 100% (b had 0.2 epochs done on Slurm, 0 in the twin)"


def test_the_twin_runs_the_daemon_and_sizes_jobs_as_slurm_holds_them(tmp_path):
    jobs = make_trace(seed=0)
    rec = run_twin(jobs, "drf", 3.0, ClusterShape(4, 4, 16, 15.625), tmp_path, Costs(1.0, 1.5, 0.5))
    assert len(rec.jct_s) == len(jobs)  # every job finished
    assert all(w == even_workers(w, 4) for w in rec.alloc.values())  # no size Slurm would round up
    per_slot = {}
    for (slot, _), w in rec.alloc.items():
        per_slot[slot] = per_slot.get(slot, 0) + w
    assert max(per_slot.values()) <= 16
    s = rec.summary()
    assert s["starts"] >= len(jobs) and sum(s["resizes"].values()) > 0


def _request(job_id: int, epochs: float, workers: int = 1) -> JobRequest:
    return JobRequest(job_id, "cifar10", epochs, {"name": f"j{job_id}", "kind": "allreduce", "batch_size": 128.0,
                                                  "workers": workers, "launch": "once",
                                                  "worker": {"gpus": 1, "cpus": 1, "mem_gb": 0.1}})


def test_the_twin_places_as_slurm_a_job_waits_for_a_node_and_starts_when_one_frees_mid_slot():
    twin = SlurmTwin(ClusterSpec(2, 4, 16, 16.0), 10.0, start_time=0.0, costs=Costs(1.0, 2.0))
    rate3 = allreduce.epoch_rates(["cifar10"], [128.0], [[0, 0, 0]], [1])[0]
    with twin.batch():
        twin.apply(_request(1, rate3 * 4.0), Target(3, 0))  # ends 1 s (start) + 4 s into the first slot
        twin.apply(_request(2, 100.0), Target(3, 0))
        twin.apply(_request(3, 100.0), Target(2, 0))  # 2 GPUs free in all, 1 on each node: waits
    st = twin.observe()
    assert (st[1].state, st[2].state, st[3].state) == (RUNNING, RUNNING, PENDING)
    assert st[1].nodes == ("sim001",) and st[2].nodes == ("sim002",) and st[3].message == WAITING
    twin.end_slot(10.0)
    st = twin.observe()
    assert st[1].state == "finished" and st[1].finished_at.timestamp() == pytest.approx(5.0)
    assert st[3].state == RUNNING and st[3].nodes == ("sim001",)  # started when job 1 left, at 5 s
    rate2 = allreduce.epoch_rates(["cifar10"], [128.0], [[0, 0]], [1])[0]
    assert st[3].epochs_done == pytest.approx(rate2 * (10.0 - 5.0 - 1.0))  # the rest of the slot, less its start
    # a job that cannot scale in place changes size by a restart, and waits for its new allocation
    res = twin.apply(_request(3, 100.0), Target(6, 0))  # 3 on each node: sim002 has 1 free (job 2 holds 3)
    assert res.method == RESTART and not res.running and twin.observe()[3].state == PENDING
    assert twin.apply(_request(4, 1.0), Target(1, 0)).method == START


def test_restart_costs_are_the_slot_less_the_training_its_epochs_took():
    rec = _world("real", {(0, "a"): 2, (1, "a"): 2, (2, "a"): 1}, {"a": 100.0})
    rec.slot_s = 3.0
    rec.ran = {(0, "a"): 2, (1, "a"): 2, (2, "a"): 1}
    rec.epochs = {(0, "a"): 2.0, (1, "a"): 8.0, (2, "a"): 9.5}  # 2 epochs/s at 2 workers, 1 at 1
    rec.events = [(0, "a", "start"), (2, "a", "relaunch")]
    costs = restart_costs(rec, {"a": {1: 1.0, 2: 2.0}})
    assert (costs.start_s, costs.restart_s, costs.release_s) == pytest.approx((2.0, 1.5, 0.0))
    rec.job_apply_at = {(0, "a"): 0.5, (2, "a"): 1.0}  # the daemon carried them out that far into the slots
    costs = restart_costs(rec, {"a": {1: 1.0, 2: 2.0}})
    assert (costs.start_s, costs.restart_s) == pytest.approx((1.5, 0.5))


def test_a_start_that_outlasts_its_slot_costs_all_the_slots_it_took():
    """A JAX job's 4 processes import and compile for 2 slots of 3 s and most of a third, then train at 1/s."""
    rec = _world("real", {(k, "a"): 4 for k in range(5)}, {"a": 100.0})
    rec.slot_s, rec.ran = 3.0, {(k, "a"): 4 for k in range(5)}
    rec.epochs = {(0, "a"): 0.0, (1, "a"): 0.0, (2, "a"): 0.5, (3, "a"): 3.5, (4, "a"): 6.5}
    rec.events = [(0, "a", "start")]
    assert restart_costs(rec, {"a": {4: 1.0}}).start_s == pytest.approx(8.5)  # 4 slots, 3.5 epochs trained


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


def test_the_twin_shrinks_in_place_where_the_nodes_kept_hold_just_the_new_size():
    twin = SlurmTwin(ClusterSpec(4, 4, 16, 16.0), 10.0, start_time=0.0, costs=Costs(0.0, 2.0))
    twin.apply(_request(1, 100.0), Target(9, 0))  # 3 nodes of 3
    assert twin.observe()[1].nodes == ("sim001", "sim002", "sim003")
    res = twin.apply(_request(1, 100.0), Target(6, 0))
    assert res.method == "shrink" and res.running and twin.observe()[1].nodes == ("sim001", "sim002")
    res = twin.apply(_request(1, 100.0), Target(4, 0))  # 2 nodes of 3 would hold 6: a relaunch on one of 4
    assert res.method == RESTART and twin.observe()[1].nodes == ("sim001",)


def test_in_the_twin_a_start_on_nodes_a_stopped_job_is_leaving_waits_for_their_release():
    twin = SlurmTwin(ClusterSpec(1, 4, 16, 16.0), 10.0, start_time=0.0, costs=Costs(1.0, 1.0, 2.0),
                     applied_at=lambda slot, job: 0.5)
    twin.apply(_request(1, 100.0, workers=4), Target(4, 0))
    twin.end_slot(10.0)
    with twin.batch():
        twin.apply(_request(1, 100.0), Target(0, 0))  # stopped at 0.5 s: its GPUs are free at 2.5 s
        twin.apply(_request(2, 100.0), Target(4, 0))
    assert twin.observe()[2].state == PENDING and twin.observe()[2].message == WAITING
    twin.end_slot(10.0)
    rate4 = allreduce.epoch_rates(["cifar10"], [128.0], [[0, 0, 0, 0]], [1])[0]
    st = twin.observe()[2]
    assert st.state == RUNNING and st.epochs_done == pytest.approx(rate4 * (10.0 - 2.5 - 1.0))  # then its launch


def test_the_demo_job_follows_its_target_file_when_shrunk_or_grown_in_place(tmp_path):
    target = tmp_path / "target.json"
    target.write_text('{"workers": 1, "ps": 0}')
    env = {**os.environ, "DL2D_WORKERS": "1", "DL2D_TARGET_FILE": str(target)}
    p = subprocess.Popen([sys.executable, "-m", "dl2d.slurm.demo_job", "--epochs", "1.2", "--speed", "1:0.5,2:2.0",
                          "--checkpoint", str(tmp_path / "ckpt.json"), "--progress", str(tmp_path / "p.json"),
                          "--report-s", "0.05"], env=env)
    deadline = time.monotonic() + 30
    while not (tmp_path / "p.json").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    target.write_text('{"workers": 2, "ps": 0}')  # dl2d rewrote it: 4 times as fast from here
    first = json.loads((tmp_path / "p.json").read_text())  # its first record, written as it starts training
    assert p.wait(timeout=30) == 0
    last = json.loads((tmp_path / "p.json").read_text())
    # at 1 worker's 0.5 epochs/s alone the 1.2 epochs take 2.4 s: by its own clock (its records' times, not
    # this test's polling) it finished well before, at 2 workers' speed (0.6 s from the rewrite)
    assert last["status"] == "done" and last["time"] - first["time"] < 2.0, (first, last)
