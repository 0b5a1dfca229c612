"""What the coordinator and the PSs accept from an authenticated peer (pure checks; docs/elastic.md).

Authentication (:mod:`.auth`) keeps strangers out; these checks keep a confused or broken member (a worker
whose model diverged, a bug, a stale process) from corrupting the job or the daemon's view of it:

* :func:`allowed`: which role may send which request (resizing and stopping the job is the daemon's and
  ``dl2-run``'s, registering and reporting the roles');
* :func:`check_progress`: a ``PROGRESS`` report that goes backwards, jumps further than the job can have
  trained since the last one, passes the job's last step or carries non-finite numbers is refused;
* :func:`check_scale`: a ``SCALE`` beyond the job's bounds is refused;
* :func:`check_addr`: a registering role's address is ``host:port``;
* :func:`check_gradients`: a ``PUSH`` whose gradients are not finite, or not shaped like the blocks they
  update, is refused before anything is applied.

Each returns the checked values or raises ValueError with a one-line reason.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from .auth import CONTROL, MEMBER

#: Requests by the role that may send them; a request not listed is for any authenticated peer.
CONTROL_OPS = frozenset({"SCALE", "CHECKPOINT", "SHUTDOWN", "DEC_SERVER", "DEC_WORKER"})
MEMBER_OPS = frozenset({"INC_SERVER", "INC_WORKER", "PROGRESS", "SUSPENDED", "RESUMED", "DONE", "WORKER_ERROR"})
#: The most model versions a job can advance per second per worker (a version is a synchronous step, or one
#: asynchronous push): a step takes a pull and a push, tens of microseconds on loopback at the very least.
MAX_VERSIONS_PER_S_PER_WORKER = 20_000
#: Workers and PSs a job may be scaled to when the launcher names no bound (``dl2-run --max-workers/--max-ps``).
DEFAULT_MAX_ROLES = 64
SCALE_METHODS = ("hot", "checkpoint_restart")
MAX_TIMEOUT_S = 24 * 3600.0


def allowed(op: str, role: str | None) -> bool:
    """May a peer authenticated as ``role`` (None: an unauthenticated server) send ``op``?"""
    if role is None:
        return False
    if op in CONTROL_OPS:
        return role == CONTROL
    if op in MEMBER_OPS:
        return role == MEMBER
    return role in (CONTROL, MEMBER)


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what} must be an integer, got {repr(v)[:40]}")
    return v


def _finite(v: Any, what: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"{what} must be a finite number in [{lo:g}, {hi:g}], got {repr(v)[:40]}")
    return float(v)


def check_progress(report: Mapping[str, Any], *, version: int, total_steps: int, elapsed_s: float,
                   workers: int, max_samples: float) -> tuple[int, float, float | None]:
    """A worker's ``PROGRESS {version, samples, loss, step_time}`` against what the coordinator knows: the
    job is at ``version`` of ``total_steps``, ``elapsed_s`` seconds after the last accepted report, with
    ``workers`` workers. Returns ``(version, samples, loss)``; a non-finite loss (a diverging model) is
    returned as None: the step counts, the report shows no loss. ValueError says why a report is refused."""
    v = _int(report.get("version"), "version")
    samples = _finite(report.get("samples"), "samples", 0, max_samples)
    if report.get("step_time") is not None:
        _finite(report["step_time"], "step_time", 0, MAX_TIMEOUT_S)
    loss = report.get("loss")
    if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float))):
        raise ValueError(f"loss must be a number, got {repr(loss)[:40]}")
    if v < version:
        raise ValueError(f"version {v} goes backwards (the job is at {version})")
    slack = 1 + max(1, workers)  # asynchronous: every worker may push once between two reports, or past the end
    if v > total_steps + slack:
        raise ValueError(f"version {v} is beyond the job's last step {total_steps}")
    most = slack + MAX_VERSIONS_PER_S_PER_WORKER * max(1, workers) * max(0.0, elapsed_s)
    if v - version > most:
        raise ValueError(f"version jumps by {v - version} in {elapsed_s:.3f} s (at most {int(most)} possible)")
    return v, samples, (float(loss) if loss is not None and math.isfinite(loss) else None)


def check_done(version: Any, *, total_steps: int, workers: int) -> int:
    """A worker's ``DONE {version}``: an integer no further than the job's last step (plus one push each)."""
    v = _int(version, "version")
    if not 0 <= v <= total_steps + max(1, workers):
        raise ValueError(f"version {v} is outside the job's steps 0..{total_steps}")
    return v


def check_scale(request: Mapping[str, Any], *, max_workers: int, max_ps: int) -> tuple[int, int, str, float]:
    """``SCALE {workers, ps, method, timeout}`` within the job's bounds: ``(workers, ps, method, timeout)``."""
    w, p = _int(request.get("workers"), "workers"), _int(request.get("ps"), "ps")
    if not 1 <= w <= max_workers:
        raise ValueError(f"workers must be 1..{max_workers} (this job's bound), got {w}")
    if not 1 <= p <= max_ps:
        raise ValueError(f"ps must be 1..{max_ps} (this job's bound), got {p}")
    method = request.get("method", "hot")
    if method not in SCALE_METHODS:
        raise ValueError(f"method must be one of {', '.join(SCALE_METHODS)}, got {repr(method)[:40]}")
    timeout = _finite(request.get("timeout", 300), "timeout", 0, MAX_TIMEOUT_S)
    return w, p, method, timeout


def check_addr(addr: Any) -> str:
    """A registering role's ``host:port``."""
    if not isinstance(addr, str) or len(addr) > 300:
        raise ValueError(f"addr must be a string host:port, got {repr(addr)[:40]}")
    host, sep, port = addr.rpartition(":")
    if not sep or not host or any(c.isspace() for c in host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"addr must be host:port, got {addr[:60]!r}")
    return addr


def check_gradients(arrays: Mapping[str, np.ndarray], blocks: Mapping[int, tuple[np.ndarray, np.ndarray]],
                    ids: list[int]) -> list[np.ndarray]:
    """The gradient arrays of a ``PUSH`` for blocks ``ids``, each present, shaped like its block and finite
    (checked before any is applied: a refused push changes nothing)."""
    out = []
    for b in ids:
        g = arrays.get(str(b))
        if g is None:
            raise ValueError(f"no gradient for block {b}")
        if g.shape != blocks[b][0].shape:
            raise ValueError(f"gradient of block {b} has shape {g.shape}, the block {blocks[b][0].shape}")
        if not np.isfinite(g).all():
            raise ValueError(f"non-finite gradient values in block {b} (NaN or infinity): push refused")
        out.append(g)
    return out
