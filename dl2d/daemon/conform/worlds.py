"""The two worlds of the conformance harness: the twin (the daemon's own slot loop over the simulated cluster,
in this process, slots back to back) and the real one (``dl2d`` as a subprocess on a Slurm cluster, slots in
wall-clock time, the trace's jobs submitted as they arrive); each is read back from its database into a
:class:`~dl2d.daemon.conform.compare.WorldRecord`.

Both worlds are the same daemon code with the same configuration but for the backend: the same policy, slot
length, guardrails, worker bound and job specs. The twin's cluster (dl2d.daemon.conform.twin) is the real one's
shape (nodes, and each node's GPUs, CPUs and memory as Slurm reports them) under Slurm's rules of placement and
waiting, with no speed noise and no shared-node slowdown; a start and a restart cost what they cost in the real
run (:func:`~dl2d.daemon.conform.compare.restart_costs`): :func:`conform` runs the real world first.
"""
from __future__ import annotations

import bisect
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from sqlalchemy import select

from dl2d.daemon.conform.compare import Costs, WorldRecord
from dl2d.daemon.conform.trace import JAX_WORKER, ConformJob, submission
from dl2d.daemon.slurm.mapping import HOLDING_STATES, gpus_held_by_others

log = logging.getLogger("dl2d.conform")


@dataclass(frozen=True)
class ClusterShape:
    """The real cluster as the twin copies it: identical nodes."""

    nodes: int
    gpus: int
    cpus: int
    mem_gb: float

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus


def slurm_shape(driver) -> ClusterShape:
    """The usable nodes of a Slurm cluster (the smallest node's resources: the twin's nodes are alike)."""
    nodes = [n for n in driver.nodes() if n.usable]
    if not nodes:
        raise RuntimeError("Slurm reports no usable node")
    return ClusterShape(len(nodes), min(n.gpus for n in nodes), min(n.cpus for n in nodes),
                        min(n.mem_mb for n in nodes) / 1024.0)


class TraceFeeder:
    """Submits each trace job at the start of its arrival slot (the daemon's feeder hook, as the demo's)."""

    hidden: dict = {}  # the twin is told each job's true epochs: they are its submitted ones

    def __init__(self, jobs: Sequence[ConformJob], python: str, owner: str) -> None:
        self.jobs, self.python, self.owner = list(jobs), python, owner
        self.submitted: set[str] = set()

    def __call__(self, session, number: int, now) -> int:
        from dl2d.db.jobs import submit_job

        n = 0
        for job in self.jobs:
            if job.name not in self.submitted and job.arrival <= number:
                submit_job(session, submission(job, self.python, self.owner), now=now)
                self.submitted.add(job.name)
                n += 1
        return n

    def exhausted(self) -> bool:
        return len(self.submitted) == len(self.jobs)


def _utc(ts: datetime) -> float:
    return (ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)).timestamp()


def read_world(engine, world: str, policy: str, jobs: Sequence[ConformJob], gpus: int,
               slot_s: float) -> WorldRecord:
    """A world's record from its database: slots counted from its first, jobs by name."""
    from dl2d.db.engine import session_scope
    from dl2d.db.models import Allocation, Decision, Event, Job, JobSlotStat, Slot

    arrival = {j.name: j.arrival for j in jobs}
    with session_scope(engine) as s:
        slots = s.execute(select(Slot.id, Slot.number, Slot.started_at).order_by(Slot.number)).all()
        if not slots:
            raise RuntimeError(f"the {world} world recorded no slot")
        first = slots[0].number
        rel = {row.id: row.number - first for row in slots}
        starts = [_utc(row.started_at) for row in slots]
        origin = starts[0]
        names = {row.id: row.name for row in s.execute(select(Job.id, Job.name))}
        alloc = {(rel[a.slot_id], names[a.job_id]): int(a.workers)
                 for a in s.execute(select(Allocation.slot_id, Allocation.job_id, Allocation.workers))}
        ran: dict[tuple[int, str], int] = {}
        trained: dict[tuple[int, str], float] = {}
        for st in s.execute(select(JobSlotStat.slot_id, JobSlotStat.job_id, JobSlotStat.workers,
                                   JobSlotStat.epochs)):
            key = (rel[st.slot_id], names[st.job_id])
            ran[key], trained[key] = int(st.workers), float(st.epochs)
        epochs: dict[tuple[int, str], float] = {}
        for name in arrival:
            done = 0.0
            for slot in range(len(slots)):
                done += trained.get((slot, name), 0.0)
                epochs[(slot, name)] = done
        flags = {}
        for d in s.execute(select(Decision.slot_id, Decision.job_flags)):
            for job_id, fl in (d.job_flags or {}).items():
                if int(job_id) in names:
                    flags[(rel[d.slot_id], names[int(job_id)])] = list(fl)
        events, offsets, job_apply_at = [], {}, {}
        for e in s.execute(select(Event.job_id, Event.ts, Event.kind).where(Event.job_id.is_not(None))):
            kind = e.kind.value if hasattr(e.kind, "value") else str(e.kind)
            if kind in ("start", "hot_scale", "relaunch", "resize"):
                slot = max(bisect.bisect_right(starts, _utc(e.ts)) - 1, 0)
                events.append((slot, names[e.job_id], kind))
                offsets.setdefault(slot, []).append(_utc(e.ts) - starts[slot])
                job_apply_at[(slot, names[e.job_id])] = _utc(e.ts) - starts[slot]
        apply_at = {slot: float(np.median(v)) for slot, v in offsets.items()}
        finish_s, jct_s = {}, {}
        for j in s.execute(select(Job.name, Job.finished_at, Job.state)):
            if j.name in arrival and j.finished_at is not None and getattr(j.state, "value", j.state) == "COMPLETED":
                finish_s[j.name] = _utc(j.finished_at) - origin
                a = arrival[j.name]
                start_a = starts[a] if a < len(starts) else origin + a * slot_s
                jct_s[j.name] = _utc(j.finished_at) - start_a
    return WorldRecord(world=world, policy=policy, gpus=gpus, slots=len(slots), alloc=alloc, ran=ran, epochs=epochs,
                       flags=flags, events=sorted(events), arrival=arrival, finish_s=finish_s, jct_s=jct_s,
                       slot_s=slot_s, apply_at=apply_at, job_apply_at=job_apply_at)


def _overrides(state_dir: Path, policy: str, slot_s: float, max_workers: int) -> dict[str, Any]:
    return {"state_dir": str(state_dir), "slot_seconds": slot_s, "policy.name": policy, "max_workers": max_workers,
            "metrics.enabled": False, "control.enabled": False, "log_level": "warning"}


def run_twin(jobs: Sequence[ConformJob], policy: str, slot_s: float, shape: ClusterShape, state_dir: Path,
             costs: Costs, python: str = sys.executable, owner: str = "root", max_slots: int = 400,
             max_workers: int = 16, real: WorldRecord | None = None,
             curves: dict[str, dict[int, float]] | None = None,
             job_costs: dict[str, Costs] | None = None) -> WorldRecord:
    """The trace in the twin: the daemon's slot loop over a simulated copy of the cluster (``curves``, by job
    name: a speed that is not the job's model's; ``job_costs``: a job's own costs)."""
    from dl2d.daemon.config import load_config
    from dl2d.daemon.main import build_loop
    from dl2d.daemon.conform.twin import SlurmTwin
    from dl2d.sim.cluster import ClusterSpec

    state_dir.mkdir(parents=True, exist_ok=True)
    cfg = load_config(None, env={}, overrides={**_overrides(state_dir, policy, slot_s, max_workers), "backend": "sim",
                                               "sim.noise": 0.0})
    backend = SlurmTwin(ClusterSpec(shape.nodes, shape.gpus, shape.cpus, shape.mem_gb), slot_s, start_time=0.0,
                        costs=costs, applied_at=real.applied_at if real is not None else None, curves=curves,
                        job_costs=job_costs)
    feeder = TraceFeeder(jobs, python, owner)
    loop = build_loop(cfg, feeder, backend=backend)
    loop.run(max_slots=max_slots, until_idle=lambda: feeder.exhausted() and loop.idle())
    return read_world(loop.engine, "twin", policy, jobs, shape.total_gpus, slot_s)


def real_config(state_dir: Path, policy: str, slot_s: float, slurm_conf: str, prefix: str,
                max_workers: int = 16) -> str:
    """The real daemon's TOML: the twin's settings, on the Slurm of ``slurm_conf``."""
    return f"""# written by the conformance harness (dl2d.daemon.conform)
state_dir = {json.dumps(str(state_dir))}
backend = "slurm"
slot_seconds = {slot_s}
max_workers = {max_workers}
log_level = "info"
[policy]
name = {json.dumps(policy)}
[metrics]
enabled = false
[control]
enabled = false
[slurm]
slurm_conf = {json.dumps(slurm_conf)}
workdir = {json.dumps(str(state_dir))}
job_name_prefix = {json.dumps(prefix)}
checkpoint_timeout_s = 20
time_limit_min = 10
run_jobs_as = "daemon"
"""


class SlurmWatch:
    """Once a slot, just before the next begins: the GPUs Slurm holds for the trace's jobs (its nodes' GRES in use,
    less what Slurm jobs that are not the trace's hold: :func:`dl2d.daemon.slurm.mapping.gpus_held_by_others`)
    against the GPUs dl2d allotted for the slot (its allocation's workers); a slot where Slurm holds more is one in
    which dl2d counted free a GPU that Slurm held."""

    def __init__(self, driver, gpus_per_worker: int = 1, prefix: str = "cf-") -> None:
        self.driver, self.gpw, self.prefix = driver, gpus_per_worker, prefix
        self.over: list[tuple[int, int, int]] = []
        self.checked = 0

    def held(self) -> int:
        """The GPUs Slurm holds now for Slurm jobs named with the trace's prefix."""
        nodes, jobs = self.driver.nodes(), self.driver.jobs()
        others = gpus_held_by_others(nodes, jobs, {j.job_id for j in jobs if j.name.startswith(self.prefix)})
        return sum(n.gpus_alloc for n in nodes) - sum(others.values())

    def check(self, engine, number: int, slot: int) -> None:
        from dl2d.db.engine import session_scope
        from dl2d.db.models import Allocation, Slot

        held = self.held()
        with session_scope(engine) as s:
            counted = sum(int(w) for (w,) in s.execute(
                select(Allocation.workers).join(Slot, Slot.id == Allocation.slot_id).where(Slot.number == number)))
        counted *= self.gpw
        self.checked += 1
        if held > counted:
            self.over.append((slot, held, counted))


def wait_idle(driver, timeout_s: float = 60.0, poll_s: float = 1.0) -> None:
    """Wait until Slurm's nodes hold no GPU (a run's jobs just cancelled take a moment to be released), or raise:
    the twin has the whole cluster, so the real world must too."""
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = driver.nodes()
        held = sum(n.gpus_alloc for n in nodes)
        if held == 0:
            return
        if time.monotonic() >= deadline:
            busy = ", ".join(f"{n.name} {n.gpus_alloc}" for n in nodes if n.gpus_alloc)
            jobs = ", ".join(f"{j.job_id} ({j.user or '?'})" for j in driver.jobs() if j.state in HOLDING_STATES)
            raise RuntimeError(f"Slurm holds {held} GPUs ({busy}; jobs {jobs or 'none listed'}) after "
                               f"{timeout_s:g} s: the trace needs the cluster to itself, as its twin has it")
        time.sleep(poll_s)


def run_real(jobs: Sequence[ConformJob], policy: str, slot_s: float, slurm_conf: str, state_dir: Path,
             driver, gpus: int, python: str = sys.executable, owner: str = "root", timeout_s: float = 300.0,
             env: dict[str, str] | None = None, prefix: str = "cf-",
             on_slot: Callable[[int], None] | None = None) -> WorldRecord:
    """The trace on Slurm: ``dl2d`` with the slurm backend as a subprocess; the jobs of arrival slot ``a`` are
    submitted (to its database, as ``dl2ctl submit --db`` does) once slot ``a - 1`` has been decided, so they
    are in the system from slot ``a`` on, as in the twin."""
    from dl2d.db.engine import make_engine, session_scope, upgrade
    from dl2d.db.jobs import submit_job
    from dl2d.db.models import Job, JobState, Slot

    state_dir.mkdir(parents=True, exist_ok=True)
    config = state_dir / "dl2d.toml"
    config.write_text(real_config(state_dir, policy, slot_s, slurm_conf, prefix))
    url = f"sqlite:///{state_dir / 'dl2d.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    watch = SlurmWatch(driver, prefix=prefix)

    submitted: set[str] = set()

    def submit(arriving: Sequence[ConformJob]) -> None:
        if not arriving:
            return
        with session_scope(engine) as s:
            for job in arriving:
                submit_job(s, submission(job, python, owner))
        submitted.update(j.name for j in arriving)

    submit([j for j in jobs if j.arrival == 0])
    logf = (state_dir / "dl2d.log").open("w")
    proc = subprocess.Popen([python, "-m", "dl2d.daemon.main", "--config", str(config)], stdout=logf,
                            stderr=subprocess.STDOUT, env=env, cwd=state_dir)
    try:
        deadline = time.monotonic() + timeout_s
        first: int | None = None
        checked: set[int] = set()
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"dl2d exited {proc.returncode}: see {state_dir / 'dl2d.log'}")
            with session_scope(engine) as s:
                rows = s.execute(select(Slot.number, Slot.started_at).order_by(Slot.number.desc()).limit(1)).all()
                states = [st for (st,) in s.execute(select(Job.state))]
            if rows:
                number, started = rows[0]
                first = number if first is None else first
                slot = number - first
                # slot decided (its row is written with its decision): the next slot's arrivals go in now
                submit([j for j in jobs if 0 < j.arrival <= slot + 1 and j.name not in submitted])
                # just before the next slot begins, once the slot's plan is carried out: what Slurm holds
                # against what dl2d counts
                left = _utc(started) + slot_s - time.time()
                if slot not in checked and left < 0.5 and _carried_out(engine, number):
                    watch.check(engine, number, slot)
                    checked.add(slot)
                    if on_slot:
                        on_slot(slot)
            done = len(states) == len(jobs) and all(st in (JobState.COMPLETED, JobState.FAILED,
                                                           JobState.CANCELLED) for st in states)
            if done:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"the real run did not finish within {timeout_s:g} s: see {state_dir / 'dl2d.log'}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        logf.close()
        for sj in driver.jobs():
            if sj.name.startswith(prefix) and sj.state in ("PENDING", "RUNNING", "CONFIGURING"):
                driver.cancel(sj.job_id)
    record = read_world(engine, "real", policy, jobs, gpus, slot_s)
    record.over_held, record.checked_slots = watch.over, watch.checked
    engine.dispose()
    return record


def _carried_out(engine, number: int) -> bool:
    """Whether every intent of slot ``number`` has been carried out (or has failed)."""
    from dl2d.db.engine import session_scope
    from dl2d.db.models import Intent, IntentState, Slot

    with session_scope(engine) as s:
        return s.execute(select(Intent.id).join(Slot, Slot.id == Intent.slot_id).where(
            Slot.number == number, Intent.state.in_([IntentState.PLANNED, IntentState.ISSUED]))).first() is None


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without dl2d's and Slurm's own variables (a daemon started from a job or a
    test must not inherit them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DL2D_", "SLURM_"))}
    env.update(extra or {})
    return env


def calibrated_speeds(jobs: Sequence[ConformJob], real_dir: Path, gpus_per_node: int, python: str = sys.executable,
                      env: dict[str, str] | None = None) -> tuple[list[ConformJob], dict[str, Any]]:
    """The trace with each JAX job's speed as ``dl2ctl calibrate`` fits it from the real run's database (their
    class, ``jax-mlp``: seconds per epoch by GPUs), and what the fit said; the demo jobs as they are."""
    from dl2d.daemon.conform.trace import JAX_LABEL
    from dl2d.workload.speedfit import load_speed_model

    jax = [j for j in jobs if j.program == "jax"]
    if not jax:
        return list(jobs), {}
    out = real_dir / "speed-model.json"
    bound = max(j.max_workers for j in jax)
    cp = subprocess.run([python, "-m", "dl2d.cli.main", "calibrate", "--db", f"sqlite:///{real_dir / 'dl2d.sqlite'}",
                         "--out", str(out), "--gpus-per-node", str(gpus_per_node), "--max-gpus", str(bound)],
                        capture_output=True, text=True, env=env, timeout=300)
    if cp.returncode != 0:
        raise RuntimeError(f"dl2ctl calibrate of the real run failed: {cp.stderr.strip() or cp.stdout.strip()}")
    cls = load_speed_model(out).get(JAX_LABEL)
    if cls is None:
        raise RuntimeError("the JAX jobs never trained a whole slot at one size on Slurm: dl2ctl calibrate has no "
                           "speed of theirs to give the twin")
    curve = tuple((w, round(cls.epochs_per_s(w * int(JAX_WORKER["gpus"])), 9)) for w in range(1, bound + 1))
    fit = {"class": JAX_LABEL, "fitted": cls.fitted, "epochs_per_s": dict(curve),
           "observed": {str(g): {"slots": n, "seconds_per_epoch": round(t, 3)} for g, (n, t) in cls.observed.items()}}
    return [replace(j, speed=curve) if j.program == "jax" else j for j in jobs], fit


def conform(jobs: Sequence[ConformJob], policy: str, slot_s: float, slurm_conf: str, root: Path, driver,
            python: str = sys.executable, env: dict[str, str] | None = None, timeout_s: float = 300.0,
            owner: str = "root") -> dict[str, Any]:
    """One policy in both worlds: the real run, the twin run with the real run's start and restart costs (the JAX
    jobs': their own, and their speed from ``dl2ctl calibrate`` of the run), and the comparison
    (dl2d.daemon.conform.compare.compare), with the costs the twin was given."""
    from dl2d.daemon.conform.compare import compare, restart_costs

    shape = slurm_shape(driver)
    wait_idle(driver)
    real_dir = root / policy / "real"
    real = run_real(jobs, policy, slot_s, slurm_conf, real_dir, driver, shape.total_gpus,
                    python=python, owner=owner, env=env, timeout_s=timeout_s, prefix=f"cf-{policy}-")
    jobs, fit = calibrated_speeds(jobs, real_dir, shape.gpus, python=python, env=env)
    speeds = {j.name: dict(j.speed) for j in jobs}
    jax = {j.name for j in jobs if j.program == "jax"}
    costs = restart_costs(replace(real, events=[e for e in real.events if e[1] not in jax]), speeds)
    jax_costs = restart_costs(replace(real, events=[e for e in real.events if e[1] in jax]), speeds) if jax else None
    twin = run_twin(jobs, policy, slot_s, shape, root / policy / "twin", costs, python=python, owner=owner,
                    real=real, curves={n: speeds[n] for n in jax}, job_costs={n: jax_costs for n in jax})
    rep = {**compare(real, twin), "costs": {k: round(v, 3) for k, v in asdict(costs).items()}}
    if jax:
        rep["jax"] = {**fit, "costs": {k: round(v, 3) for k, v in asdict(jax_costs).items()}}
    return rep
