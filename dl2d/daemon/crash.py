"""Crash injection for the crash tests: ``DL2D_DEBUG_CRASH=point:k`` makes the daemon SIGKILL itself the k-th
time its slot loop reaches ``point`` (planned, issued, applied, ended, closed), so the tests can check that a
daemon killed anywhere restarts without losing a job or resizing twice."""
from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("dl2d")


class CrashHook:
    """``DL2D_DEBUG_CRASH=point:k[,point:k]``: SIGKILL ourselves the k-th time ``point`` is reached."""

    def __init__(self, spec: str = ""):
        self.at: dict[str, int] = {}
        for part in filter(None, (s.strip() for s in spec.split(","))):
            name, _, k = part.partition(":")
            self.at[name] = int(k or 1)
        self.seen: dict[str, int] = {}

    def __call__(self, point: str) -> None:
        if point not in self.at:
            return
        self.seen[point] = self.seen.get(point, 0) + 1
        if self.seen[point] == self.at[point]:
            log.warning("DL2D_DEBUG_CRASH: killing myself at %s #%d", point, self.seen[point])
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)
