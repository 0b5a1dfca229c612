"""Per-job coordinator: membership, best-fit assignment, scaling clock, migration.

One coordinator per job.  PSs and workers register with it (``INC_SERVER`` /
``INC_WORKER``); removals are requested with ``DEC_SERVER {ps}`` /
``DEC_WORKER {worker}`` (or chosen by ``SCALE``).  Every membership change is
one *reconfiguration* run by a single background thread, one at a time
(DL2 adds PSs one by one):

1. registration: new role gets its id and the job config;
2. assignment: best-fit re-assignment (:mod:`.assignment`), RTT pings, scaling
   clock (:mod:`.clock`), ``PREPARE {clock}`` to workers then PSs;
3. migration: once every PS reached the clock (``WAIT_CLOCK``) the sources
   ``MIGRATE`` blocks directly to their new owners; then ``COMMIT``;
4. worker update: ``RESUME`` with the new block->PS map; workers re-pull and go on.

The same pause-at-clock is used to take a consistent checkpoint.  Other
requests: ``PROGRESS``/``SUSPENDED``/``RESUMED``/``DONE`` from workers,
``STATUS``, ``SCALE {workers, ps, method}``, ``CHECKPOINT {exit}``, ``SHUTDOWN``.

Every connection is authenticated (:mod:`.auth`): the roles with the job's member
key, the daemon and ``dl2-run`` with its control key; :mod:`.guards` says which
role may send what and checks progress reports and scaling requests.

One module (about 700 lines) on purpose: it is one state machine, the coordinator's membership, clock and
reconfiguration steps share one lock and one background thread, and the pure parts it builds on are already
their own modules (assignment, clock, checkpoint, protocol).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from typing import Callable

import numpy as np

from . import guards
from . import protocol as P
from .assignment import by_ps, moves, rebalance
from .auth import MEMBER, Credentials
from .checkpoint import load_checkpoint, save_checkpoint, save_model
from .clock import retry_clock, scaling_clock
from .model import TrainConfig, init_params

log = logging.getLogger(__name__)
#: Seconds a newly registered role has to answer the coordinator's first PING (else it is not added).
JOIN_PING_TIMEOUT_S = 10.0
#: Worker errors kept (each cut to 500 characters).
MAX_ERRORS = 100


class _Stall:
    """Detects a wait that makes no progress: ``stuck(state)`` is true once ``state``
    has not changed for ``limit`` seconds."""

    def __init__(self, limit: float):
        self.limit = limit
        self._state: object = None
        self._since = time.monotonic()

    def stuck(self, state) -> bool:
        now = time.monotonic()
        if state != self._state:
            self._state, self._since = state, now
        return now - self._since > self.limit


class Coordinator:
    def __init__(self, cfg: TrainConfig, n_ps: int, n_workers: int, job_id: str = "job",
                 host: str = "127.0.0.1", port: int = 0, advertise_host: str | None = None,
                 spawner=None, checkpoint_dir: str | None = None, progress=None,
                 resume: bool = True, secret: str | None = None, max_workers: int | None = None,
                 max_ps: int | None = None):
        """``secret``: the job's secret (a random one when None; ``self.secret``); ``max_workers`` /
        ``max_ps``: the most a SCALE may ask for (default guards.DEFAULT_MAX_ROLES; PSs at most one per
        parameter block), and never fewer than the initial counts."""
        if n_ps < 1 or n_workers < 1:
            raise ValueError("need at least one PS and one worker")
        self.cfg, self.job_id = cfg, job_id
        self.n_ps0, self.n_w0 = n_ps, n_workers
        self.spawner = spawner
        self.checkpoint_dir = checkpoint_dir
        self.progress = progress
        self.blocks = cfg.blocks()
        self.sizes = [ln for _, ln in self.blocks]
        self.max_workers = max(n_workers, max_workers or guards.DEFAULT_MAX_ROLES)
        self.max_ps = max(n_ps, min(max_ps or guards.DEFAULT_MAX_ROLES, len(self.blocks)))
        self.secret = secret or secrets.token_hex(32)
        creds = Credentials.from_secret(self.secret)
        self.member_key = creds.keys[MEMBER]
        self._creds = creds.as_role(MEMBER)  # what the coordinator proves to the PSs and workers
        self.server = P.Server(self.handle, host, port, advertise_host, auth=creds, with_peer=True)
        self.address = self.server.address
        self.cv = threading.Condition()
        self._next_id = {"ps": 0, "worker": 0}
        self.ps: dict[int, str] = {}
        self.workers: dict[int, str] = {}
        self.joining_ps: dict[int, str] = {}
        self.joining_w: dict[int, str] = {}
        self.leaving_ps: list[int] = []
        self.leaving_w: list[int] = []
        self.reg_time: dict[tuple[str, int], float] = {}
        self.clients: dict[str, P.Client] = {}
        # the fan-out's threads, the loop and close() all reach for clients: one lock, so that close() never
        # iterates the dict while a thread adds to it ("dictionary changed size during iteration")
        self._clients_lock = threading.Lock()
        self.assignment: dict[int, int] = {}
        self.requests: list[tuple] = []
        self.records: list[dict] = []
        self.suspended: dict[int, float] = {}
        self.resumed: dict[int, tuple[float, float | None]] = {}
        self.done: set[int] = set()
        self.errors: list[str] = []
        self.started = False
        self.busy = False
        self.version = 0
        self.iter_time: float | None = None
        self._last_progress: float | None = None
        self._progress_mono = time.monotonic()  # when the last PROGRESS was accepted (or the coordinator began)
        self.samples_per_s = 0.0
        self.last_loss: float | None = None
        self.state = "starting"
        self.finished = threading.Event()
        self.exit_reason: str | None = None
        self.final_params: np.ndarray | None = None
        self.start_version = 0
        self.init_state: tuple[np.ndarray, np.ndarray] | None = None
        # timing instrumentation (wall clock, comparable across processes of one host)
        self.t_init_wall = time.time()
        self._last_progress_wall: float | None = None
        self._gap_pending: tuple[dict, float | None] | None = None
        self._resumed_meta: dict | None = None
        if resume and checkpoint_dir:
            ck = load_checkpoint(checkpoint_dir)
            if ck is not None:
                meta, p, m = ck
                self.init_state = (p, m)
                self.start_version = int(meta["version"])
                if not meta.get("finished"):
                    self._resumed_meta = meta
        self.version = self.start_version
        # PREPARE attempts are numbered; a SUSPENDED of an older (cancelled) attempt is ignored
        self._pause_attempt = 0
        # a pause (waiting for the clock, then for every worker to suspend) fails when
        # nothing progresses for this long (or 20 step times, if longer)
        self.pause_stall_timeout = 60.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="coordinator")

    def start(self) -> "Coordinator":
        self.server.start()
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        with self.cv:
            self.cv.notify_all()
        self.server.close()
        with self._clients_lock:
            clients, self.clients = list(self.clients.values()), {}
        for c in clients:
            c.close()

    # -- helpers ---------------------------------------------------------------------
    def _c(self, addr: str) -> P.Client:
        with self._clients_lock:
            c = self.clients.get(addr)
            if c is None:
                c = self.clients[addr] = P.Client(addr, auth=self._creds)
            return c

    def _answers(self, addr: str) -> bool:
        """Whether a newly registered role answers a PING within JOIN_PING_TIMEOUT_S."""
        c = P.Client(addr, timeout=JOIN_PING_TIMEOUT_S, auth=self._creds)
        try:
            c.call("PING")
            return True
        except Exception as e:  # noqa: BLE001 - any failure: the role is not added
            self._error(f"new role at {addr} did not answer ({type(e).__name__}: {e}); not added")
            return False
        finally:
            c.close()

    def _error(self, text: str) -> None:
        log.warning("coordinator of job %s: %s", self.job_id, text)
        with self.cv:
            if len(self.errors) < MAX_ERRORS:
                self.errors.append(text[:500])

    def _parallel(self, fn: Callable, items) -> list:
        items = list(items)
        out: list = [None] * len(items)
        errs: list = []

        def run(i, x):
            try:
                out[i] = fn(x)
            except Exception as e:  # re-raised below
                errs.append(e)
        ts = [threading.Thread(target=run, args=(i, x)) for i, x in enumerate(items)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errs:
            raise errs[0]
        return out

    def _report(self, force: bool = False) -> None:
        if self.progress is None:
            return
        spe = self.cfg.steps_per_epoch
        self.progress.report({
            "job_id": self.job_id, "epoch": self.version // spe, "step": self.version,
            "step_in_epoch": self.version % spe, "total_steps": self.cfg.total_steps,
            "epochs": self.cfg.epochs, "samples_per_s": round(self.samples_per_s, 3),
            "workers": len(self.workers), "ps": len(self.ps), "state": self.state,
            "loss": self.last_loss, "time": time.time(),
            "last_resize": (self.records[-1] if self.records else None),
        }, force=force)

    # -- request handler ---------------------------------------------------------------------
    def handle(self, h, a, peer: P.Peer | None = None):
        """One request. ``peer``: who sent it (the server passes it); None for a call in this process."""
        op = h["op"]
        if peer is not None and not guards.allowed(op, peer.role):
            log.warning("coordinator of job %s: refused %s from %s (authenticated as %s)", self.job_id, op,
                        peer.address, peer.role)
            raise PermissionError(f"{op} is not for a peer authenticated as {peer.role}")
        now = time.perf_counter()
        if op in ("INC_SERVER", "INC_WORKER"):
            role = "ps" if op == "INC_SERVER" else "worker"
            addr = guards.check_addr(h.get("addr"))
            with self.cv:
                if role == "ps":
                    cur, bound = len(self.ps) + len(self.joining_ps) - len(self.leaving_ps), self.max_ps
                else:
                    cur, bound = len(self.workers) + len(self.joining_w) - len(self.leaving_w), self.max_workers
                if cur >= bound:
                    raise ValueError(f"the job has its most {role}s ({bound}); {op} refused")
                rid = self._next_id[role]
                self._next_id[role] += 1
                (self.joining_ps if role == "ps" else self.joining_w)[rid] = addr
                self.reg_time[(role, rid)] = time.perf_counter() - now
                self.cv.notify_all()
            return {f"{role}_id" if role == "worker" else "ps_id": rid, "config": self.cfg.to_dict(),
                    "job_id": self.job_id}
        if op == "DEC_SERVER":
            with self.cv:
                self.leaving_ps.append(int(h["ps"]))
                self.cv.notify_all()
            return {}
        if op == "DEC_WORKER":
            with self.cv:
                self.leaving_w.append(int(h["worker"]))
                self.cv.notify_all()
            return {}
        if op == "PROGRESS":
            t = time.perf_counter()
            wall = time.time()
            with self.cv:
                try:
                    v, samples, loss = guards.check_progress(
                        h, version=self.version, total_steps=self.cfg.total_steps,
                        elapsed_s=time.monotonic() - self._progress_mono, workers=max(1, len(self.workers)),
                        max_samples=float(self.cfg.global_batch * self.max_workers))
                except ValueError as e:
                    log.warning("coordinator of job %s: refused a progress report from %s: %s", self.job_id,
                                peer.address if peer else "this process", e)
                    raise
                self._progress_mono = time.monotonic()
                if self._gap_pending is not None:
                    # first step completed after a pause: the training gap seen by the job
                    rec, before = self._gap_pending
                    self._gap_pending = None
                    rec["step_gap_s"] = None if before is None else wall - before
                    rec["t_first_step_after"] = wall
                self._last_progress_wall = wall
                if self._last_progress is not None and v > self.version:
                    dt = (t - self._last_progress) / (v - self.version)
                    self.iter_time = dt if self.iter_time is None else 0.8 * self.iter_time + 0.2 * dt
                    self.samples_per_s = samples / max(self.iter_time, 1e-9)
                self._last_progress = t
                self.version = max(self.version, v)
                self.last_loss = loss
            self._report()
            return {}
        if op == "SUSPENDED":
            with self.cv:
                att = h.get("attempt")
                if att is None or int(att) == self._pause_attempt:
                    self.suspended[int(h["worker"])] = time.time()
                    self.cv.notify_all()
            return {}
        if op == "RESUMED":
            with self.cv:
                self.resumed[int(h["worker"])] = (time.time(), h.get("suspension_s"))
                self.cv.notify_all()
            return {}
        if op == "DONE":
            with self.cv:
                v = guards.check_done(h.get("version"), total_steps=self.cfg.total_steps,
                                      workers=len(self.workers))
                self.done.add(int(h["worker"]))
                self.version = max(self.version, v)
                self.cv.notify_all()
            return {}
        if op == "WORKER_ERROR":
            self._error(f"worker {str(h.get('worker'))[:20]}: {str(h.get('error'))[:400]}")
            return {}
        if op == "STATUS":
            with self.cv:
                return {"job_id": self.job_id, "version": self.version, "state": self.state,
                        "ps": {str(k): v for k, v in self.ps.items()},
                        "workers": {str(k): v for k, v in self.workers.items()},
                        "total_steps": self.cfg.total_steps, "iter_time": self.iter_time,
                        "hot_scaling": self.spawner is not None, "errors": self.errors,
                        "records": self.records, "finished": self.finished.is_set()}
        if op == "SCALE":
            try:
                w, p, method, timeout = guards.check_scale(h, max_workers=self.max_workers, max_ps=self.max_ps)
            except ValueError as e:
                log.warning("coordinator of job %s: refused SCALE from %s: %s", self.job_id,
                            peer.address if peer else "this process", e)
                raise
            return self.scale(w, p, method, timeout)
        if op == "CHECKPOINT":
            return self.request("checkpoint", bool(h.get("exit", False)), timeout=float(h.get("timeout", 300)))
        if op == "SHUTDOWN":
            who = peer.address if peer else "this process"
            threading.Thread(target=self.shutdown, args=(f"shut down by a SHUTDOWN from {who}",),
                             daemon=True).start()
            return {}
        raise ValueError(f"unknown op {op}")

    # -- requests from control / signals -------------------------------------------------------
    def request(self, kind: str, *args, timeout: float = 300.0) -> dict:
        evt, box = threading.Event(), {}
        with self.cv:
            self.requests.append((kind, args, evt, box))
            self.cv.notify_all()
        if not evt.wait(timeout):
            raise TimeoutError(f"{kind} did not complete in {timeout}s")
        if "error" in box:
            raise RuntimeError(box["error"])
        return box.get("result", {})

    def shutdown(self, reason: str = "shut down") -> None:
        """Stop the job now, without a checkpoint: the roles are told to exit and ``finished`` is set, so
        ``dl2-run`` exits (code 1) instead of waiting."""
        with self.cv:
            if self.finished.is_set():
                return
            self.exit_reason = "shutdown"
            self.state = "failed"  # (a state the daemon knows: the job did not finish)
            self.cv.notify_all()
        self._error(reason)
        self._stop.set()
        self._exit_all()
        self._report(force=True)
        self.finished.set()
        with self.cv:
            self.cv.notify_all()

    def scale(self, n_workers: int, n_ps: int, method: str = "hot", timeout: float = 300.0) -> dict:
        guards.check_scale({"workers": n_workers, "ps": n_ps, "method": method, "timeout": timeout},
                           max_workers=self.max_workers, max_ps=self.max_ps)
        if method == "checkpoint_restart":
            return self.request("checkpoint_restart", n_workers, n_ps, timeout=timeout)
        if self.spawner is None:
            raise RuntimeError("this coordinator has no spawner: hot scaling unsupported")
        with self.cv:
            first = len(self.records)
            cur_p = len(self.ps) + len(self.joining_ps) - len(self.leaving_ps)
            cur_w = len(self.workers) + len(self.joining_w) - len(self.leaving_w)
            if n_ps < cur_p:
                cands = sorted((p for p in self.ps if p not in self.leaving_ps), reverse=True)
                self.leaving_ps += cands[:cur_p - n_ps]
            if n_workers < cur_w:
                cands = sorted((w for w in self.workers if w not in self.leaving_w), reverse=True)
                self.leaving_w += cands[:cur_w - n_workers]
            self.cv.notify_all()
        if n_ps > cur_p:
            self.spawner.spawn("ps", n_ps - cur_p)
        if n_workers > cur_w:
            self.spawner.spawn("worker", n_workers - cur_w)
        deadline = time.monotonic() + timeout
        with self.cv:
            while not (len(self.ps) == n_ps and len(self.workers) == n_workers and not self.joining_ps
                       and not self.joining_w and not self.leaving_ps and not self.leaving_w
                       and not self.busy):
                if self.finished.is_set():
                    raise RuntimeError("job finished during scaling")
                if not self.cv.wait(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError("scaling did not complete")
            recs = self.records[first:]
        return {"method": "hot", "records": recs, "workers": n_workers, "ps": n_ps}

    # -- the reconfiguration thread ---------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            with self.cv:
                self.cv.wait(0.05)
                if self.finished.is_set():
                    return
                task = None
                if not self.started:
                    if len(self.joining_ps) >= self.n_ps0 and len(self.joining_w) >= self.n_w0:
                        task = ("start",)
                elif self.requests:
                    task = ("request", self.requests.pop(0))
                elif self.joining_ps:
                    task = ("reconf", dict(add_ps=[min(self.joining_ps)]), "add_ps")
                elif self.leaving_ps:
                    task = ("reconf", dict(remove_ps=[self.leaving_ps[0]]), "remove_ps")
                elif self.joining_w:
                    task = ("reconf", dict(add_workers=[min(self.joining_w)]), "add_worker")
                elif self.leaving_w:
                    task = ("reconf", dict(remove_workers=[self.leaving_w[0]]), "remove_worker")
                elif self.workers and set(self.workers) <= self.done:
                    task = ("finish",)
                if task is not None:
                    self.busy = True
            if task is None:
                continue
            try:
                if task[0] == "start":
                    self._start()
                elif task[0] == "reconf":
                    self._reconfigure(kind=task[2], **task[1])
                elif task[0] == "finish":
                    self._finish()
                else:
                    kind, args, evt, box = task[1]
                    try:
                        if kind == "checkpoint":
                            box["result"] = self._checkpoint(exit_after=args[0])
                        elif kind == "checkpoint_restart":
                            box["result"] = self._checkpoint_restart(*args)
                    except Exception as e:
                        box["error"] = f"{type(e).__name__}: {e}"
                    evt.set()
            except Exception as e:
                if self.exit_reason == "shutdown":  # stopped on request: not a failure
                    return
                self.errors.append(f"{task[0]}: {type(e).__name__}: {e}")
                self.state = "failed"
                self.exit_reason = "failed"
                self.finished.set()
                with self.cv:
                    self.busy = False
                    self.cv.notify_all()
                return
            with self.cv:
                self.busy = False
                self.cv.notify_all()

    def _start(self) -> None:
        """Initial placement (also after a restart): blocks from init or checkpoint."""
        with self.cv:
            self.ps.update(self.joining_ps)
            self.joining_ps.clear()
            self.workers.update(self.joining_w)
            self.joining_w.clear()
        if self.init_state is not None:
            params, mom = self.init_state
        else:
            params = init_params(self.cfg)
            mom = np.zeros_like(params)
        v = self.start_version
        t_placed = time.time()
        self.assignment = rebalance(self.sizes, {}, sorted(self.ps))
        groups = by_ps(self.assignment)

        def put(p):
            ids = groups.get(p, [])
            arrays = {}
            for b in ids:
                off, ln = self.blocks[b]
                arrays[f"p{b}"] = params[off:off + ln]
                arrays[f"m{b}"] = mom[off:off + ln]
            self._c(self.ps[p]).call("PUT_BLOCKS", arrays, blocks=ids, version=v)
            self._c(self.ps[p]).call("COMMIT", workers=sorted(self.workers), version=v)
        self._parallel(put, sorted(self.ps))
        meta, self._resumed_meta = self._resumed_meta, None
        if meta is not None:
            # relaunched from a checkpoint (dl2-run after a signal): the timings of this
            # checkpoint/restart, completed by the first PROGRESS (step_gap_s)
            last = meta.get("last_step_time")
            rec = {"kind": "restart", "method": "checkpoint_restart", "version": v,
                   "ps_before": meta.get("ps"), "workers_before": meta.get("workers"),
                   "ps_after": len(self.ps), "workers_after": len(self.workers),
                   "t_last_step_before": last, "t_checkpoint_saved": meta.get("time"),
                   "t_coordinator_init": self.t_init_wall, "t_roles_registered": t_placed,
                   "t_restored": time.time()}
            with self.cv:
                self._gap_pending = (rec, last)
            self.records.append(rec)
        self._resume_workers(v, sorted(self.workers))
        with self.cv:
            self.started = True
            self.version = v
            self.state = "running"
            self.cv.notify_all()
        self._report(force=True)

    def _psmap(self) -> dict[str, list[int]]:
        return {self.ps[p]: ids for p, ids in by_ps(self.assignment).items()}

    def _resume_workers(self, version: int, members: list[int]) -> None:
        psmap = self._psmap()
        self._parallel(lambda w: self._c(self.workers[w]).call(
            "RESUME", ps=psmap, workers=members, version=version), members)

    def _pause(self, rec: dict, new_ps_ids: list[int] | None = None) -> int:
        """Steps 2 (clock) and the wait: returns the clock once every PS froze at it."""
        total = self.cfg.total_steps
        ps_addrs = [self.ps[p] for p in sorted(self.ps)]
        w_addrs = [self.workers[w] for w in sorted(self.workers)]
        with self.cv:
            self.suspended.clear()
            self.resumed.clear()
        rtts, versions = [], []
        for addr in ps_addrs + w_addrs:
            t0 = time.perf_counter()
            h, _ = self._c(addr).call("PING")
            rtts.append(time.perf_counter() - t0)
            if addr in ps_addrs:
                versions.append(int(h["version"]))
        vmax = max(versions)
        it = self.iter_time
        if it and not self.cfg.sync:
            it /= max(1, len(self.workers))
        clock = scaling_clock(vmax, rtts, it)
        if self.cfg.sync:
            clock = min(clock, max(total, vmax))
        rec["version_at_prepare"] = vmax
        for _attempt in range(50):
            with self.cv:
                # SUSPENDED messages of a cancelled attempt may still be in flight
                self._pause_attempt += 1
                attempt = self._pause_attempt
                self.suspended.clear()
            late, latest = False, vmax
            for addr in w_addrs + ps_addrs:
                h, _ = self._c(addr).call("PREPARE", clock=clock, attempt=attempt)
                if h.get("late"):
                    late, latest = True, max(latest, int(h["version"]))
                    break
            if not late:
                break
            # PSs first: a worker released from the void clock must find them unfrozen
            for addr in ps_addrs + w_addrs:
                self._c(addr).call("CANCEL")
            clock = retry_clock(latest, clock)
            if self.cfg.sync:
                clock = min(clock, max(total, latest))
            rec["retries"] = rec.get("retries", 0) + 1
        else:
            raise RuntimeError("could not agree on a scaling clock")
        rec["clock"] = clock
        rec["t_step2_assignment"] = time.perf_counter() - rec["_t1"]
        t = time.perf_counter()
        reached: set[str] = set()
        ps_versions: dict[str, int] = {}
        stall = _Stall(max(self.pause_stall_timeout, 20 * (self.iter_time or 0.0)))
        while len(reached) < len(ps_addrs):
            for addr in ps_addrs:
                if addr not in reached:
                    h, _ = self._c(addr).call("WAIT_CLOCK", timeout=0.05)
                    ps_versions[addr] = int(h["version"])
                    if h["reached"]:
                        reached.add(addr)
            if not self.cfg.sync:
                with self.cv:
                    all_susp = set(self.workers) <= set(self.suspended) | self.done
                if all_susp:
                    for addr in ps_addrs:
                        if addr not in reached:
                            self._c(addr).call("FREEZE")
            if self._stop.is_set():
                raise RuntimeError("stopped")
            with self.cv:
                susp = sorted(self.suspended)
            if stall.stuck((sorted(ps_versions.items()), len(reached), susp)):
                raise RuntimeError(
                    f"scaling clock {clock} not reached: no progress in {stall.limit:.0f}s "
                    f"(PS versions {sorted(ps_versions.values())}, {len(reached)}/{len(ps_addrs)} PSs "
                    f"frozen, suspended workers {susp} of {sorted(self.workers)})")
        # every worker must be parked before parameters move (a late pull would
        # otherwise see a half-migrated PS)
        stall = _Stall(stall.limit)
        with self.cv:
            while not set(self.workers) <= set(self.suspended):
                if self._stop.is_set():
                    raise RuntimeError("stopped")
                if stall.stuck(sorted(self.suspended)):
                    raise RuntimeError(
                        f"workers {sorted(set(self.workers) - set(self.suspended))} did not suspend "
                        f"at scaling clock {clock} within {stall.limit:.0f}s")
                self.cv.wait(0.05)
        rec["t_wait_clock"] = time.perf_counter() - t
        return clock

    def _reconfigure(self, add_ps=(), remove_ps=(), add_workers=(), remove_workers=(), kind="",
                     action: Callable[[int], None] | None = None, exit_after: bool = False) -> dict:
        t_start = time.perf_counter()
        rec: dict = {"kind": kind, "method": "hot", "ps_before": len(self.ps), "workers_before": len(self.workers)}
        with self.cv:
            add_ps_d = {p: self.joining_ps.pop(p) for p in add_ps}
            add_w_d = {w: self.joining_w.pop(w) for w in add_workers}
            for p in remove_ps:
                self.leaving_ps.remove(p)
            for w in remove_workers:
                self.leaving_w.remove(w)
        remove_ps = [p for p in remove_ps if p in self.ps]
        remove_workers = [w for w in remove_workers if w in self.workers]
        # step 1: registration (coordinator side) + connect to the new roles; one that does not answer
        # (gone, or registered an address it does not serve) is left out and the job goes on
        t = time.perf_counter()
        regs = [self.reg_time.pop(("ps", p), 0.0) for p in add_ps_d] + \
               [self.reg_time.pop(("worker", w), 0.0) for w in add_w_d]
        add_ps_d = {p: addr for p, addr in add_ps_d.items() if self._answers(addr)}
        add_w_d = {w: addr for w, addr in add_w_d.items() if self._answers(addr)}
        rec["t_step1_registration"] = sum(regs) + time.perf_counter() - t
        new_ps = [p for p in sorted(self.ps) if p not in remove_ps] + sorted(add_ps_d)
        new_w = [w for w in sorted(self.workers) if w not in remove_workers] + sorted(add_w_d)
        if not new_ps or not new_w or (action is None and not exit_after and not add_ps_d and not add_w_d
                                       and not remove_ps and not remove_workers):
            rec["skipped"] = "would leave no PS or no worker" if not new_ps or not new_w else "nothing to change"
            self.records.append(rec)
            return rec
        # step 2: best-fit assignment + clock
        rec["_t1"] = time.perf_counter()
        new_assign = rebalance(self.sizes, self.assignment, new_ps)
        mv = moves(self.assignment, new_assign)
        rec["moved_blocks"] = len(mv)
        rec["moved_params"] = int(sum(self.sizes[b] for b in mv))
        self.state = "scaling"
        clock = self._pause(rec)
        # step 3: migration
        t = time.perf_counter()
        all_ps = {**self.ps, **add_ps_d}
        by_src: dict[int, dict[str, str]] = {}
        for b, (src, dst) in mv.items():
            by_src.setdefault(src, {})[str(b)] = all_ps[dst]
        self._parallel(lambda s: self._c(self.ps[s]).call("MIGRATE", moves=by_src[s]), list(by_src))
        rec["t_step3_migration"] = time.perf_counter() - t
        self.assignment = new_assign
        if action is not None:
            with self.cv:
                self.ps = {p: all_ps[p] for p in new_ps}
            action(clock)
        if exit_after:
            self._exit_all()
            rec["t_total"] = time.perf_counter() - t_start
            rec.pop("_t1", None)
            self.records.append(rec)
            return rec
        # commit + step 4: worker update
        t = time.perf_counter()
        self._parallel(lambda p: self._c(all_ps[p]).call("COMMIT", workers=new_w, version=clock), new_ps)
        for p in remove_ps:
            self._safe(all_ps[p], "EXIT")
        all_w = {**self.workers, **add_w_d}
        with self.cv:
            self.ps = {p: all_ps[p] for p in new_ps}
            self.workers = {w: all_w[w] for w in new_w}
            old_members = [w for w in new_w if w not in add_w_d]
            self._gap_pending = (rec, self._last_progress_wall)
        self._resume_workers(clock, new_w)
        for w in remove_workers:
            self._safe(all_w[w], "RESUME", exit=True)
            self._safe(all_w[w], "EXIT")
        rec["t_resume_broadcast"] = time.perf_counter() - t
        deadline = time.monotonic() + 10
        with self.cv:
            while not set(old_members) <= set(self.resumed) and time.monotonic() < deadline:
                self.cv.wait(0.05)
            susp = [s for w, (_, s) in self.resumed.items() if w in old_members and s is not None]
        rec["suspension_s"] = susp
        rec["t_step4_worker_update"] = float(np.mean(susp)) if susp else None
        rec.update(ps_after=len(self.ps), workers_after=len(self.workers),
                   t_total=time.perf_counter() - t_start)
        rec.pop("_t1", None)
        self.state = "running"
        self.version = max(self.version, clock)
        self.records.append(rec)
        with self.cv:
            self.cv.notify_all()
        self._report(force=True)
        return rec

    def _safe(self, addr: str, op: str, **kw) -> None:
        try:
            self._c(addr).call(op, **kw)
        except Exception:
            pass
        if op != "EXIT":
            return
        with self._clients_lock:
            c = self.clients.pop(addr, None)
        if c:
            c.close()

    def _exit_all(self) -> None:
        for w, addr in list(self.workers.items()):
            self._safe(addr, "RESUME", exit=True)
            self._safe(addr, "EXIT")
        for p, addr in list(self.ps.items()):
            self._safe(addr, "EXIT")

    def _collect(self) -> tuple[np.ndarray, np.ndarray, int]:
        params = np.full(self.cfg.n_params, np.nan, np.float32)
        mom = np.full(self.cfg.n_params, np.nan, np.float32)
        seen: set[int] = set()
        version = None
        for p, addr in sorted(self.ps.items()):
            h, a = self._c(addr).call("GET_BLOCKS")
            version = int(h["version"]) if version is None else version
            for b in h["blocks"]:
                if b in seen:
                    raise RuntimeError(f"block {b} on two PSs")
                seen.add(b)
                off, ln = self.blocks[b]
                params[off:off + ln] = a[f"p{b}"]
                mom[off:off + ln] = a[f"m{b}"]
        if len(seen) != len(self.blocks):
            raise RuntimeError(f"blocks lost: {sorted(set(range(len(self.blocks))) - seen)}")
        return params, mom, version

    def _save(self, version: int) -> str:
        params, mom, _ = self._collect()
        self.final_params = params
        if not self.checkpoint_dir:
            raise RuntimeError("no checkpoint directory")
        spe = self.cfg.steps_per_epoch
        meta = {"job_id": self.job_id, "version": version, "epoch": version // spe,
                "step_in_epoch": version % spe, "data_position": version, "config": self.cfg.to_dict(),
                "workers": len(self.workers), "ps": len(self.ps), "time": time.time(),
                "last_step_time": self._last_progress_wall}
        return save_checkpoint(self.checkpoint_dir, meta, params, mom)

    def _checkpoint(self, exit_after: bool) -> dict:
        t0 = time.perf_counter()
        self.state = "checkpointing"
        box = {}
        rec = self._reconfigure(kind="checkpoint", action=lambda c: box.update(path=self._save(c), version=c),
                                exit_after=exit_after)
        if exit_after:
            self.state = "checkpointed"
            self.exit_reason = "checkpointed"
            self.finished.set()
            self._report(force=True)
        return {"path": box.get("path"), "version": box.get("version"),
                "seconds": time.perf_counter() - t0, "record": rec}

    def _checkpoint_restart(self, n_workers: int, n_ps: int) -> dict:
        """Resize by checkpoint, killing every role process, relaunching and restoring."""
        if self.spawner is None:
            raise RuntimeError("no spawner to relaunch roles")
        t0 = time.perf_counter()
        rec: dict = {"kind": "resize", "method": "checkpoint_restart", "ps_before": len(self.ps),
                     "workers_before": len(self.workers)}
        box: dict = {}
        self.state = "checkpointing"
        self._reconfigure(kind="checkpoint", action=lambda c: box.update(path=self._save(c), version=c),
                          exit_after=True)
        with self.cv:
            t_susp = min(self.suspended.values()) if self.suspended else time.time()
        rec["t_checkpoint"] = time.perf_counter() - t0
        t = time.perf_counter()
        self.spawner.kill_all()
        with self._clients_lock:
            clients, self.clients = list(self.clients.values()), {}
        for c in clients:
            c.close()
        rec["t_kill"] = time.perf_counter() - t
        with self.cv:
            self.ps, self.workers, self.assignment = {}, {}, {}
            self.done.clear()
            self.resumed.clear()
            self.started = False
        t = time.perf_counter()
        self.spawner.spawn("ps", n_ps)
        self.spawner.spawn("worker", n_workers)
        with self.cv:
            while len(self.joining_ps) < n_ps or len(self.joining_w) < n_workers:
                if not self.cv.wait(120):
                    raise TimeoutError("relaunched roles did not register")
        rec["t_relaunch"] = time.perf_counter() - t
        t = time.perf_counter()
        meta, p, m = load_checkpoint(self.checkpoint_dir)
        self.init_state, self.start_version = (p, m), int(meta["version"])
        with self.cv:
            self._gap_pending = (rec, meta.get("last_step_time"))
        self._start()
        rec["t_restore"] = time.perf_counter() - t
        deadline = time.monotonic() + 60
        with self.cv:
            while not set(self.workers) <= set(self.resumed) and time.monotonic() < deadline:
                self.cv.wait(0.05)
            t_res = [t for t, _ in self.resumed.values()]
        rec["suspension_s"] = [tr - t_susp for tr in t_res]
        rec.update(ps_after=len(self.ps), workers_after=len(self.workers), t_total=time.perf_counter() - t0,
                   checkpoint=box.get("path"), version=box.get("version"))
        self.records.append(rec)
        self.state = "running"
        self._report(force=True)
        return {"method": "checkpoint_restart", "records": [rec], "workers": n_workers, "ps": n_ps}

    def _finish(self) -> None:
        params, mom, version = self._collect()
        self.final_params = params
        if self.checkpoint_dir:
            spe = self.cfg.steps_per_epoch
            meta = {"job_id": self.job_id, "version": version, "epoch": version // spe,
                    "step_in_epoch": version % spe, "data_position": version,
                    "config": self.cfg.to_dict(), "workers": len(self.workers), "ps": len(self.ps),
                    "time": time.time(), "finished": True}
            save_checkpoint(self.checkpoint_dir, meta, params, mom)
            save_model(os.path.join(self.checkpoint_dir, "model.npz"), params)
        self._exit_all()
        self.state = "done"
        self.exit_reason = "done"
        self.version = version
        self._report(force=True)
        self.finished.set()
        with self.cv:
            self.cv.notify_all()
