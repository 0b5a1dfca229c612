"""Client API for the daemon: query and resize a running elastic job.

>>> method = choose_resize_method(JobCaps(hot_scaling=True), (2, 1), (4, 2), free_nodes=3)
>>> res = scale("node01:40123", workers=4, ps=2)        # doctest: +SKIP
>>> res["method"], [r["t_step4_worker_update"] for r in res["records"]]   # doctest: +SKIP

The coordinator address is written by ``dl2-run`` to ``<checkpoint-dir>/coordinator.json``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from . import protocol as P


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


def _client(addr: str, timeout: float) -> P.Client:
    return P.Client(addr, timeout=timeout)


def read_coordinator_file(checkpoint_dir: str) -> str:
    with open(os.path.join(checkpoint_dir, "coordinator.json")) as f:
        return json.load(f)["address"]


def status(coordinator_addr: str, timeout: float = 10.0) -> dict:
    c = _client(coordinator_addr, timeout)
    try:
        h, _ = c.call("STATUS")
    finally:
        c.close()
    return h


def supports_hot_scaling(coordinator_addr: str, timeout: float = 5.0) -> bool:
    """True when the job's coordinator answers and can start new roles itself."""
    try:
        return bool(status(coordinator_addr, timeout).get("hot_scaling"))
    except (OSError, P.RemoteError, P.ProtocolError, ConnectionError):
        return False


def scale(coordinator_addr: str, workers: int, ps: int, method: str = "auto",
          timeout: float = 600.0) -> dict:
    """Resize the job to ``workers`` workers and ``ps`` PSs.

    ``method``: ``"hot"``, ``"checkpoint_restart"`` or ``"auto"`` (hot when
    supported).  Returns ``{"method", "workers", "ps", "records": [...]}``; each
    record has the timings of one scaling event (``t_step1_registration``,
    ``t_step2_assignment``, ``t_wait_clock``, ``t_step3_migration``,
    ``t_step4_worker_update``, ``suspension_s`` ...).
    """
    if method == "auto":
        method = "hot" if supports_hot_scaling(coordinator_addr) else "checkpoint_restart"
    c = _client(coordinator_addr, timeout + 10)
    try:
        h, _ = c.call("SCALE", workers=workers, ps=ps, method=method, timeout=timeout)
    finally:
        c.close()
    h.pop("ok", None)
    return h


def checkpoint(coordinator_addr: str, exit: bool = False, timeout: float = 600.0) -> dict:
    """Take a consistent checkpoint now (and stop the job if ``exit``)."""
    c = _client(coordinator_addr, timeout + 10)
    try:
        h, _ = c.call("CHECKPOINT", exit=exit, timeout=timeout)
    finally:
        c.close()
    return h
