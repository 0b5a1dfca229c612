"""The simulated backend trains all-reduce jobs with the simulator's truth: the measured throughput of the GPUs
each holds on each node (packed beats spread where the data says so), the shared-node slowdown, the restart
cost of a resize, and the stated prior for a model never seen."""
from __future__ import annotations

import numpy as np
import pytest

from dl2d.daemon import jobmodel
from dl2d.daemon.backend import NOOP, SHRINK, START, JobRequest, Target
from dl2d.daemon.sim_backend import SimBackend
from dl2d.sim.cluster import preset
from dl2d.workload import catalog

SLOT = 60.0
WORKER = {"gpus": 1, "cpus": 8, "mem_gb": 40}


def backend(**kw) -> SimBackend:
    return SimBackend(preset("t4-16"), slot_seconds=SLOT, noise=0.0, start_time=0.0, **kw)


def job(job_id: int, model: str = "cifar10", batch: float = 512.0, **spec) -> JobRequest:
    return JobRequest(job_id, model, 1000.0, {"kind": "allreduce", "batch_size": batch, "worker": WORKER,
                                              "name": f"j{job_id}", **spec})


def on(*nodes: int) -> tuple[str, ...]:
    return tuple(f"sim{n:03d}" for n in nodes)


def test_an_all_reduce_job_trains_at_the_measured_speed_of_its_placement():
    b = backend()
    assert b.apply(job(1), Target(4, 0, on(1, 1, 1, 1))).method == START  # one node, 4 GPUs
    assert b.apply(job(2), Target(4, 0, on(2, 2, 3, 3))).method == START  # two nodes, 2 GPUs each
    b.end_slot(SLOT)
    done = {k: st.epochs_done for k, st in b.observe().items()}
    packed, spread = (catalog.allreduce_epoch_rate("cifar10", 512.0, p) * SLOT for p in ((4,), (2, 2)))
    assert done[1] == pytest.approx(packed, rel=1e-12) and done[2] == pytest.approx(spread, rel=1e-12)
    assert packed > spread  # the measurements say packed is faster for cifar10 at 512


def test_spread_jobs_sharing_a_node_are_slowed_and_others_are_not():
    b = backend(shared_node_slowdown=0.1)
    b.apply(job(1), Target(2, 0, on(1, 2)))
    b.apply(job(2), Target(2, 0, on(2, 3)))  # shares sim002 with job 1
    b.apply(job(3), Target(2, 0, on(4, 4)))  # alone on one node
    b.end_slot(SLOT)
    done = {k: st.epochs_done for k, st in b.observe().items()}
    spread = catalog.allreduce_epoch_rate("cifar10", 512.0, (1, 1)) * SLOT
    assert done[1] == pytest.approx(0.9 * spread, rel=1e-12) and done[2] == pytest.approx(0.9 * spread, rel=1e-12)
    assert done[3] == pytest.approx(catalog.allreduce_epoch_rate("cifar10", 512.0, (2,)) * SLOT, rel=1e-12)


def test_a_start_a_resize_and_a_move_cost_the_restart_time():
    b = backend(resize_overhead_s=20.0)
    rate = {g: catalog.allreduce_epoch_rate("cifar10", 512.0, (g,)) for g in (2, 4)}
    b.apply(job(1), Target(4, 0, on(1, 1, 1, 1)))
    b.end_slot(SLOT)  # started: 40 s of training
    b.end_slot(SLOT)  # unchanged: 60 s
    assert b.apply(job(1), Target(2, 0, on(1, 1))).method == SHRINK
    b.end_slot(SLOT)  # resized: 40 s at 2 GPUs
    assert b.apply(job(1), Target(2, 0, on(5, 5))).method != NOOP  # same size, other node: a restart too
    b.end_slot(SLOT)
    want = rate[4] * (40 + 60) + rate[2] * (40 + 40)
    assert b.observe()[1].epochs_done == pytest.approx(want, rel=1e-12)


def test_a_model_never_seen_trains_at_the_daemons_prior():
    b = backend()
    spec = {"kind": "allreduce", "workers": 4, "epoch_seconds": 120.0, "worker": WORKER, "name": "new"}
    b.apply(JobRequest(1, "my-llm", 1000.0, spec), Target(4, 0, on(1, 1, 1, 1)))
    b.end_slot(SLOT)
    model = jobmodel.model_of("my-llm", spec)
    want = jobmodel.prior(model, 1, 4, 4)[4] * SLOT
    assert want > 0 and b.observe()[1].epochs_done == pytest.approx(want, rel=1e-12)


def test_an_all_reduce_job_survives_a_restart_of_the_backend(tmp_path):
    state = tmp_path / "cluster.json"
    b = SimBackend(preset("t4-16"), slot_seconds=SLOT, noise=0.0, state_file=state, start_time=0.0,
                   resize_overhead_s=10.0)
    b.apply(job(1, "bert", 96.0), Target(8, 0, on(1, 1, 1, 1, 2, 2, 2, 2)))
    b.end_slot(SLOT)
    again = SimBackend(preset("t4-16"), slot_seconds=SLOT, noise=0.0, state_file=state, resize_overhead_s=10.0)
    again.end_slot(SLOT)
    want = catalog.allreduce_epoch_rate("bert", 96.0, (4, 4)) * (50 + 60)
    assert again.observe()[1].epochs_done == pytest.approx(want, rel=1e-12)
    assert np.isclose(again.observe()[1].epochs_done, b.observe()[1].epochs_done + want * 60 / 110)
