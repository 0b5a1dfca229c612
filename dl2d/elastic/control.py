"""Client API for the daemon: query and resize a running elastic job.

>>> method = choose_resize_method(JobCaps(hot_scaling=True), (2, 1), (4, 2), free_nodes=3)
>>> res = scale("node01:40123", workers=4, ps=2, secret=secret)        # doctest: +SKIP
>>> res["method"], [r["t_step4_worker_update"] for r in res["records"]]   # doctest: +SKIP

The coordinator address is written by ``dl2-run`` to ``<checkpoint-dir>/coordinator.json``. Every call
authenticates with the job's ``secret`` (the daemon's copy: ``JobDir.secret()``; a standalone job's:
:func:`read_job_secret`); without it the coordinator refuses the connection (an AuthError, a ConnectionError).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from dl2d.core.files import read_secret_file

from . import protocol as P
from .auth import Credentials


@dataclass(frozen=True)
class JobCaps:
    """What a job's runtime can do.

    hot_scaling: the runtime supports hot scaling (dl2-run elastic jobs do).
    roles_per_node: how many new PS/worker roles fit on one free node.
    spare_slots: roles that still fit on nodes the job already holds.
    """
    hot_scaling: bool = True
    roles_per_node: int = 1
    spare_slots: int = 0


def nodes_needed(caps: JobCaps, current: tuple[int, int], target: tuple[int, int]) -> int:
    extra = max(0, target[0] - current[0]) + max(0, target[1] - current[1])
    extra = max(0, extra - caps.spare_slots)
    return math.ceil(extra / max(1, caps.roles_per_node))


def choose_resize_method(job_caps: JobCaps, current: tuple[int, int], target: tuple[int, int],
                         free_nodes: int) -> str:
    """``"hot"`` if the runtime supports hot scaling and the extra roles fit on
    ``free_nodes`` (shrinking needs none), else ``"checkpoint_restart"``.

    ``current`` and ``target`` are ``(workers, ps)``; both counts must be >= 1.
    """
    if min(target) < 1 or min(current) < 1:
        raise ValueError("a job needs at least one worker and one PS")
    if not job_caps.hot_scaling:
        return "checkpoint_restart"
    if nodes_needed(job_caps, current, target) > max(0, free_nodes):
        return "checkpoint_restart"
    return "hot"


def _client(addr: str, timeout: float, secret: str | None) -> P.Client:
    return P.Client(addr, timeout=timeout, auth=Credentials.from_secret(secret) if secret else None)


def read_coordinator_file(checkpoint_dir: str) -> str:
    with open(os.path.join(checkpoint_dir, "coordinator.json")) as f:
        return json.load(f)["address"]


def read_job_secret(checkpoint_dir: str) -> str:
    """The secret of the job that published ``<checkpoint_dir>/coordinator.json`` (the file it names, with
    the checks of :func:`dl2d.core.files.read_secret_file`). For a local operator of a standalone job; the
    daemon uses the copy it made, not a path the job wrote."""
    with open(os.path.join(checkpoint_dir, "coordinator.json")) as f:
        return read_secret_file(json.load(f)["secret_file"], what="job secret file")


def status(coordinator_addr: str, timeout: float = 10.0, secret: str | None = None) -> dict:
    c = _client(coordinator_addr, timeout, secret)
    try:
        h, _ = c.call("STATUS")
    finally:
        c.close()
    return h


def supports_hot_scaling(coordinator_addr: str, timeout: float = 5.0, secret: str | None = None) -> bool:
    """True when the job's coordinator answers (to us: authenticated) and can start new roles itself."""
    try:
        return bool(status(coordinator_addr, timeout, secret).get("hot_scaling"))
    except (OSError, P.RemoteError, P.ProtocolError, ConnectionError):
        return False


def scale(coordinator_addr: str, workers: int, ps: int, method: str = "auto",
          timeout: float = 600.0, secret: str | None = None) -> dict:
    """Resize the job to ``workers`` workers and ``ps`` PSs.

    ``method``: ``"hot"``, ``"checkpoint_restart"`` or ``"auto"`` (hot when
    supported).  Returns ``{"method", "workers", "ps", "records": [...]}``; each
    record has the timings of one scaling event (``t_step1_registration``,
    ``t_step2_assignment``, ``t_wait_clock``, ``t_step3_migration``,
    ``t_step4_worker_update``, ``suspension_s`` ...).
    """
    if method == "auto":
        method = "hot" if supports_hot_scaling(coordinator_addr, secret=secret) else "checkpoint_restart"
    c = _client(coordinator_addr, timeout + 10, secret)
    try:
        h, _ = c.call("SCALE", workers=workers, ps=ps, method=method, timeout=timeout)
    finally:
        c.close()
    h.pop("ok", None)
    return h


def checkpoint(coordinator_addr: str, exit: bool = False, timeout: float = 600.0,
               secret: str | None = None) -> dict:
    """Take a consistent checkpoint now (and stop the job if ``exit``)."""
    c = _client(coordinator_addr, timeout + 10, secret)
    try:
        h, _ = c.call("CHECKPOINT", exit=exit, timeout=timeout)
    finally:
        c.close()
    return h


def shutdown(coordinator_addr: str, secret: str | None = None, timeout: float = 10.0) -> None:
    """Stop the job now, without a checkpoint (``dl2-run`` exits 1)."""
    c = _client(coordinator_addr, timeout, secret)
    try:
        c.call("SHUTDOWN")
    finally:
        c.close()
