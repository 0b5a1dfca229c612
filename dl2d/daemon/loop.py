"""The slot loop: the daemon's I/O shell around the pure planner (dl2d.daemon.plan).

One slot (docs/daemon.md has the full story):

1. poll the node agents (samples -> node_samples; a silent agent is marked stale, never drained);
2. reconcile, level-triggered: the DB's jobs against ``backend.observe()`` (finishes/failures recorded,
   sizes and progress synced, cancelled or unknown jobs stopped in the backend);
3. build the policy's view, decide, apply the guardrails (fallback to DRF with the reason);
4. journal: the slot, its allocations and decision, and one intent per job whose size changes, in one
   transaction; then all marked issued (one transaction), ``backend.apply`` each in order (in the backend's
   ``batch()`` when it has one), all marked done (or failed) in one transaction;
5. wait for the slot to end (polling agents meanwhile), ``backend.end_slot``;
6. close the slot: reward (DL2 eq. 1) from the backend's progress, each job's measured speed and GPU features
   (dl2d.daemon.jobstats -> job_slot_stats; they feed the next view and decision's flags), reconcile, online
   RL update, policy checkpoint every N slots.

Crash safety: at start :meth:`SlotLoop.recover` replays every PLANNED/ISSUED intent (``apply`` is
idempotent: a size already reached is a NOOP) and closes a slot left open, so a daemon killed anywhere
restarts without losing a job or resizing twice. ``DL2D_DEBUG_CRASH=point:k`` makes the process SIGKILL
itself the k-th time it reaches ``point`` (planned, issued, applied, ended, closed) — for the crash tests.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Callable

import numpy as np
from sqlalchemy.orm import Session

from dl2d.core.files import write_json_atomic
from dl2d.core.placement import place
from dl2d.daemon import batches as B
from dl2d.daemon import jobstats as JS
from dl2d.daemon import plan as P
from dl2d.daemon.agent_rounds import poll_round
from dl2d.daemon.backend import (
    FAILED,
    FINISHED,
    PENDING,
    RUNNING,
    BackendError,
    ClusterBackend,
    JobRequest,
    JobStatus,
)
from dl2d.daemon.crash import CrashHook
from dl2d.daemon.conservation import could_use
from dl2d.daemon.hysteresis import Hysteresis, damp
from dl2d.daemon.metrics import Metrics
from dl2d.daemon.notify import Notifier
from dl2d.db import events as db_events
from dl2d.db import intents as db_intents
from dl2d.db import jobs as db_jobs
from dl2d.db import slots as db_slots
from dl2d.db.digest import state_digest
from dl2d.db.engine import session_scope
from dl2d.db.models import (
    EventKind,
    Intent,
    IntentKind,
    IntentState,
    Job,
    JobState,
    utcnow,
)
from dl2d.policy.registry import Policy
from dl2d.workload.speed import epochs_trained

log = logging.getLogger("dl2d")

METHOD_EVENT = {"start": EventKind.START, "hot": EventKind.HOT_SCALE, "restart": EventKind.RELAUNCH,
                "shrink": EventKind.RESIZE, "stop": EventKind.RESIZE}


@dataclass
class SlotOutcome:
    number: int
    jobs: int
    source: str
    reason: str | None
    intents: int
    applied: dict[str, int]
    tick_ms: float
    decide_ms: float
    reward: float | None = None


@dataclass
class LoopState:
    starved: dict[int, int] = field(default_factory=dict)
    fallbacks: int = 0
    slots: int = 0
    last: SlotOutcome | None = None
    tick_ms: list[float] = field(default_factory=list)


def _request(job: Job) -> JobRequest:
    return JobRequest(job.id, job.job_type, float(job.total_epochs),
                      {**(job.spec or {}), "name": job.name, "owner": job.owner})


class SlotLoop:
    def __init__(self, engine, backend: ClusterBackend, policy: Policy | None, fallback: Policy, *, slot_seconds: float, starve_slots: int = 6,
                 clock: Callable[[], datetime] = utcnow, pace: bool = True, metrics: Metrics | None = None,
                 notifier: Notifier | None = None, poller=None, poll_interval: float = 10.0,
                 retention_every: int = 1, feeder: Callable[[Session, int, datetime], int] | None = None,
                 learner=None, checkpoint_path: str | None = None, checkpoint_every: int = 10,
                 status_file: str | None = None, crash: CrashHook | None = None, info: dict | None = None,
                 hysteresis: Hysteresis = Hysteresis(), max_workers: int = P.ALLREDUCE_MAX_WORKERS,
                 carried_out: Policy | None = None, pending_window: int = 0, batch_rule: str = "goodput"):
        self.engine, self.backend = engine, backend
        # advise mode: this policy (Slurm as it is) is carried out, ``policy``'s decision only recorded (docs/daemon.md)
        self.carried_out = carried_out
        self.policy, self.fallback = policy, fallback
        self.pending_window = pending_window  # waiting jobs the policy sees a slot (0: all; plan.scheduling_window)
        self.batch_rule = batch_rule  # the batch an adaptive job starts at ([policy] batch; dl2d.daemon.batches)
        self._report_errors: dict[int, str] = {}  # job id -> what was last refused of its batch report (said once)
        self.slot_seconds, self.starve_slots = slot_seconds, starve_slots
        self.clock, self.pace = clock, pace
        self.metrics = metrics or Metrics()
        self.notifier = notifier or Notifier({})
        self.poller, self.poll_interval, self.retention_every = poller, poll_interval, retention_every
        self.feeder = feeder
        self.learner, self.checkpoint_path, self.checkpoint_every = learner, checkpoint_path, checkpoint_every
        self.status_file = status_file
        self.crash = crash or CrashHook(os.environ.get("DL2D_DEBUG_CRASH", ""))
        self.info = dict(info or {})
        self.state = LoopState()
        self.stop = threading.Event()
        # SIGHUP: reload the configuration at the next slot boundary (dl2d.daemon.main.Reloader), never mid-slot
        self.reload = threading.Event()
        self.reloader: Callable[["SlotLoop"], None] | None = None
        self._closed = 0
        self._rows: dict[int, P.JobRow] = {}  # job id -> its row's fixed part: spec, limits, demand
        self.hysteresis = hysteresis
        self.max_workers = max_workers  # the most workers of any job (a job's own limit is within it)
        self._believed: dict[int, np.ndarray] = {}  # job id -> believed epochs/s by workers (all-reduce jobs)
        self._last_change: dict[int, int] = {}  # job id -> the slot of its last size change (hysteresis)
        # job id -> the nodes of its last target carried out: where its tasks run, for the view (plan.known_servers)
        self._placed: dict[int, P.Placement] = {}
        self.node_report: list[dict[str, Any]] = []  # each node as the last slot left it (dl2ctl nodes)
        self._status_state = "starting"
        self.started_at = time.time()
        # per-job measurements (dl2d.daemon.jobstats): the agents' samples of the current slot, each job's last
        # JS.HISTORY_SLOTS stats (from the DB at recover), and the speed model the measured speed is compared with
        self._slot_samples: list[dict[str, Any]] = []
        self._job_hist: dict[int, list[JS.JobSlotStats]] = {}
        self._speed_table = getattr(backend, "table", None)
        if self._speed_table is None:
            from dl2d.workload.speed import speed_table
            self._speed_table = speed_table("measured")

    # ------------------------------------------------------------------------------ agents

    def poll_agents(self, retention: bool = False) -> int:
        """One poll round (dl2d.daemon.agent_rounds); returns the samples stored."""
        if self.poller is None:
            return 0
        n, samples = poll_round(self.poller, self.engine, self.backend, self.metrics, self.clock, retention)
        self._slot_samples.extend(samples)
        return n

    # ------------------------------------------------------------------------------ reconcile

    def reconcile(self, s: Session, statuses: dict[int, JobStatus], now: datetime) -> None:
        """Level-triggered sync of the DB's jobs with what the backend reports."""
        jobs = {j.id: j for j in db_jobs.active_jobs(s, spec=False)}
        for job in jobs.values():
            st = statuses.get(job.id)
            if st is None:
                job.workers = job.ps = 0
                if job.state != JobState.PENDING:
                    job.state = JobState.PENDING
                continue
            job.epochs_done = float(st.epochs_done)
            if st.grad_noise is not None:
                batch = float(job.batch_size or job.spec.get("batch_size") or 0)
                noise = B.learned_noise(job.spec, job.job_type, batch, job.epochs_done, job.batch_noise, st.grad_noise)
                if noise is not None:
                    job.batch_noise = noise
            if st.report_error and self._report_errors.get(job.id) != st.report_error:
                log.warning("job %d (%s): %s", job.id, job.name, st.report_error)
            self._report_errors[job.id] = st.report_error
            if st.lost_epochs > job.lost_epochs:
                log.warning("job %d (%s): %.3g epochs lost to restarts so far (no checkpoint held them)",
                            job.id, job.name, st.lost_epochs)
                job.lost_epochs = float(st.lost_epochs)
            if st.backend_ref:
                job.slurm_job_id = st.backend_ref
            if st.state == FINISHED:
                job.state, job.workers, job.ps = JobState.COMPLETED, 0, 0
                job.finished_at = st.finished_at or now
                db_events.record_event(s, EventKind.FINISH, job, {"epochs_done": job.epochs_done}, ts=job.finished_at)
                log.info("job %d (%s) finished", job.id, job.name)
            elif st.state == FAILED:
                job.state, job.workers, job.ps = JobState.FAILED, 0, 0
                job.finished_at = st.finished_at or now
                db_events.record_event(s, EventKind.FAIL, job, {"message": st.message}, ts=job.finished_at)
                log.warning("job %d (%s) failed: %s", job.id, job.name, st.message)
            else:
                # its size is what the backend holds for it (pending in Slurm: what Slurm will start it at); its
                # state and first start are the backend's: a job Slurm holds pending is pending, with its reason
                job.workers, job.ps = int(st.workers), int(st.ps)
                job.state = JobState.RUNNING if st.state == RUNNING and st.workers > 0 else JobState.PENDING
                if job.state == JobState.RUNNING and job.started_at is None:
                    job.started_at = st.started_at or now
        # jobs the backend still runs that the DB says are over (cancelled) or never had: stop them
        for job_id, st in statuses.items():
            if job_id in jobs or st.state in (FINISHED, FAILED):
                continue
            log.info("stopping job %d in the backend: it is not active in the database", job_id)
            self._stop(s, job_id)

    def _stop(self, s: Session, job_id: int) -> None:
        """Stop a job in the backend; it then holds nothing (dl2ctl show and queue said a cancelled job still
        had its workers)."""
        self.backend.cancel(job_id)
        job = s.get(Job, job_id)
        if job is not None:
            job.workers = job.ps = 0

    def _cancel_intents(self, s: Session) -> None:
        """Carry out `dl2ctl cancel`'s journalled cancel intents."""
        for it in db_intents.pending_intents(s):
            if it.kind == IntentKind.CANCEL:
                db_intents.mark_issued(s, it)
                self._stop(s, it.job_id)
                db_intents.mark_done(s, it)

    # ------------------------------------------------------------------------------ crash recovery

    def recover(self) -> int:
        """Replay the journal and close a slot left open; returns the intents replayed."""
        n = 0
        with session_scope(self.engine) as s:
            pending = [it.id for it in db_intents.pending_intents(s)]
        replay: list[int] = []
        for intent_id in pending:
            with session_scope(self.engine) as s:
                it = s.get_one(Intent, intent_id)
                job = s.get_one(Job, it.job_id)
                if it.kind == IntentKind.CANCEL:
                    db_intents.mark_issued(s, it)
                    self._stop(s, job.id)
                    db_intents.mark_done(s, it)
                    n += 1
                    continue
                if JobState(job.state).terminal:
                    db_intents.mark_failed(s, it, f"job {job.id} is {job.state.value}; not replayed")
                    continue
                db_intents.mark_issued(s, it)
            replay.append(intent_id)
        self._apply_intents(replay, replay=True)
        with session_scope(self.engine) as s:
            active = db_jobs.active_job_ids(s)
            self._last_change = db_slots.last_size_changes(s, active)
            self._job_hist = {j: [JS.JobSlotStats(**{k: r[k] for k in JS.JobSlotStats.__dataclass_fields__})
                                  for r in rows]
                              for j, rows in db_slots.recent_job_slot_stats(s, active, JS.HISTORY_SLOTS).items()}
        n += len(replay)
        self.metrics.replayed.inc(n)
        if n:
            log.info("replayed %d journal intent(s)", n)
        with session_scope(self.engine) as s:
            open_slots = db_slots.open_slot_ids(s)
        for slot_id in open_slots:
            log.info("closing slot id %d left open by a previous run", slot_id)
            self.close_slot(slot_id, tick_ms=None, measure=False)
        return n

    # ------------------------------------------------------------------------------ one slot

    def _apply_intents(self, intent_ids: list[int], replay: bool = False) -> dict[str, int]:
        """ISSUED intents, in order -> ``backend.apply`` each -> DONE/FAILED, all marked in one transaction
        after the backend's batch ended (a backend with ``batch()``, like the simulated one, commits its own
        state once there). A crash before that commit leaves them ISSUED: replayed at the next start, where
        ``apply`` is a NOOP for a size already reached. Returns how many were carried out, by method."""
        if not intent_ids:
            return {}
        with session_scope(self.engine) as s:
            its = db_intents.intents_by_id(s, intent_ids)
            jobs = db_jobs.jobs_by_id(s, {it.job_id for it in its.values()})
            work = [(iid, its[iid].kind, _request(jobs[its[iid].job_id]), P.target_from_json(its[iid].target))
                    for iid in intent_ids]
        results: list[tuple[int, JobRequest, Any, Any]] = []  # (intent, request, target, ApplyResult | error)
        batch = getattr(self.backend, "batch", None)
        with batch() if batch is not None else nullcontext():
            for iid, kind, req, target in work:
                self.crash("issued")
                try:
                    results.append((iid, req, target, self.backend.apply(req, target)))
                except BackendError as e:
                    results.append((iid, req, target, e))
                    log.warning("job %d: %s -> %d/%d failed: %s", req.job_id, kind.value, target.workers,
                                target.ps, e)
                except Exception as e:  # noqa: BLE001 - one job's failure must not stop the others' slot
                    log.exception("job %d: %s -> %d/%d failed", req.job_id, kind.value, target.workers, target.ps)
                    results.append((iid, req, target, BackendError(f"job {req.job_id}: {type(e).__name__}: {e}")))
        for r in results:
            if not isinstance(r[3], BackendError):
                self.crash("applied")
        now = self.clock()
        applied: dict[str, int] = {}
        with session_scope(self.engine) as s:
            done = [r for r in results if not isinstance(r[3], BackendError)]
            db_intents.transition_intents(s, [r[0] for r in done], IntentState.DONE)
            for iid, _, _, err in results:
                if isinstance(err, BackendError):
                    db_intents.mark_failed(s, iid, str(err))
            jobs = db_jobs.jobs_by_id(s, {r[1].job_id for r in done}, spec=False)
            events = []
            for _, req, target, res in done:
                job = jobs[req.job_id]
                if replay and res.method == "noop" and (job.workers, job.ps) != (target.workers, target.ps):
                    # the backend reached this size before the crash; the event died with that transaction
                    kind = EventKind.START if job.started_at is None and target.workers > 0 else EventKind.RESIZE
                    events.append((kind, job.id, {"workers": target.workers, "ps": target.ps,
                                                  "method": "applied_before_crash", "replayed": True}, now))
                job.workers, job.ps = res.held or (target.workers, target.ps)
                if target.batch_size and res.held is None:
                    job.batch_size = target.batch_size
                if res.held is None and (target.worker_nodes or target.ps_nodes):
                    self._placed[job.id] = (tuple(target.worker_nodes), tuple(target.ps_nodes))
                else:  # kept as it was, or placed by the backend alone: where it runs is not known here
                    self._placed.pop(job.id, None)
                if res.backend_ref:
                    job.slurm_job_id = res.backend_ref
                if target.workers > 0 and res.running:
                    job.state = JobState.RUNNING
                    if job.started_at is None:
                        job.started_at = now
                elif not JobState(job.state).terminal:  # pending until the backend (Slurm) reports it running
                    job.state = JobState.PENDING
                if res.method in METHOD_EVENT:
                    events.append((METHOD_EVENT[res.method], job.id,
                                   {"workers": target.workers, "ps": target.ps, "method": res.method,
                                    **({"replayed": True} if replay else {})}, now))
                applied[res.method] = applied.get(res.method, 0) + 1
            db_events.record_events(s, events)
        for method, k in applied.items():
            self.metrics.resizes.labels(method).inc(k)
        self.metrics.intent_failures.inc(len(results) - len(done))
        return applied

    def _job_rows(self, s: Session) -> list[P.JobRow]:
        jobs = db_jobs.active_jobs(s, spec=False)
        seen = P.scheduling_window([j.state == JobState.PENDING and not j.workers and not j.ps for j in jobs],
                                   self.pending_window)
        jobs = [jobs[i] for i in seen]
        ids = [j.id for j in jobs]
        counts = db_slots.allocation_counts(s, ids)
        # a spec never changes: read each job's once, and parse its limits and demand once
        by_id = {j.id: j for j in jobs}
        for i, spec in db_jobs.job_specs(s, [i for i in ids if i not in self._rows]).items():
            self._rows[i] = P.job_row(i, by_id[i].job_type, 0.0, 0.0, 0, 0, 0, dict(spec), by_id[i].name)
        self._rows = {i: self._rows[i] for i in ids}  # finished jobs leave the cache
        return [replace(self._rows[j.id], total_epochs=float(j.total_epochs), epochs_done=float(j.epochs_done),
                        workers=int(j.workers), ps=int(j.ps), slots_run=int(counts.get(j.id, 0)),
                        batch_size=float(j.batch_size or 0.0), noise=j.batch_noise) for j in jobs]

    def _predicted_speed(self, view):
        """The speed model's epochs/s of row j of ``view`` at (workers, ps): what ``min_resize_gain`` weighs (a PS
        job: the DL2 speed table's; an all-reduce job: the view's own belief, measured throughput or prior)."""
        allreduce = view.allreduce

        def speed(j: int, w: int, p: int) -> float:
            if allreduce[j]:
                return float(view.est_speed[j, 0, min(w, view.max_workers)])
            return float(epochs_trained(self._speed_table, [view.type_idx[j]], [p], [w])[0])
        return speed

    def _remember_beliefs(self, view) -> None:
        """Each all-reduce job's believed speed by worker count, for the slot's speed factor (close_slot)."""
        self._believed = {int(view.job_ids[j]): view.est_speed[j, 0] for j in np.flatnonzero(view.allreduce)}

    def _believed_speed(self, job_id: int, workers: int) -> float | None:
        curve = self._believed.get(job_id)
        if curve is None or workers >= len(curve):
            return None
        return float(curve[workers])

    def tick(self) -> SlotOutcome:
        """Everything of a slot before the wait: poll, reconcile, decide, journal, apply."""
        t0 = time.perf_counter()
        now = self.clock()
        with session_scope(self.engine) as s:
            number = db_slots.next_slot_number(s)
        self._slot_samples = []
        if self.poller is not None:
            self.poll_agents(retention=number % self.retention_every == 0)
        with session_scope(self.engine) as s:
            if self.feeder is not None:
                self.feeder(s, number, now)
            self._cancel_intents(s)
            statuses = self.backend.observe()
            nodes = self.backend.nodes()  # after observe: the backend reuses its listing of the jobs
            self.reconcile(s, statuses, now)
            rows = self._job_rows(s)
        hist = {r.id: self._job_hist[r.id] for r in rows if r.id in self._job_hist}
        flags = JS.job_flags(hist)
        for r in rows:  # sized by dl2d, held pending by the backend: its reason is the backend's (Slurm's)
            st = statuses.get(r.id)
            if st is not None and st.state == PENDING and st.workers > 0 and st.message:
                flags.setdefault(r.id, []).append(f"pending: {st.message}")
            if st is not None and st.report_error:
                flags.setdefault(r.id, []).append(st.report_error)
        view = P.build_view(number, rows, nodes, slot_seconds=self.slot_seconds,
                            speed_factor=JS.speed_factor_estimate(hist),
                            shared_gpu={j: "shared_gpu" in f for j, f in flags.items()},
                            worker_bound=self.max_workers, placed=self._placed,
                            observed={j: st.nodes for j, st in statuses.items()})
        view = B.believed_view(view, self.batch_rule)  # an adaptive job's speeds at the best batch of each size
        self._remember_beliefs(view)
        td = time.perf_counter()
        g = P.guard(view, self.policy, self.fallback, self.state.starved, self.starve_slots)
        decide_ms = 1000 * (time.perf_counter() - td)
        speed = self._predicted_speed(view)
        bounds = {r.id: r.max_workers for r in rows}
        alloc, held = damp(view, g.allocation, self._last_change, self.hysteresis, speed)
        for job_id, why in held.items():
            flags.setdefault(job_id, []).append(why)
        if getattr(self.backend, "even_gres", False):  # Slurm: a job's nodes all get the same GPUs
            alloc, cut = P.even_gres(view, alloc, bounds)
            for job_id, why in cut.items():
                flags.setdefault(job_id, []).append(why)
            held = {**held, **cut}
        alloc, cut = P.below_minimum(view, alloc, {r.id: int(r.spec["min_workers"]) for r in rows
                                                   if (r.spec or {}).get("min_workers")})
        for job_id, why in cut.items():
            flags.setdefault(job_id, []).append(why)
        held = {**held, **cut}
        alloc = B.with_batches(view, alloc, self.batch_rule)  # an adaptive job's batch with its GPUs
        advised = alloc
        if self.carried_out is not None:  # advise mode: what the cluster does without dl2d runs instead
            alloc = self.carried_out(view)
        if self.policy is not None:  # the policy hears what is carried out: its own decision, or another's
            self.policy.applied(view, alloc, overridden=g.source == "fallback" or bool(held) or alloc is not advised)
        self.state.starved = P.update_starved(view, alloc, self.state.starved)
        usage = place(view, alloc)[0]  # the guardrails checked it fits
        for job_id, why in P.pending_reasons(view, alloc, usage).items():
            if not any(f.startswith("pending: ") for f in flags.get(job_id, [])):  # a reason said already wins
                flags.setdefault(job_id, []).append(f"pending: {why}")
        for job_id, why in could_use(view, alloc, bounds, lambda j, w: speed(j, w, 0),
                                     even=getattr(self.backend, "even_gres", False)).items():
            flags.setdefault(job_id, []).append(why)
        self.node_report = P.node_report(view, nodes, usage, self.poller.health() if self.poller is not None else {})
        self.metrics.set_cluster(self.node_report)
        names, limits = [n.name for n in nodes], {r.id: (r.max_workers, r.max_ps) for r in rows}
        planned, sizes = P.plan_targets(view, alloc, names, limits)
        advice = None
        if alloc is not advised:
            advice = P.advice_record(getattr(self.policy, "name", "policy"), P.plan_targets(view, advised, names,
                                     limits)[1], sizes, speed,
                                     {int(i): j for j, i in enumerate(view.job_ids)})
        self._last_change.update({r.id: number for r in rows if sizes[r.id] != (r.workers, r.ps)})
        self.metrics.set_jobs(sizes, {r.id: r.name for r in rows})
        version = getattr(self.learner, "version", None)
        with session_scope(self.engine) as s:
            allocs = [db_slots.AllocationRecord(r.id, *sizes[r.id], r.workers, r.ps) for r in rows]
            decision = db_slots.DecisionRecord(
                state_digest=state_digest(P.view_digest_input(view)),
                actions=[[r.id, *sizes[r.id]] for r in rows], source=g.source, fallback_reason=g.reason,
                policy_version=version, latency_ms=decide_ms,
                job_flags={str(j): f for j, f in flags.items()} or None, advice=advice,
                policy=getattr(self.policy, "name", None))
            slot = db_slots.record_slot(s, number, now, allocs, decision, policy_version=version)
            slot_id = slot.id
            intent_ids = [it.id for it in db_intents.plan_intents(
                s, slot, [(t.job_id, t.kind, P.target_to_json(t.target)) for t in planned])]
            if g.source == "fallback":
                db_events.record_event(s, EventKind.FALLBACK, None, {"slot": number, "reason": g.reason}, ts=now)
        self.crash("planned")
        if g.source == "fallback":
            self.state.fallbacks += 1
            self.metrics.fallbacks.inc()
            log.warning("slot %d: fallback to %s: %s", number, getattr(self.fallback, "name", "heuristic"), g.reason)
        if intent_ids:  # issued together, then carried out in order (shrinks first)
            with session_scope(self.engine) as s:
                db_intents.transition_intents(s, intent_ids, IntentState.ISSUED)
        applied = self._apply_intents(intent_ids)
        tick_ms = 1000 * (time.perf_counter() - t0)
        self.metrics.decisions.labels(g.source).inc()
        self.metrics.decide.observe(decide_ms / 1000)
        self.metrics.tick.observe(tick_ms / 1000)
        self.metrics.slot.set(number)
        out = SlotOutcome(number, len(rows), g.source, g.reason, len(intent_ids), applied, tick_ms, decide_ms)
        self._slot_id = slot_id
        return out

    def close_slot(self, slot_id: int, tick_ms: float | None, measure: bool = True) -> float:
        """Reward from the backend's progress, reconcile, store; the online RL update and checkpoint.

        ``measure=False`` (a slot a crash interrupted, closed at the next start): no per-job speed statistics,
        since how long the slot really ran and what the agents saw in it are unknown; zero-speed rows would
        skew the job_speed report and flag healthy jobs slow."""
        statuses = self.backend.observe()
        now = self.clock()
        with session_scope(self.engine) as s:
            jobs = db_jobs.active_jobs(s)
            before = {j.id: float(j.epochs_done) for j in jobs}
            totals = {j.id: float(j.total_epochs) for j in jobs}
            reward = P.slot_reward(before, statuses, totals)
            db_slots.finish_slot(s, slot_id, now, reward, duration_ms=tick_ms)
            measured = JS.measure_slot([JS.RanJob(j.id, j.job_type, int(j.workers), int(j.ps), before[j.id],
                                                  self._believed_speed(j.id, int(j.workers)))
                                        for j in jobs], statuses, self._slot_samples, self.slot_seconds,
                                       self._speed_table) if measure else []
            db_slots.record_job_slot_stats(s, slot_id, [m.row() for m in measured])
            for m in measured:
                self._job_hist[m.job_id] = [*self._job_hist.get(m.job_id, []), m][-JS.HISTORY_SLOTS:]
            self._job_hist = {j: h for j, h in self._job_hist.items() if j in before}
            self._placed = {j: p for j, p in self._placed.items() if j in before}
            self.reconcile(s, statuses, now)
            self._count_jobs(s)
        self.crash("closed")
        self.metrics.reward.set(reward)
        if self.policy is not None:
            self.policy.observe(reward)
        if self.learner is not None:
            self._record_reverts()
            stats = self.learner.stats
            self.metrics.policy_version.set(self.learner.version)
            self._closed += 1
            if self.checkpoint_path and stats.updates and self._closed % self.checkpoint_every == 0:
                self.learner.save(self.checkpoint_path, {"slot_id": slot_id})
                log.info("policy checkpoint written: %s (version %d)", self.checkpoint_path, self.learner.version)
        return reward

    def _record_reverts(self) -> None:
        """The online learner's reverts to its last good parameters: an event each, a warning, a metric; the
        reverted policy is checkpointed at once (a restart must not resume the parameters that failed)."""
        reverts = self.learner.take_reverts() if hasattr(self.learner, "take_reverts") else []
        if not reverts:
            return
        with session_scope(self.engine) as s:
            for r in reverts:
                db_events.record_event(s, EventKind.POLICY_REVERT, None, r, ts=self.clock())
        for r in reverts:
            self.metrics.policy_reverts.inc()
            log.warning("online policy reverted to version %s's parameters (now version %s): %s",
                        r.get("good_version"), r.get("policy_version"), r.get("reason"))
        if self.checkpoint_path:
            self.learner.save(self.checkpoint_path, {"reverted": True})

    def _count_jobs(self, s: Session) -> None:
        counts = db_jobs.count_jobs_by_state(s)
        for st in JobState:
            self.metrics.jobs.labels(st.value).set(counts.get(st, 0))

    def wait_slot_end(self, deadline: float) -> bool:
        """Sleep until ``deadline`` (monotonic), polling agents and pinging the watchdog; False if stopped."""
        next_poll = time.monotonic() + self.poll_interval
        while True:
            self.notifier.ping()
            now = time.monotonic()
            if now >= deadline:
                return True
            if self.poller is not None and now >= next_poll:
                self.poll_agents()
                next_poll = time.monotonic() + self.poll_interval
            wake = min(deadline, next_poll if self.poller is not None else deadline, now + self.notifier.max_sleep)
            if self.stop.wait(max(wake - time.monotonic(), 0.0)):
                return False

    def run_slot(self) -> SlotOutcome | None:
        """One whole slot; None when a stop request came while waiting for the slot's end (left open)."""
        started = time.monotonic()
        out = self.tick()
        if self.pace and not self.wait_slot_end(started + self.slot_seconds):
            log.info("stop requested during slot %d: leaving it open (closed at the next start)", out.number)
            return None
        self.backend.end_slot(self.slot_seconds)
        self.crash("ended")
        out.reward = self.close_slot(self._slot_id, out.tick_ms)
        self.state.slots += 1
        self.state.last = out
        self.state.tick_ms.append(out.tick_ms)
        self.metrics.heartbeat.set(time.time())
        self.notifier.ping(force=True)
        self.notifier.status(f"slot {out.number}: {out.jobs} jobs, {out.intents} resizes, {out.source}, "
                             f"tick {out.tick_ms:.0f} ms")
        self.write_status("running")
        # a slot that changed nothing (no resize, no fallback) is a DEBUG line: a quiet cluster makes a quiet log
        level = logging.INFO if out.intents or out.source == "fallback" else logging.DEBUG
        log.log(level, "slot %d: %d jobs, decided by %s%s, %d intents %s, tick %.1f ms, reward %.4f", out.number,
                 out.jobs, out.source, f" ({out.reason})" if out.reason else "", out.intents, out.applied,
                 out.tick_ms, out.reward)
        return out

    def idle(self) -> bool:
        """No active job in the DB."""
        with session_scope(self.engine) as s:
            return not db_jobs.count_active_jobs(s)

    def status_doc(self, state: str | None = None) -> dict[str, Any]:
        """The daemon's state as the status file and the control socket's ``status`` give it (``state``: the
        loop's, else the last one written)."""
        if state is not None:
            self._status_state = state
        last = self.state.last
        return {"pid": os.getpid(), "state": self._status_state, "started_at": self.started_at,
                "updated_at": time.time(), "slot": last.number if last else None, "slots_run": self.state.slots,
                "last_tick_ms": round(last.tick_ms, 3) if last else None,
                "last_source": last.source if last else None, "fallbacks": self.state.fallbacks,
                "stale_nodes": sorted(self.poller.stale_nodes) if self.poller is not None else [],
                "policy_version": getattr(self.learner, "version", None), **self.info, "nodes": self.node_report}

    def write_status(self, state: str) -> None:
        doc = self.status_doc(state)
        if self.status_file:
            write_json_atomic(self.status_file, doc, fsync=False, indent=1)

    def run(self, max_slots: int = 0, until_idle: Callable[[], bool] | None = None) -> int:
        """Recover, then run slots until stopped, ``max_slots`` reached or ``until_idle()`` says so.

        A retryable :class:`BackendError` (e.g. slurmctld down through the driver's own retries) does not
        stop the daemon: the slot is skipped (logged, ``dl2d_backend_errors_total``, status ``degraded``),
        the loop waits 1, 2, 4 ... s (at most a slot) and recovers again (journal replay, closing a slot
        left open) before the next slot. Other errors propagate (systemd restarts the daemon)."""
        n, outage, recovered = 0, 0, False
        while not self.stop.is_set():
            try:
                if not recovered:
                    self.recover()
                    recovered = True
                    self.write_status("running")
                    if outage:
                        log.info("backend available again after %d failed attempt(s)", outage)
                        outage = 0
                if self.reload.is_set() and self.reloader is not None:  # between two slots, never mid-slot
                    self.reload.clear()
                    self.reloader(self)
                if max_slots and n >= max_slots:
                    break
                if until_idle is not None and until_idle():
                    break
                if self.run_slot() is None:
                    break
                n += 1
            except BackendError as e:
                if not e.retryable:
                    raise
                outage, recovered = outage + 1, False
                self.metrics.backend_errors.inc()
                delay = min(self.slot_seconds, 2.0 ** min(outage - 1, 16))
                log.warning("backend unavailable, slot skipped (attempt %d, retrying in %.0f s): %s", outage, delay, e)
                self.write_status("degraded")
                if not self.wait_slot_end(time.monotonic() + delay):
                    break
        if self.learner is not None and self.checkpoint_path and self.learner.stats.updates:
            self.learner.save(self.checkpoint_path, {"final": True})
        self.write_status("stopped")
        return n
