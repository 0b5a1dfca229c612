"""Worker: pulls parameters from the PSs, computes gradients, pushes them.

A worker registers with ``INC_WORKER`` and then waits for ``RESUME`` (which
also starts it).  It runs a small control server for the coordinator:

``PREPARE {clock, attempt}``
    remember the scaling clock; answer ``late`` if the worker has already
    started computing the step ``clock`` (synchronous mode).  ``SUSPENDED``
    echoes ``attempt`` so the coordinator ignores a suspension at a void clock.
``CANCEL``
    forget the clock (a peer was late); a worker already suspended at it
    goes on training with the same map.
``RESUME {ps: {addr: [blocks]}, workers: [ids], version, exit}``
    new parameter->PS map, member list (rank = position) and version; resume
    training (or exit when this worker was removed).
``PING``, ``EXIT``

Suspension (DL2 Fig. 13): from the moment the versions pulled from the PSs
reach the clock (or a PS refuses because it froze) until training resumes
with the new map and the parameters pulled from the new owners.

Every connection, in and out, is authenticated with the job's member key (:mod:`.auth`).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from . import protocol as P
from .auth import Credentials
from .model import (TrainConfig, async_batch_indices, batch_indices, grad_sum, make_dataset,
                    worker_slice)


class Worker:
    def __init__(self, coord_addr: str, key: bytes, host: str = "127.0.0.1", advertise_host: str | None = None,
                 port: int = 0):
        """``key``: the job's member key (:func:`.auth.derive_keys`), for every connection in and out."""
        self.coord_addr = coord_addr
        self.creds = Credentials.member(key)
        self.server = P.Server(self.handle, host, port, advertise_host, auth=self.creds)
        self.address = self.server.address
        self.worker_id: int | None = None
        self.cfg: TrainConfig | None = None
        self.lock = threading.Lock()
        self.clock: int | None = None
        self.attempt: int | None = None  # PREPARE attempt of ``clock`` (echoed in SUSPENDED)
        self.parked = False  # suspended at ``clock``, waiting for RESUME (or CANCEL)
        self.cancelled = False  # the last wake-up was a CANCEL, not a RESUME
        self.passed = -1  # last step whose computation has started
        self.version = 0
        self.resume_evt = threading.Event()
        self.resume_msg: dict | None = None
        self.exited = threading.Event()
        self.ps_blocks: dict[str, list[int]] = {}
        self.members: list[int] = []
        self._ps: dict[str, P.Client] = {}
        self.suspensions: list[float] = []
        self.step_times: list[float] = []
        self.local_step = 0
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> "Worker":
        self.server.start()
        self.coord = P.Client(self.coord_addr, auth=self.creds)
        h, _ = self.coord.call("INC_WORKER", addr=self.address)
        self.worker_id = int(h["worker_id"])
        self.cfg = TrainConfig.from_dict(h["config"])
        self.thread = threading.Thread(target=self._run_safe, daemon=True, name=f"worker-{self.worker_id}")
        self.thread.start()
        return self

    def stop(self) -> None:
        self.exited.set()
        self.resume_evt.set()
        self.server.close()
        for c in self._ps.values():
            c.close()

    # -- control server ---------------------------------------------------------------
    def handle(self, h, a):
        op = h["op"]
        if op == "PING":
            with self.lock:
                return {"version": self.version, "passed": self.passed}
        if op == "PREPARE":
            clock = int(h["clock"])
            with self.lock:
                if self.cfg.sync and clock <= self.passed:
                    return {"late": True, "version": self.passed + 1}
                self.clock = clock
                self.attempt = h.get("attempt")
                return {"late": False, "version": self.version}
        if op == "CANCEL":
            # Another peer was late: this clock is void.  A worker already parked
            # at it must go on training (nothing changed), or the next step could
            # never complete (synchronous mode) and no retried clock be reached.
            with self.lock:
                self.clock = None
                self.attempt = None
                if self.parked:
                    self.resume_msg = {"cancel": True}
                    self.resume_evt.set()
            return {}
        if op == "RESUME":
            # Applied here, under the lock, so that a PREPARE for the next
            # reconfiguration arriving right after cannot be overwritten.
            with self.lock:
                if not h.get("exit"):
                    self.ps_blocks = {addr: [int(b) for b in bl] for addr, bl in h["ps"].items()}
                    self.members = [int(w) for w in h["workers"]]
                    self.version = int(h["version"])
                    self.passed = self.version - 1
                    self.clock = None
                    self.attempt = None
                self.resume_msg = h
                self.resume_evt.set()
            return {}
        if op == "EXIT":
            threading.Thread(target=self.stop, daemon=True).start()
            return {}
        raise ValueError(f"unknown op {op}")

    # -- training loop -------------------------------------------------------------------
    def _client(self, addr: str) -> P.Client:
        if addr not in self._ps:
            self._ps[addr] = P.Client(addr, auth=self.creds)
        return self._ps[addr]

    def _wait_resume(self) -> bool:
        """Wait for RESUME; apply it. Returns False when told to exit."""
        self.resume_evt.wait()
        if self.exited.is_set():
            return False
        with self.lock:
            h = self.resume_msg
            self.resume_evt.clear()
            self.parked = False
        self.cancelled = bool(h.get("cancel"))
        if self.cancelled:
            return True
        if h.get("exit"):
            return False
        for addr in list(self._ps):
            if addr not in self.ps_blocks:
                self._ps.pop(addr).close()
        return True

    def _pull(self) -> tuple[np.ndarray, list[int], bool]:
        flat = np.empty(self.cfg.n_params, np.float32)
        versions, frozen = [], False
        blocks = self.blocks_list
        for addr, ids in self.ps_blocks.items():
            h, a = self._client(addr).call("PULL", min_version=self.version if self.cfg.sync else 0)
            if h["frozen"]:  # scaling in progress: the worker suspends, data unused
                versions.append(int(h["version"]))
                frozen = True
                continue
            if sorted(int(b) for b in h["blocks"]) != sorted(ids):
                raise RuntimeError(f"PS {addr} owns {h['blocks']}, map says {ids}")
            for b in ids:
                off, ln = blocks[b]
                flat[off:off + ln] = a[str(b)]
            versions.append(int(h["version"]))
            frozen |= bool(h["frozen"])
        return flat, versions, frozen

    def _run_safe(self) -> None:
        try:
            self._run()
        except BaseException as e:  # surfaced to tests / role main
            if not self.exited.is_set():
                self.error = e
                try:
                    self.coord.call("WORKER_ERROR", worker=self.worker_id, error=repr(e))
                except Exception:
                    pass
        finally:
            self.exited.set()

    def _run(self) -> None:
        cfg = self.cfg
        self.blocks_list = cfg.blocks()
        X, Y = make_dataset(cfg)
        if not self._wait_resume():
            return
        total = cfg.total_steps
        pending: dict[int, tuple[np.ndarray, int]] = {}  # async: refused block grads
        done_reported = False
        t_susp: float | None = None
        report_resume = True  # also after the initial start (checkpoint/restart timing)
        while not self.exited.is_set():
            flat, versions, frozen = self._pull()
            if report_resume:  # resumed: parameters pulled from the new owners
                s = None
                if t_susp is not None:
                    s = time.perf_counter() - t_susp
                    self.suspensions.append(s)
                self._safe_coord("RESUMED", worker=self.worker_id, suspension_s=s)
                t_susp, report_resume = None, False
            if cfg.sync and len(set(versions)) > 1:
                raise RuntimeError(f"PS versions differ in synchronous mode: {versions}")
            v = max(versions)
            with self.lock:
                clock = self.clock
                at_clock = clock is not None and (frozen or v >= clock)
                finished = v >= total
                # a PS still frozen at a clock being cancelled: its blocks were not sent
                stale = frozen and not at_clock
                if not at_clock and not finished and not stale:
                    self.passed = v if cfg.sync else self.passed + 1
                self.parked = at_clock
                attempt = self.attempt
            if stale:
                time.sleep(0.002)
                continue
            if at_clock:
                t_susp = time.perf_counter()
                self._safe_coord("SUSPENDED", worker=self.worker_id, version=v, clock=clock, attempt=attempt)
                if not self._wait_resume():
                    return
                if self.cancelled:  # the clock was cancelled: go on with the same map
                    t_susp = None
                    continue
                if pending:  # async: gradients refused by a frozen PS go to the new owners
                    self._push_pending(pending)
                report_resume = True
                continue
            if finished:
                if not done_reported:
                    self._safe_coord("DONE", worker=self.worker_id, version=v)
                    done_reported = True
                # wait for a further reconfiguration (e.g. checkpoint) or exit
                while not self.exited.is_set():
                    with self.lock:
                        if self.clock is not None:
                            break
                    time.sleep(0.01)
                continue
            t0 = time.perf_counter()
            rank = self.members.index(self.worker_id)
            if cfg.sync:
                idx = worker_slice(batch_indices(cfg, v), rank, len(self.members))
            else:
                idx = async_batch_indices(cfg, self.worker_id, self.local_step)
            self.local_step += 1
            g, lsum = grad_sum(cfg, flat, X[idx], Y[idx])
            refused = False
            for addr, ids in self.ps_blocks.items():
                arrays = {str(b): g[self.blocks_list[b][0]:sum(self.blocks_list[b])] for b in ids}
                h, _ = self._client(addr).call("PUSH", arrays, worker=self.worker_id, count=len(idx),
                                               step=v, blocks=ids)
                if h.get("refused"):
                    if cfg.sync:
                        raise RuntimeError("synchronous push refused")
                    refused = True
                    for b in ids:
                        pending[b] = (arrays[str(b)].copy(), len(idx))
            self.version = v + 1 if cfg.sync else v
            dt = time.perf_counter() - t0
            self.step_times.append(dt)
            if rank == 0:
                self._safe_coord("PROGRESS", worker=self.worker_id, version=v + 1, step_time=dt,
                                 samples=cfg.global_batch if cfg.sync else len(idx) * len(self.members),
                                 loss=lsum / max(1, len(idx)))
            if refused:
                with self.lock:
                    if self.clock is None:
                        self.clock = v  # the PS froze: suspend on the next pull
        self.stop()

    def _push_pending(self, pending: dict[int, tuple[np.ndarray, int]]) -> None:
        owner = {b: addr for addr, ids in self.ps_blocks.items() for b in ids}
        groups: dict[str, list[int]] = {}
        for b in pending:
            groups.setdefault(owner[b], []).append(b)
        for addr, ids in groups.items():
            count = pending[ids[0]][1]
            self._client(addr).call("PUSH", {str(b): pending[b][0] for b in ids}, worker=self.worker_id,
                                    count=count, step=-1, blocks=ids)
        pending.clear()

    def _safe_coord(self, op: str, **kw) -> None:
        try:
            self.coord.call(op, **kw)
        except Exception:
            pass
