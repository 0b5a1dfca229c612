""":class:`SlurmBackend`: the daemon's :class:`~dl2d.daemon.backend.ClusterBackend` on Slurm, one Slurm
batch job per dl2d job (design: docs/slurm.md).

The I/O shell around the pure parts: it asks Slurm (through a :class:`~dl2d.slurm.driver.SlurmDriver`,
wrapped in a retrying one) and the job's directory (:mod:`~dl2d.daemon.slurm.jobdir`) for the facts,
lets :mod:`~dl2d.daemon.slurm.mapping` size the job and :mod:`~dl2d.daemon.slurm.planning` decide, and
carries the decision out.

The Slurm job carries ``--comment=dl2d:<id>:<token>`` (a secret token made for each submission and recorded
before ``sbatch``) and the name ``<prefix><id>``, so a backend whose record lacks a job it just submitted
(daemon killed between ``sbatch`` and the record write) adopts the active Slurm job instead of submitting a
second one — only when the comment carries the recorded token and Slurm runs it as the job's user: anyone can
name and comment a job of their own with a guessed id, and such a job is left alone.

What a job writes (its progress, its coordinator) is its owner's word: it is checked
(:mod:`~dl2d.daemon.slurm.jobreport`) before it is believed, and a job whose files are refused, or whose
observation fails in any other way, fails alone, with the reason: the others' slot goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from dl2d.core.files import LockHeld, SecretFileError, hold_lock
from dl2d.daemon.backend import (
    FAILED,
    FINISHED,
    HOT,
    NOOP,
    RESTART,
    SHRINK,
    START,
    STOP,
    ApplyResult,
    BackendError,
    JobRequest,
    JobStatus,
    NodeInfo,
    Target,
)
from dl2d.daemon.slurm.jobdir import JobDir, batch_script, known_job_ids, launch_of, number_text, record_slurm_ids
from dl2d.daemon.slurm.jobreport import JobReportError, checked_coordinator, checked_progress
from dl2d.daemon.slurm.mapping import (
    NodeShape,
    SlurmAllocation,
    SlurmNodeSelection,
    TaskSize,
    allocation_for,
    allocation_for_selection,
    allocation_record,
    gpus_held_by_others,
    held_allocation,
    job_demand,
    node_info,
    node_shape,
    nodes_to_host,
    target_selection,
)
from dl2d.daemon.slurm.planning import (
    Current,
    is_elastic,
    plan_apply,
    progress_state,
    runtime_scales_hot,
    status_from,
    time_limit,
)
from dl2d.daemon.slurm.settings import (
    SlurmBackendConfig,
    SlurmSection,
    run_jobs_as_problem,
    settings_from_section,
)
from dl2d.slurm.backoff import RetryingDriver
from dl2d.slurm.driver import (
    JobSpec,
    SlurmDriver,
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmUnavailable,
    UnixUser,
    UnknownUserError,
    lookup_user,
    process_user,
    submission_comment,
)
from dl2d.slurm.rights import check_at_start

log = logging.getLogger(__name__)

#: ``scaler(coordinator_address, workers, ps, timeout, secret) -> dict``; dl2d.elastic.control.scale, which
#: authenticates with the job's secret (``JobDir.secret()``; None for a job submitted before there were any).
Scaler = Callable[[str, int, int, float, str | None], dict]


def _default_scaler(addr: str, workers: int, ps: int, timeout: float, secret: str | None) -> dict:
    from dl2d.elastic.control import scale
    return scale(addr, workers=workers, ps=ps, method="hot", timeout=timeout, secret=secret)


class SlurmBackend:
    """:class:`~dl2d.daemon.backend.ClusterBackend` on Slurm (see the module doc).

    ``driver``: a SlurmDriver (e.g. ``make_driver("cli", env={"SLURM_CONF": ...})``); it is
    wrapped in a :class:`~dl2d.slurm.backoff.RetryingDriver` unless ``retry=False``.
    Errors: :class:`BackendError` with ``retryable=True`` when the controller stayed unreachable
    through the backoff, ``retryable=False`` for anything else.
    """

    name = "slurm"
    #: a job's request gives each of its nodes the same GPUs (``--gres`` is per node): the daemon sizes all-reduce
    #: jobs so that they hold no GPU beyond their workers' (dl2d.daemon.plan.even_gres)
    even_gres = True

    def __init__(self, driver: SlurmDriver, config: SlurmBackendConfig, *, retry: bool = True,
                 scaler: Scaler | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.raw_driver = driver
        self.config = config
        self.scaler = scaler or _default_scaler
        self.sleep = sleep
        self.clock = clock
        # Called on every wait inside apply (a checkpoint that takes up to checkpoint_timeout_s, twice; the
        # driver's backoff while slurmctld is down): the daemon hands its watchdog ping here, so a job that
        # ignores its checkpoint signal never gets a healthy daemon killed by systemd's WatchdogSec.
        self.heartbeat: Callable[[], object] = lambda: None
        self.driver = RetryingDriver(driver, config.backoff, sleep=self._pause) if retry else driver
        self._cache: dict[str, tuple[float, Any]] = {}
        self.rights_problem: str | None = None  # what check_rights() found missing to drain nodes
        self._left_alone: set[str] = set()  # Slurm jobs that carry a job's name but not its submission (logged once)
        self._refused_coordinators: set[int] = set()  # jobs whose coordinator.json was refused (logged once)
        self._lock: Any = None  # the state dir's lock file, once lock() took it
        self._own_ids: set[str] | None = None  # every Slurm id this state's records name (_own_slurm_ids)
        jobs = config.state_dir / "jobs"
        made = [d for d in (config.state_dir, jobs) if not d.exists()]
        jobs.mkdir(parents=True, exist_ok=True)
        for d in {*made, jobs}:
            if d.stat().st_uid == os.geteuid():
                d.chmod(0o711)  # whatever the umask: a job's user reaches its own directory, lists no other

    # -- files ------------------------------------------------------------------------------
    def job_dir(self, job_id: int) -> Path:
        return self.config.state_dir / "jobs" / str(int(job_id))

    def _dir(self, job_id: int) -> JobDir:
        return JobDir(self.job_dir(job_id))

    def _record(self, job_id: int) -> dict[str, Any]:
        return self._dir(job_id).record()

    def _save(self, job_id: int, record: dict[str, Any]) -> None:
        self._dir(job_id).save_record(record)
        if self._own_ids is not None:
            self._own_ids.update(record_slurm_ids(record))

    def _write_target(self, job_id: int, target: Target) -> None:
        selection = self._selection(target)
        self._dir(job_id).write_target(target, selection.hostfile if selection is not None else None)

    def _progress(self, job_id: int) -> dict[str, Any] | None:
        """The job's last progress report, checked (JobReportError names what is refused)."""
        return self._progress_and_mtime(job_id)[0]

    def _progress_and_mtime(self, job_id: int) -> tuple[dict[str, Any] | None, float | None]:
        doc, mtime = self._dir(job_id).progress_and_mtime()
        return checked_progress(doc), mtime

    def _coordinator(self, job_id: int) -> tuple[dict[str, Any] | None, float | None]:
        """An elastic job's published coordinator, checked; (None, None) when it has none or it is refused (a
        refused one is logged once; the job is then resized by relaunch, never hot)."""
        try:
            doc, written = self._dir(job_id).coordinator()
            return checked_coordinator(doc), written
        except JobReportError as e:
            if job_id not in self._refused_coordinators:
                self._refused_coordinators.add(job_id)
                log.warning("job %s: its coordinator.json is refused (%s); it is resized by relaunch", job_id, e)
            return None, None

    def lock(self) -> None:
        """Hold an exclusive lock on the state dir (``<state_dir>/dl2d-slurm.lock``) while this backend lives:
        two daemons on one state dir would each take the other's jobs for their own. ValueError names the other
        holder's pid."""
        try:
            self._lock = hold_lock(self.config.state_dir / "dl2d-slurm.lock")
        except LockHeld as e:
            raise ValueError(f"slurm.state_dir {self.config.state_dir} is in use by another dl2d (pid {e.pid}); give "
                             "each daemon its own [slurm] state_dir") from None

    # -- Slurm access -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _slurm(self, what: str, mutates: bool = True) -> Iterator[None]:
        try:
            yield
        except SlurmUnavailable as e:
            raise BackendError(f"Slurm unavailable while {what}: {e}", retryable=True) from e
        except SlurmError as e:
            raise BackendError(f"Slurm refused {what}: {e}", retryable=False) from e
        finally:
            if mutates:
                self._cache.clear()

    def _cached(self, key: str, fetch: Callable[[], Any], fresh: bool) -> Any:
        """``fetch()``, reused for ``cache_ttl_s`` unless ``fresh`` or Slurm was changed since
        (so one slot's observe + applies cost one ``squeue`` and one ``sinfo``)."""
        hit = self._cache.get(key)
        if not fresh and hit is not None and self.clock() - hit[0] < self.config.cache_ttl_s:
            return hit[1]
        value = fetch()
        self._cache[key] = (self.clock(), value)
        return value

    def _jobs(self, fresh: bool = False) -> list[SlurmJob]:
        def fetch() -> list[SlurmJob]:
            with self._slurm("listing jobs", mutates=False):
                return self.driver.jobs()
        return self._cached("jobs", fetch, fresh)

    def _slurm_nodes(self, fresh: bool = False) -> list[SlurmNode]:
        def fetch() -> list[SlurmNode]:
            with self._slurm("listing nodes", mutates=False):
                return self.driver.nodes()
        return self._cached("nodes", fetch, fresh)

    def _live_job(self, job_id: int, record: Mapping[str, Any],
                  jobs: list[SlurmJob]) -> tuple[SlurmJob | None, SlurmJob | None]:
        """(the job's active Slurm job or None, its latest Slurm job or None). The record's
        Slurm id comes first; an active Slurm job with this job's comment and name that the
        record does not know (submitted just before a crash) is adopted."""
        by_id = {j.job_id: j for j in jobs}
        latest = by_id.get(str(record.get("slurm_job_id") or ""))
        if latest is not None and latest.active:
            return latest, latest
        name = f"{self.config.job_name_prefix}{job_id}"
        known = set(map(str, record.get("slurm_job_ids") or []))
        # Anyone can name a job and comment it with a guessed id: only the submission's own token (recorded before
        # sbatch, never derived from the id) and the user it was submitted as make an unknown Slurm job this job's.
        token, user = record.get("submit_token"), record.get("user")
        comment = submission_comment(str(job_id), token) if token else None
        # Known ids that are still active are earlier runs being replaced: not adopted.
        orphans = [j for j in jobs if j.active and comment and user and j.comment == comment
                   and j.name == name and j.job_id not in known and j.user == user]
        for j in jobs:
            if j.active and j.dl2d_job_id == str(job_id) and j.job_id not in known and j not in orphans \
                    and j.job_id not in self._left_alone:
                self._left_alone.add(j.job_id)
                log.warning("job %s: Slurm job %s (user %s) carries its name or id but not its submission's token "
                            "and user; left alone", job_id, j.job_id, j.user or "?")
        if orphans and not record.get("cancelled"):
            adopted = max(orphans, key=lambda j: int(j.job_id) if j.job_id.isdigit() else 0)
            return adopted, adopted
        return None, latest

    # -- ClusterBackend -----------------------------------------------------------------------
    def nodes(self) -> list[NodeInfo]:
        """Slurm's nodes, each with the GPUs that Slurm jobs not dl2d's hold there (``gpus_other``: the view leaves
        them out, so dl2d never counts free a GPU another user's job holds). The daemon's slot calls it right after
        :meth:`observe`, whose job list it reuses (one ``squeue`` a slot)."""
        nodes = self._slurm_nodes(fresh=True)
        other = gpus_held_by_others(nodes, self._jobs(), self._own_slurm_ids())
        return [node_info(n, other.get(n.name, 0)) for n in nodes]

    def _own_slurm_ids(self) -> set[str]:
        """The Slurm ids of every run of every job of this daemon's state: its records' once, then kept by
        :meth:`_save`, through which every Slurm id a record gains is written."""
        if self._own_ids is None:
            self._own_ids = set()
            for job_id in known_job_ids(self.config.state_dir / "jobs"):
                self._own_ids.update(record_slurm_ids(self._record(job_id)))
        return self._own_ids

    def observe(self) -> dict[int, JobStatus]:
        """Every job's status. One job's bad files, or any other failure to observe one job, fail that job with
        the reason (:meth:`_fail_job`); Slurm's or the daemon's own file system's errors stop the slot."""
        jobs = self._jobs(fresh=True)
        out: dict[int, JobStatus] = {}
        for job_id in known_job_ids(self.config.state_dir / "jobs"):
            try:
                out[job_id] = self._observe_job(job_id, jobs)
            except (BackendError, OSError):
                raise
            except JobReportError as e:
                out[job_id] = self._fail_job(job_id, f"its progress file is refused: {e}", jobs)
            except Exception as e:  # noqa: BLE001 - one job's failure must not stop the others' slot
                log.exception("job %s: cannot be observed", job_id)
                out[job_id] = self._fail_job(job_id, f"dl2d could not observe it: {type(e).__name__}: {e}", jobs)
        return out

    def _observe_job(self, job_id: int, jobs: list[SlurmJob]) -> JobStatus:
        record = self._record(job_id)
        live, latest = self._live_job(job_id, record, jobs)
        if live is not None and str(record.get("slurm_job_id")) != live.job_id:
            record = self._adopt(job_id, record, live)
        ended = bool(record.get("final") or record.get("cancelled"))
        now = time.time()
        try:
            progress, mtime = self._progress_and_mtime(job_id)
        except JobReportError:
            if not ended:
                raise
            progress, mtime = None, None  # refused once already: the job is over, its file no longer matters
        if live is not None and ended:
            # dl2d ended it (failed, finished, cancelled): Slurm must hold nothing of it (retried every slot)
            self._cancel_quietly(job_id, live)
        elif live is not None and progress_state(progress) == "done":
            record = self._ended_when_done(job_id, record, live, now)
        status = status_from(job_id, record, live or latest, progress, mtime, now)
        # Remember how and when a job ended: Slurm forgets finished jobs after MinJobAge.
        if status.state in (FINISHED, FAILED) and not ended:
            at = status.finished_at.timestamp() if status.finished_at else None
            self._save(job_id, {**record, "final": status.state, "message": status.message, "finished_at": at})
        return status

    def _ended_when_done(self, job_id: int, record: dict[str, Any], live: SlurmJob, now: float) -> dict[str, Any]:
        """A job that says done while its Slurm job runs on holds GPUs outside dl2d's accounting: it is RUNNING
        until ``done_grace_s`` after dl2d first saw it say so, then its Slurm job is cancelled; it is FINISHED once
        Slurm holds nothing of it (its finish time Slurm's EndTime)."""
        seen = record.get("done_seen_at")
        if not isinstance(seen, (int, float)):
            record = {**record, "done_seen_at": now}
            self._save(job_id, record)
        elif now - seen >= self.config.done_grace_s:
            if not record.get("ending"):
                log.warning("job %s says done but its Slurm job %s still runs %.0f s later; cancelling it",
                            job_id, live.job_id, now - seen)
                record = {**record, "ending": "said done"}
                self._save(job_id, record)
            self._cancel_quietly(job_id, live)
        return record

    def _cancel_quietly(self, job_id: int, live: SlurmJob) -> None:
        """scancel a Slurm job that dl2d has ended; a refusal is logged and tried again at the next observe."""
        try:
            with self._slurm(f"cancelling job {live.job_id}"):
                self.driver.cancel(live.job_id)
        except BackendError as e:
            log.warning("job %s: cannot cancel its Slurm job %s yet: %s", job_id, live.job_id, e)

    def _fail_job(self, job_id: int, message: str, jobs: list[SlurmJob] | None = None,
                  record: dict[str, Any] | None = None) -> JobStatus:
        """Fail one job for good, with the reason (FAILED in the record, so in the database, its event and
        ``dl2ctl show``), and cancel its Slurm job; the daemon goes on with the others. ``record``: the caller's
        newer one than the file's, where it has one."""
        record = record if record is not None else self._record(job_id)
        live, latest = self._live_job(job_id, record, jobs if jobs is not None else self._jobs())
        log.error("job %s failed: %s", job_id, message)
        record = {**record, "job_id": job_id, "final": FAILED, "message": message, "finished_at": time.time(),
                  "submitting": False}
        self._save(job_id, record)
        if live is not None:
            self._cancel_quietly(job_id, live)
        return status_from(job_id, record, live or latest, None)

    def apply(self, job: JobRequest, target: Target) -> ApplyResult:
        try:
            return self._apply(job, target)
        except JobReportError as e:
            message = f"its progress file is refused: {e}"
            self._fail_job(job.job_id, message)
            raise BackendError(f"job {job.job_id}: {message}", retryable=False) from None

    def _apply(self, job: JobRequest, target: Target) -> ApplyResult:
        if target.workers < 0 or target.ps < 0:
            raise BackendError(f"job {job.job_id}: negative target {target}")
        spec = dict(job.spec or {})
        record = self._record(job.job_id)
        if record.get("cancelled"):
            raise BackendError(f"job {job.job_id} was cancelled; it cannot be started again")
        elastic = is_elastic(spec)
        # First from the lists of this slot's observe() (cheap); a decision to change anything
        # is re-made on fresh lists, so only NOOPs ever rest on a cached view.
        for fresh in (False, True):
            live, _ = self._live_job(job.job_id, record, self._jobs(fresh=fresh))
            if live is not None and str(record.get("slurm_job_id")) != live.job_id:
                record = self._adopt(job.job_id, record, live)
            held = held_allocation(live, record)
            needed = hosting = None
            if (target.workers, target.ps) != (0, 0):
                needed, hosting = self._size(job, target, held, fresh)
            progress = self._progress(job.job_id)
            applied = record.get("applied") or {}
            # the total batch its run was started at, and the one it is to run at (its own unless the target says)
            ran_at = float(applied.get("batch_size") or spec.get("batch_size") or 0.0) \
                if spec.get("adaptive_batch") else 0.0
            target = replace(target, batch_size=float(target.batch_size or ran_at))
            cur = Current(
                slurm_state=live.state if live is not None else None,
                allocation=held,
                applied=(int(applied.get("workers", 0)), int(applied.get("ps", 0))),
                finished=progress_state(progress) == "done" or record.get("final") == FINISHED,
                elastic=elastic,
                hot_scaling=self._runtime_scales_hot(job.job_id, elastic, live, progress),
                fixed_size=launch_of(job.spec or {}) == "srun",
                new_batch=bool(applied) and target.batch_size != ran_at and (target.workers, target.ps) != (0, 0),
            )
            failed = live is None and record.get("final") == FAILED
            plan = plan_apply(cur, target, needed, hosting)
            method = plan.method
            if method == NOOP and not failed:
                break
        if failed and (target.workers, target.ps) != (0, 0):
            raise BackendError(f"job {job.job_id} failed ({record.get('message')}); "
                               "it is not restarted", retryable=False)
        log.info("job %s: %s -> %s/%s: %s", job.job_id, cur, target.workers, target.ps, method)
        record = {**record, "job_id": job.job_id, "elastic": elastic,
                  "target": {"workers": target.workers, "ps": target.ps,
                             **({"batch_size": target.batch_size} if target.batch_size else {})}}
        if method == NOOP:
            if needed is not None and live is not None and plan.reached:
                self._write_target(job.job_id, target)
                record["applied"] = record["target"]
            self._save(job.job_id, record)
            held = None if plan.reached else cur.applied
            return ApplyResult(job.job_id, NOOP, str(record.get("slurm_job_id") or ""),
                               running=live is not None and live.state == "RUNNING", held=held)
        assert live is not None or method == START
        if method == STOP:
            self._save(job.job_id, record)
            self._checkpoint_and_end(live)
            record.update(stopped=True, applied={"workers": 0, "ps": 0})
            self._save(job.job_id, record)
            return ApplyResult(job.job_id, STOP, live.job_id)
        assert needed is not None
        record["stopped"] = False
        if method == START:
            if live is not None:  # pending at another size: replace it
                with self._slurm(f"cancelling pending job {live.job_id}"):
                    self.driver.cancel(live.job_id)
                self._wait_ended(live.job_id, self.config.checkpoint_timeout_s)
            return self._submit(job, record, target, needed)
        if method == HOT:
            if self._hot_scale(job.job_id, target):
                record["applied"] = record["target"]
                self._write_target(job.job_id, target)
                self._save(job.job_id, record)
                return ApplyResult(job.job_id, HOT, live.job_id)
            method = RESTART  # the job could not be scaled hot: relaunch it
        if method == SHRINK:
            assert plan.allocation is not None
            if elastic and not self._hot_scale(job.job_id, target):
                method = RESTART
            else:
                keep = plan.allocation.nodes
                self._write_target(job.job_id, target)
                self._save(job.job_id, record)
                try:
                    with self._slurm(f"shrinking job {live.job_id} to {keep} nodes"):
                        self.driver.shrink(live.job_id, keep)
                except BackendError as e:
                    # Slurm may refuse to resize a job again (without slurmdbd a resized job never gets the
                    # accounting index a later update waits for: "try again in a bit", forever): the size is
                    # still reached, by a relaunch (which fails in turn if slurmctld is really down).
                    log.warning("job %d: Slurm refused the in-place shrink (%s); relaunching it at the new size",
                                job.job_id, e)
                    method = RESTART
                else:
                    record["applied"] = record["target"]
                    record["allocation"] = allocation_record(plan.allocation)
                    self._save(job.job_id, record)
                    return ApplyResult(job.job_id, SHRINK, live.job_id)
        # RESTART: checkpoint, then requeue at the new size or submit anew.
        self._write_target(job.job_id, target)
        self._save(job.job_id, record)
        self._checkpoint_and_end(live)
        if progress_state(self._progress(job.job_id)) == "done":
            record["applied"] = {"workers": 0, "ps": 0}
            self._save(job.job_id, record)
            return ApplyResult(job.job_id, NOOP, live.job_id)  # it finished meanwhile
        # requeue can change a pending job's node count, not what it asks of each node.
        held = held_allocation(live, record)
        if self.config.restart_method == "requeue" and held is not None \
                and replace(needed, nodes=held.nodes) == held:
            with self._slurm(f"requeueing job {live.job_id} at {needed.nodes} nodes"):
                self.driver.requeue(live.job_id, num_nodes=needed.nodes)
            record["applied"] = record["target"]
            record["allocation"] = allocation_record(needed)
            self._save(job.job_id, record)
            return ApplyResult(job.job_id, RESTART, live.job_id, running=False)
        result = self._submit(job, record, target, needed)
        return ApplyResult(job.job_id, RESTART, result.backend_ref, running=False)

    def cancel(self, job_id: int) -> None:
        record = self._record(job_id)
        if not record:
            return
        record["cancelled"] = True
        self._save(job_id, record)
        live, _ = self._live_job(job_id, {**record, "cancelled": False}, self._jobs(fresh=True))
        if live is not None:
            with self._slurm(f"cancelling job {live.job_id}"):
                self.driver.cancel(live.job_id)

    def drain(self, node: str, reason: str) -> None:
        with self._slurm(f"draining {node}" + (f" ({self.rights_problem})" if self.rights_problem else "")):
            self.driver.drain_node(node, reason or "dl2d")

    def resume(self, node: str) -> None:
        with self._slurm(f"resuming {node}" + (f" ({self.rights_problem})" if self.rights_problem else "")):
            self.driver.resume_node(node)

    def check_rights(self) -> str | None:
        """At start: may this process drain and resume nodes? Logs one line naming what is missing, or that
        it could not be checked (:func:`dl2d.slurm.rights.check_at_start`); later drain/resume failures
        repeat the line."""
        self.rights_problem = check_at_start(self.raw_driver, log)
        return self.rights_problem

    def check_state_dir(self) -> str | None:
        """At start, with ``run_jobs_as = "owner"``: can a job's user reach its directory under the state dir?
        Every directory above ``jobs/`` must let others through (the x bit); logs one line naming the first
        that does not (the daemon goes on: its own work is unaffected, the jobs would fail at start)."""
        if self.config.run_jobs_as != "owner":
            return None
        problem = closed_directory(self.config.state_dir / "jobs")
        if problem:
            log.error("Slurm state_dir: %s", problem)
        return problem

    def end_slot(self, seconds: float) -> None:
        return None  # real time passes by itself

    # -- helpers ------------------------------------------------------------------------------
    def _selection(self, target: Target) -> SlurmNodeSelection | None:
        """The target's node selection when ``placement = "target"`` (else None: Slurm picks)."""
        return target_selection(target) if self.config.placement == "target" else None

    def _size(self, job: JobRequest, target: Target, held: SlurmAllocation | None,
              fresh: bool) -> tuple[SlurmAllocation, int | None]:
        """(the allocation the non-zero target needs, the fewest of the ``held`` nodes that host it or
        None). The job's demand is its spec's, its type's default where the spec is silent."""
        try:
            demand = job_demand(job)
            shape = self._shape(fresh=fresh)
            needed = allocation_for(target.workers, target.ps, demand, shape)
            selection = self._selection(target)
        except ValueError as e:
            raise BackendError(f"job {job.job_id}: {e}") from e
        if selection is not None:
            known = {n.name for n in self._slurm_nodes(fresh=fresh)}
            unknown = [n for n in selection.nodelist if n not in known]
            if unknown:
                raise BackendError(f"job {job.job_id}: the target places tasks on nodes Slurm does "
                                   f"not know: {', '.join(unknown)}")
            needed = allocation_for_selection(selection, demand)
        hosting = nodes_to_host(held, target.workers, target.ps, demand, shape) if held else None
        return needed, hosting

    def _shape(self, fresh: bool = False) -> NodeShape:
        if self.config.node_shape is not None:
            return self.config.node_shape
        shape = node_shape([node_info(n) for n in self._slurm_nodes(fresh=fresh)])
        if shape is None:
            raise BackendError("no usable Slurm node (all down or drained)", retryable=True)
        return shape

    def _runtime_scales_hot(self, job_id: int, elastic: bool, live: SlurmJob | None,
                            progress: Mapping[str, Any] | None) -> bool:
        """Whether the running job's runtime can be resized hot now (planning.runtime_scales_hot),
        from its published coordinator and its progress."""
        if not elastic or live is None or live.state != "RUNNING":
            return False
        coordinator, written = self._coordinator(job_id)
        return runtime_scales_hot(elastic, coordinator, written, live.start_time, progress)

    def _adopt(self, job_id: int, record: dict[str, Any], live: SlurmJob) -> dict[str, Any]:
        log.warning("job %s: adopting Slurm job %s (not in the record)", job_id, live.job_id)
        ids = [str(i) for i in record.get("slurm_job_ids") or []]
        record = {**record, "slurm_job_id": live.job_id, "stopped": False, "submitting": False,
                  "slurm_job_ids": ids + ([live.job_id] if live.job_id not in ids else [])}
        if "target" in record and not record.get("applied"):
            record["applied"] = record["target"]
        self._save(job_id, record)
        return record

    def _submit(self, job: JobRequest, record: dict[str, Any], target: Target,
                needed: SlurmAllocation) -> ApplyResult:
        spec = dict(job.spec or {})
        jd = self._dir(job.job_id)
        command = spec.get("command")
        if command is None and not spec.get("script"):
            raise BackendError(f"job {job.job_id}: its spec has no command or script")
        user = self._job_user(job, record)
        try:  # the job's directory is its user's: what it did there is one job's problem, never the daemon's
            jd.write_secret()  # $DL2D_JOB_SECRET_FILE: the elastic runtime's secret (made once, kept)
            # after anything the daemon writes for the job alone: prepare() hands the job's directory over with it
            jd.prepare(*((user.uid, user.gid) if user is not None else ()))
        except (OSError, SecretFileError) as e:
            # What the job's user left there (a link, a FIFO) is not retried every slot: the job fails with it.
            message = f"cannot prepare its directory {jd.owned_dir}: {e}"
            self._fail_job(job.job_id, message, record=record)
            raise BackendError(f"job {job.job_id}: {message}", retryable=False) from e
        script_path = jd.write_user_script(str(spec["script"])) if command is None else None
        self._write_target(job.job_id, target)
        selection = self._selection(target)  # checked by apply()
        token = secrets.token_hex(16)  # this submission's: adoption after a crash needs it (_live_job)
        js = JobSpec(
            name=f"{self.config.job_name_prefix}{job.job_id}",
            script=batch_script(job.job_id, jd.path, command, script_path, exports=self._contract_env(job),
                                srun_cpus_per_task=self._srun_cpus(job)),
            nodes=needed.nodes,
            gpus_per_node=needed.gpus_per_node,
            cpus_per_node=needed.cpus_per_node or None,
            mem_mb_per_node=needed.mem_mb_per_node or None,
            time_limit_min=time_limit(spec, self.config.time_limit_min),
            output=str(jd.output_pattern),
            workdir=self.config.workdir,
            partition=spec.get("partition") or self.config.partition,
            checkpoint_signal=self.config.checkpoint_signal,
            requeue=True,
            nodelist=selection.nodelist if selection is not None else (),
            dl2d_job_id=str(job.job_id),
            submit_token=token,
            user=user.name if user is not None else None,
            account=spec.get("account") or None,
            qos=spec.get("qos") or None,
            env=dict(spec.get("env") or {}),
        )
        # Record the intent first: if the daemon dies after sbatch, the next backend adopts
        # the Slurm job by its comment (and user) instead of submitting it twice.
        record = {**record, "submitting": True, "user": (user or process_user()).name, "submit_token": token,
                  "done_seen_at": None, "ending": None}
        self._save(job.job_id, record)
        with self._slurm(f"submitting job {job.job_id}"):
            slurm_id = self.driver.submit(js)
        ids = [str(i) for i in record.get("slurm_job_ids") or []]
        record.update(slurm_job_id=slurm_id, slurm_job_ids=ids + [slurm_id], submitting=False,
                      applied=record["target"], final=None, message="",
                      allocation=allocation_record(needed),
                      nodelist=list(js.nodelist))
        self._save(job.job_id, record)
        return ApplyResult(job.job_id, START, slurm_id, running=False)  # Slurm starts it when it can

    def _job_user(self, job: JobRequest, record: dict[str, Any]) -> UnixUser | None:
        """The account the job runs as: its owner's (``run_jobs_as = "owner"``), or None for the daemon's own.
        An owner without an account on this host fails the job for good (FAILED, with the reason, in the
        record and so in the database): a non-retryable BackendError; the daemon goes on with the others."""
        if self.config.run_jobs_as == "daemon":
            return None
        owner = (job.spec or {}).get("owner")
        try:
            if not isinstance(owner, str) or not owner:
                raise UnknownUserError("its request names no owner to run as (the daemon's always does; "
                                       'run_jobs_as = "daemon" runs jobs as the daemon\'s user)')
            return lookup_user(owner)
        except UnknownUserError as e:
            message = f"cannot run as its owner: {e}"
            self._fail_job(job.job_id, message, record=record)
            raise BackendError(f"job {job.job_id}: {message}", retryable=False) from None

    def _contract_env(self, job: JobRequest) -> dict[str, str]:
        """What the batch script tells the job beyond its paths and size (docs/jobs.md): the checkpoint
        signal, the seconds it has to save and exit after it, the epochs it was submitted for; an adaptive job its
        initial batch and its limits (its batch of each start is in the target file, ``DL2D_BATCH_SIZE``)."""
        spec = job.spec or {}
        batch = {"DL2D_INITIAL_BATCH_SIZE": spec.get("batch_size"), "DL2D_MAX_BATCH_SIZE": spec.get("max_batch_size"),
                 "DL2D_MAX_LOCAL_BATCH": spec.get("max_local_batch")} if spec.get("adaptive_batch") else {}
        return {"DL2D_CHECKPOINT_SIGNAL": self.config.checkpoint_signal,
                "DL2D_CHECKPOINT_DEADLINE_S": f"{self.config.checkpoint_timeout_s:g}",
                "DL2D_TOTAL_EPOCHS": f"{float(job.total_epochs):g}",
                **{k: number_text(v) for k, v in batch.items() if v is not None}}

    def _srun_cpus(self, job: JobRequest) -> int | None:
        """CPUs per process when dl2d starts one process per worker (``launch = "srun"``), else None."""
        if launch_of(job.spec or {}) != "srun":
            return None
        return max(1, TaskSize.of(job_demand(job).worker).cpus)

    def _hot_scale(self, job_id: int, target: Target) -> bool:
        """Scale an elastic job through its coordinator; False when that is not possible."""
        try:
            jd = self._dir(job_id)
            coordinator, _ = self._coordinator(job_id)
            if not coordinator or not coordinator.get("address"):
                raise FileNotFoundError("no coordinator.json in the job's checkpoint directory")
            self.scaler(str(coordinator["address"]), target.workers, target.ps,
                        self.config.hot_scale_timeout_s, jd.secret())
            return True
        except Exception as e:  # noqa: BLE001 - any failure means "relaunch instead"
            log.warning("job %s: hot scaling to %s/%s failed (%s); relaunching from checkpoint",
                        job_id, target.workers, target.ps, e)
            return False

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` inside apply, feeding the heartbeat at least once a second."""
        end = self.clock() + seconds
        while True:
            self.heartbeat()
            left = end - self.clock()
            if left <= 0:
                return
            self.sleep(min(left, 1.0))

    def _wait_ended(self, slurm_id: str, timeout: float) -> bool:
        deadline = self.clock() + timeout
        while True:
            job = next((j for j in self._jobs(fresh=True) if j.job_id == slurm_id), None)
            if job is None or not job.active:
                return True
            if self.clock() >= deadline:
                return False
            self._pause(self.config.poll_interval_s)

    def _checkpoint_and_end(self, live: SlurmJob) -> None:
        """Signal the job to checkpoint and exit; cancel it when it does not end in time
        (scancel sends SIGTERM first, which the job runtimes also treat as "checkpoint")."""
        if live.state == "RUNNING":
            try:
                with self._slurm(f"signalling job {live.job_id}"):
                    self.driver.signal(live.job_id, self.config.checkpoint_signal)
            except BackendError as e:
                # It may have ended since it was listed (e.g. on its own time-limit signal).
                if e.retryable or not self._wait_ended(live.job_id, 0):
                    raise
                return
            if self._wait_ended(live.job_id, self.config.checkpoint_timeout_s):
                return
            log.warning("Slurm job %s did not end %gs after %s; killing it (it resumes from its last "
                        "checkpoint)", live.job_id, self.config.checkpoint_timeout_s, self.config.checkpoint_signal)
            # Its deadline is over (docs/jobs.md): SIGKILL, not scancel's SIGTERM, which a job that handles it
            # (as the contract's jobs do) could hold off for another KillWait.
            try:
                with self._slurm(f"killing job {live.job_id}"):
                    self.driver.signal(live.job_id, "KILL")
            except BackendError as e:
                if e.retryable:
                    raise
        with self._slurm(f"cancelling job {live.job_id}"):
            self.driver.cancel(live.job_id)
        if not self._wait_ended(live.job_id, self.config.checkpoint_timeout_s):
            raise BackendError(f"Slurm job {live.job_id} did not end after scancel", retryable=True)


def closed_directory(path: Path) -> str | None:
    """The first directory from ``/`` down to ``path`` that other users cannot pass through (no x bit for
    others), as one line naming it and the fix; None when every one lets them."""
    for d in [*reversed(path.parents), path]:
        try:
            mode = d.stat().st_mode
        except OSError as e:
            return f"cannot check {d}: {e.strerror or e}"
        if not mode & 0o001:
            return (f"{d} (mode {mode & 0o7777:04o}) does not let other users through: jobs run as their owners "
                    f"and cannot reach their directories under {path}; chmod o+x {d} (or choose a state_dir that "
                    "they can reach)")
    return None


def backend_from_section(section: SlurmSection, default_state_dir: str | Path,
                         policy_placement: str = "balance") -> SlurmBackend:
    """The daemon's SlurmBackend from the ``[slurm]`` section of its config
    (:func:`~dl2d.daemon.slurm.settings.settings_from_section`; ValueError names the bad key)."""
    from dl2d.slurm.driver import make_driver

    kind, options, config = settings_from_section(section, default_state_dir, policy_placement)
    problem = run_jobs_as_problem(config.run_jobs_as, os.geteuid())
    if problem:
        raise ValueError(problem)
    backend = SlurmBackend(make_driver(kind, **options), config)
    backend.check_rights()  # one clear line at start instead of "Invalid user id" at the first drain
    backend.check_state_dir()
    return backend
