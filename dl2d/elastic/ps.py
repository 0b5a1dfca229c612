"""Parameter server: owns a set of parameter blocks (params + momentum).

Requests served (see :mod:`dl2d.elastic.protocol` for framing, ``docs/elastic.md``
for the full message table):

from workers
    ``PULL {min_version}`` -> block params, ``version``, ``frozen`` (no params when frozen)
    ``PUSH {step, worker, count, blocks}`` + gradient sums -> applied / ``refused``
from the coordinator
    ``PING``, ``PREPARE {clock}``, ``CANCEL``, ``WAIT_CLOCK {timeout}``, ``FREEZE``,
    ``MIGRATE {moves: {block: dest_addr}}``, ``GET_BLOCKS``, ``COMMIT {workers, version}``,
    ``EXIT``
from other PSs
    ``PUT_BLOCKS {blocks, version}`` + params and momentum arrays

Version counter: number of updates applied (synchronous: global steps, one
per step once every expected worker has pushed; asynchronous: one per push).
When the version reaches the scaling clock the PS *freezes*: it applies no
further update until the coordinator's ``COMMIT`` (pushes in asynchronous mode
are refused and re-sent by the worker to the new owner after the move).

Every connection, in and out, is authenticated with the job's member key
(:mod:`.auth`). A ``PUSH`` whose gradients are not finite or not shaped like
their blocks is refused whole (one log line, parameters unchanged).
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from . import protocol as P
from .auth import Credentials
from .guards import check_gradients
from .model import TrainConfig, sgd_update

log = logging.getLogger(__name__)


class ParameterServer:
    def __init__(self, coord_addr: str, key: bytes, host: str = "127.0.0.1", advertise_host: str | None = None,
                 port: int = 0):
        """``key``: the job's member key (:func:`.auth.derive_keys`), for every connection in and out."""
        self.coord_addr = coord_addr
        self.creds = Credentials.member(key)
        self.server = P.Server(self.handle, host, port, advertise_host, auth=self.creds)
        self.address = self.server.address
        self.ps_id: int | None = None
        self.cfg: TrainConfig | None = None
        self.blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.version = 0
        self.clock: int | None = None
        self.frozen = False
        self.workers: set[int] = set()
        self.acc: dict[int, np.ndarray] = {}
        self.acc_from: set[int] = set()
        self.acc_count = 0
        self.cv = threading.Condition()
        self.exited = threading.Event()
        self._peers: dict[str, P.Client] = {}

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> "ParameterServer":
        self.server.start()
        t0 = time.perf_counter()
        c = P.Client(self.coord_addr, auth=self.creds)
        h, _ = c.call("INC_SERVER", addr=self.address)
        c.close()
        self.reg_rtt = time.perf_counter() - t0
        self.ps_id = int(h["ps_id"])
        self.cfg = TrainConfig.from_dict(h["config"])
        return self

    def stop(self) -> None:
        self.server.close()
        for c in self._peers.values():
            c.close()
        self.exited.set()
        with self.cv:
            self.cv.notify_all()

    # -- helpers -----------------------------------------------------------------
    def _maybe_freeze(self) -> None:
        if self.clock is not None and self.version >= self.clock and not self.frozen:
            self.frozen = True
            self.cv.notify_all()

    def _peer(self, addr: str) -> P.Client:
        if addr not in self._peers:
            self._peers[addr] = P.Client(addr, auth=self.creds)
        return self._peers[addr]

    # -- request handler ------------------------------------------------------------
    def handle(self, h: dict, a: P.Arrays):
        op = h["op"]
        fn = getattr(self, "op_" + op, None)
        if fn is None:
            raise ValueError(f"unknown op {op}")
        return fn(h, a)

    def op_PING(self, h, a):
        with self.cv:
            return {"version": self.version, "frozen": self.frozen, "n_blocks": len(self.blocks)}

    def op_PULL(self, h, a):
        minv = int(h.get("min_version", 0))
        deadline = time.monotonic() + float(h.get("timeout", 300))
        with self.cv:
            while self.version < minv and not self.frozen and not self.exited.is_set():
                if not self.cv.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"version {self.version} < {minv}")
            if self.frozen:  # the worker suspends and discards the data: send none
                return {"version": self.version, "frozen": True, "blocks": []}
            ids = sorted(self.blocks)
            arrays = {str(b): self.blocks[b][0].copy() for b in ids}
            return {"version": self.version, "frozen": False, "blocks": ids}, arrays

    def op_PUSH(self, h, a):
        wid, count, step = int(h["worker"]), int(h["count"]), int(h.get("step", -1))
        ids = [int(b) for b in h["blocks"]]
        if count < 0 or len(set(ids)) != len(ids):
            raise ValueError("a push needs a count >= 0 and distinct blocks")
        cfg = self.cfg
        with self.cv:
            if self.frozen:
                return {"refused": True, "version": self.version}
            missing = [b for b in ids if b not in self.blocks]
            if missing:
                raise KeyError(f"PS {self.ps_id} does not own blocks {missing}")
            try:
                check_gradients(a, self.blocks, ids)
            except ValueError as e:
                log.warning("PS %s: refused a push of worker %s for step %s: %s", self.ps_id, wid, step, e)
                raise
            if cfg.sync:
                if step != self.version:
                    raise ValueError(f"push for step {step} at version {self.version}")
                if wid not in self.workers:
                    raise ValueError(f"worker {wid} not a member {sorted(self.workers)}")
                if wid in self.acc_from:
                    raise ValueError(f"duplicate push from worker {wid}")
                if set(ids) != set(self.blocks):
                    raise ValueError("a synchronous push must cover all blocks of the PS")
                for b in ids:
                    g = a[str(b)]
                    if b in self.acc:
                        self.acc[b] += g
                    else:
                        self.acc[b] = g.copy()
                self.acc_from.add(wid)
                self.acc_count += count
                if self.acc_from >= self.workers:
                    n = np.float32(cfg.global_batch)
                    for b, g in self.acc.items():
                        g /= n
                        p, m = self.blocks[b]
                        sgd_update(p, m, g, cfg.lr, cfg.momentum)
                    self.acc.clear()
                    self.acc_from.clear()
                    self.acc_count = 0
                    self.version += 1
                    self._maybe_freeze()
                    self.cv.notify_all()
            else:
                n = np.float32(max(1, count))
                for b in ids:
                    p, m = self.blocks[b]
                    sgd_update(p, m, a[str(b)] / n, cfg.lr, cfg.momentum)
                self.version += 1
                self._maybe_freeze()
                self.cv.notify_all()
            return {"refused": False, "version": self.version}

    def op_PREPARE(self, h, a):
        clock = int(h["clock"])
        with self.cv:
            if self.cfg.sync and self.version > clock:
                return {"late": True, "version": self.version}
            self.clock = clock
            self._maybe_freeze()
            return {"late": False, "version": self.version}

    def op_CANCEL(self, h, a):
        with self.cv:
            self.clock = None
            self.frozen = False
            self.cv.notify_all()
        return {}

    def op_WAIT_CLOCK(self, h, a):
        deadline = time.monotonic() + float(h.get("timeout", 0.05))
        with self.cv:
            while not self.frozen:
                rem = deadline - time.monotonic()
                if rem <= 0:
                    break
                self.cv.wait(rem)
            return {"reached": self.frozen, "version": self.version}

    def op_FREEZE(self, h, a):
        with self.cv:
            self.frozen = True
            self.cv.notify_all()
            return {"version": self.version}

    def op_MIGRATE(self, h, a):
        """Move blocks to other PSs: ``moves = {block_id: dest_addr}``."""
        with self.cv:
            if not self.frozen:
                raise RuntimeError("MIGRATE before the scaling clock was reached")
            groups: dict[str, list[int]] = {}
            for b, dest in h["moves"].items():
                if int(b) not in self.blocks:
                    raise KeyError(f"PS {self.ps_id} has no block {b}")
                groups.setdefault(dest, []).append(int(b))
            version = self.version
            payloads = {}
            for dest, ids in groups.items():
                arrays = {}
                for b in ids:
                    p, m = self.blocks[b]
                    arrays[f"p{b}"] = p
                    arrays[f"m{b}"] = m
                payloads[dest] = (ids, arrays)
        nbytes = 0
        for dest, (ids, arrays) in payloads.items():
            self._peer(dest).call("PUT_BLOCKS", arrays, blocks=ids, version=version)
            nbytes += sum(x.nbytes for x in arrays.values())
        with self.cv:
            for ids, _ in payloads.values():
                for b in ids:
                    del self.blocks[b]
        return {"bytes": nbytes}

    def op_PUT_BLOCKS(self, h, a):
        with self.cv:
            for b in h["blocks"]:
                b = int(b)
                if b in self.blocks:
                    raise KeyError(f"PS {self.ps_id} already owns block {b}")
                self.blocks[b] = (a[f"p{b}"].copy(), a[f"m{b}"].copy())
            if "version" in h:
                self.version = int(h["version"])
        return {}

    def op_GET_BLOCKS(self, h, a):
        with self.cv:
            arrays = {}
            for b, (p, m) in self.blocks.items():
                arrays[f"p{b}"] = p.copy()
                arrays[f"m{b}"] = m.copy()
            return {"blocks": sorted(self.blocks), "version": self.version}, arrays

    def op_COMMIT(self, h, a):
        with self.cv:
            self.workers = {int(w) for w in h["workers"]}
            self.version = int(h["version"])
            self.clock = None
            self.frozen = False
            self.acc.clear()
            self.acc_from.clear()
            self.acc_count = 0
            self.cv.notify_all()
            return {"n_blocks": len(self.blocks)}

    def op_EXIT(self, h, a):
        threading.Thread(target=self.stop, daemon=True).start()
        return {}
