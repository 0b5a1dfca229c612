"""The real daemon loop on the simulated backend with SQLite: every job finishes, the DB's JCTs are the
bare simulator's (same policy, trace and seed), guardrail fallbacks are recorded, cancels reach the backend."""
from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import func, select

from dl2d.core.contract import Allocation
from dl2d.daemon.config import build_config
from dl2d.daemon.main import DemoFeeder, build_loop, demo_report, make_policy
from dl2d.db.engine import session_scope
from dl2d.db.jobs import cancel_job, submit_job
from dl2d.db.models import (
    Decision,
    Event,
    EventKind,
    Intent,
    IntentState,
    Job,
    JobState,
    Slot,
)
from dl2d.policy.registry import StatelessPolicy
from dl2d.sim.cluster import preset
from dl2d.sim.engine import SimConfig, run

SHORT_TYPES = ("resnext-110", "wlm", "dssm", "resnet-50")  # short jobs: a quick test


def config(tmp_path, **kw):
    base = {"state_dir": str(tmp_path), "sim": {"cluster": "tiny", "noise": 0.1, "seed": 3},
            "metrics": {"enabled": False}}
    for k, v in kw.items():
        base.setdefault(k, {}).update(v) if isinstance(v, dict) else base.__setitem__(k, v)
    return build_config(base, {})


def jcts_from_db(engine):
    with session_scope(engine) as s:
        jobs = list(s.scalars(select(Job).order_by(Job.id)))
        return [j.state for j in jobs], np.array([(j.finished_at - j.submitted_at).total_seconds() / 1200
                                                  for j in jobs if j.finished_at])


@pytest.mark.parametrize("policy", ["drf", "srtf"])
def test_daemon_matches_bare_simulator(tmp_path, policy):
    """Without slot noise the run is exactly the simulator's; the tiny cluster makes jobs queue and resize."""
    cfg = config(tmp_path, policy={"name": policy}, sim={"noise": 0.0}, guardrails={"starve_slots": 10_000})
    feeder = DemoFeeder(10, seed=5, job_types=SHORT_TYPES, world="dl2")
    loop = build_loop(cfg, feeder)
    slots = loop.run(until_idle=lambda: feeder.exhausted() and loop.idle())
    states, jct = jcts_from_db(loop.engine)
    assert states == [JobState.COMPLETED] * 10
    pol, _ = make_policy(cfg)
    bare = run(feeder.trace, pol, SimConfig(cluster=preset("tiny"), slot_noise=0.0), seed=3)
    # same decisions, same noise draws: the same JCT per job, not just on average
    np.testing.assert_allclose(np.sort(jct), np.sort(bare.jct_slots), rtol=1e-9)
    assert slots == pytest.approx(bare.makespan_slots, abs=1.0)
    with session_scope(loop.engine) as s:
        assert s.scalar(select(func.count()).select_from(Slot).where(Slot.ended_at.is_(None))) == 0
        assert s.scalar(select(func.count()).select_from(Intent).where(Intent.state != IntentState.DONE)) == 0
        assert s.scalar(select(func.count()).select_from(Event).where(Event.kind == EventKind.FINISH)) == 10
        rewards = s.scalars(select(Slot.reward).order_by(Slot.number)).all()
    np.testing.assert_allclose(sum(rewards), bare.rewards.sum(), rtol=1e-9)
    rep = demo_report(loop, cfg, feeder, compare=True)
    assert rep["avg_jct_hours"] == rep["bare_sim_avg_jct_hours"]


def test_daemon_avg_jct_within_noise_of_bare_simulator(tmp_path):
    """With noise the per-slot draws are aligned differently (the backend draws for the jobs it runs, the
    simulator for every arrived job), so per-job JCTs differ; the average stays within noise."""
    cfg = config(tmp_path, sim={"noise": 0.1})
    feeder = DemoFeeder(10, seed=5, job_types=SHORT_TYPES, world="dl2")
    loop = build_loop(cfg, feeder)
    loop.run(until_idle=lambda: feeder.exhausted() and loop.idle())
    _, jct = jcts_from_db(loop.engine)
    pol, _ = make_policy(cfg)
    bare = run(feeder.trace, pol, SimConfig(cluster=preset("tiny"), slot_noise=0.1), seed=3)
    assert len(jct) == 10
    assert jct.mean() == pytest.approx(bare.avg_jct_slots, rel=0.05)


def test_nan_policy_falls_back_to_drf_and_is_recorded(tmp_path):
    cfg = config(tmp_path)
    feeder = DemoFeeder(4, seed=1, job_types=("resnext-110",), world="dl2")
    loop = build_loop(cfg, feeder)
    loop.policy = StatelessPolicy(lambda view: Allocation(np.full(len(view), np.nan), np.ones(len(view))), "nan")
    loop.run(until_idle=lambda: feeder.exhausted() and loop.idle())
    with session_scope(loop.engine) as s:
        assert {j.state for j in s.scalars(select(Job))} == {JobState.COMPLETED}
        decisions = list(s.scalars(select(Decision)))
        assert decisions and all(d.source.value == "fallback" and "NaN" in d.fallback_reason for d in decisions)
        assert s.scalar(select(func.count()).select_from(Event).where(Event.kind == EventKind.FALLBACK)) == len(decisions)
    assert loop.state.fallbacks == len(decisions)


def test_cancel_reaches_the_backend(tmp_path):
    cfg = config(tmp_path)
    loop = build_loop(cfg)
    with session_scope(loop.engine) as s:
        job = submit_job(s, {"name": "long", "owner": "alice", "job_type": "vgg-16", "total_epochs": 250,
                             "command": "python train.py", "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8},
                             "ps": {"cpus": 2, "mem_gb": 4}})
        jid = job.id
    loop.run(max_slots=2)
    assert loop.backend.observe()[jid].state == "running"
    with session_scope(loop.engine) as s:
        cancel_job(s, jid, "alice")  # what dl2ctl cancel does
    loop.run(max_slots=1)
    st = loop.backend.observe()[jid]
    assert st.state == "failed" and st.workers == 0 and st.message == "cancelled"
    with session_scope(loop.engine) as s:
        job = s.get(Job, jid)
        assert job.state == JobState.CANCELLED
        assert (job.workers, job.ps) == (0, 0)  # stopped: it holds nothing (dl2ctl show and queue said it did)
        assert s.scalar(select(func.count()).select_from(Intent).where(Intent.state != IntentState.DONE)) == 0


def test_todays_all_reduce_jobs_run_to_the_end_near_the_bare_simulator(tmp_path):
    """The today world's demo jobs (Philly-drawn all-reduce jobs of the six measured models) go through submit,
    the view (their measured speed, the GPUs they asked for) and the simulated backend's measured truth to the
    end. Not exactly the simulator's JCTs: a job whose size does not change keeps its tasks where they are in the
    daemon (as on Slurm), while the simulator moves it wherever the policy places it anew."""
    from dl2d.sim.worlds import world
    from dl2d.workload.catalog import ALLREDUCE_MODELS

    cfg = config(tmp_path, slot_seconds=60.0, sim={"cluster": "t4-16", "noise": 0.0})
    feeder = DemoFeeder(6, seed=0, world="today", slot_seconds=60.0)
    loop = build_loop(cfg, feeder)
    loop.run(until_idle=lambda: feeder.exhausted() and loop.idle())
    with session_scope(loop.engine) as s:
        jobs = list(s.scalars(select(Job).order_by(Job.id)))
        assert [j.state for j in jobs] == [JobState.COMPLETED] * 6
        assert all(j.spec["kind"] == "allreduce" and j.job_type in ALLREDUCE_MODELS and j.spec["batch_size"] > 0
                   for j in jobs)
        assert sorted(j.spec["workers"] for j in jobs) == sorted(feeder.trace.requested.tolist())
        jct = np.array([(j.finished_at - j.submitted_at).total_seconds() / 60 for j in jobs])
    pol, _ = make_policy(cfg)
    bare = run(feeder.trace, pol, world("today").sim_config(slot_noise=0.0, resize_overhead_s=0.0,
                                                            shared_node_slowdown=0.0), seed=3)
    assert jct.mean() == pytest.approx(bare.avg_jct_slots, rel=0.03)
