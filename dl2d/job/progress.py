"""What a job reports to dl2d: one JSON object in ``$DL2D_PROGRESS_FILE``, replaced atomically (a reader sees
the old report or the new one, never part of one), written by rank 0. The daemon reads its speed from it
(steps per slot), its fraction done (``step`` / ``total_steps`` of ``epochs``), whether it checkpointed or is
done, and the work a restart lost::

    {"step": 120, "total_steps": 400, "epochs": 2.0, "state": "running", "time": 1764000000.0,
     "samples": 15360, "world_size": 3, "runs": 3, "resumed_from": 100, "lost_steps": 20}

``state``: ``starting`` (before the first step), ``running``, ``checkpointed`` (saved on the signal, asks to be
started again), ``done``. ``lost_steps``: over all restarts, the steps reported done but not in the
checkpoint the job resumed from (work a job killed before it saved has to redo). :func:`next_report` is the
pure rule; :class:`ProgressFile` the file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping

from dl2d.core.files import write_json_atomic

STATES = ("starting", "running", "checkpointed", "done")


def resumed_report(previous: Mapping[str, Any] | None, step: int, total_steps: int, epochs: float,
                   world_size: int, now: float) -> dict[str, Any]:
    """The first report of a run that resumes at ``step`` (0: from scratch), given the last report of the
    run before (None: there was none). The steps the last run reported beyond ``step`` are lost work."""
    prev = dict(previous or {})
    last = prev.get("step")
    last_step = int(last) if isinstance(last, (int, float)) and not isinstance(last, bool) else 0
    lost = prev.get("lost_steps")
    lost_steps = int(lost) if isinstance(lost, (int, float)) and not isinstance(lost, bool) else 0
    runs = prev.get("runs")
    return {
        "step": int(step), "total_steps": int(total_steps), "epochs": float(epochs), "state": "starting",
        "time": now, "samples": prev.get("samples") if step else 0, "world_size": int(world_size),
        "runs": (int(runs) if isinstance(runs, int) and not isinstance(runs, bool) else 0) + 1,
        "resumed_from": int(step), "lost_steps": lost_steps + max(0, last_step - int(step)),
    }


def next_report(report: Mapping[str, Any], state: str, step: int, now: float,
                samples: int | None = None) -> dict[str, Any]:
    """``report`` moved on to ``step`` in ``state``."""
    if state not in STATES:
        raise ValueError(f"progress state must be one of {', '.join(STATES)}, not {state!r}")
    out = {**report, "state": state, "step": int(step), "time": now}
    if samples is not None:
        out["samples"] = int(samples)
    return out


class ProgressFile:
    """Rank 0's progress reports (other ranks: no-ops, so every rank may call them)."""

    def __init__(self, path: Path | None, *, write: bool, total_steps: int, epochs: float,
                 world_size: int, min_interval_s: float = 0.5) -> None:
        self.path = path if write else None
        self.total_steps = int(total_steps)
        self.epochs = float(epochs)
        self.world_size = int(world_size)
        self.min_interval_s = min_interval_s
        self.report: dict[str, Any] = {}
        self._written = 0.0

    def previous(self) -> dict[str, Any] | None:
        """The last report in the file (the last run's), None when there is none or it is unreadable."""
        if self.path is None:
            return None
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def resumed(self, step: int) -> dict[str, Any]:
        self.report = resumed_report(self.previous(), step, self.total_steps, self.epochs, self.world_size,
                                     time.time())
        self._write(force=True)
        return self.report

    def update(self, state: str, step: int, samples: int | None = None, force: bool = False) -> None:
        self.report = next_report(self.report, state, step, time.time(), samples)
        self._write(force=force or state != "running")

    def write_now(self) -> None:
        """Write the report as it is (rank 0; a no-op elsewhere)."""
        self._write(force=True)

    def _write(self, force: bool) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._written < self.min_interval_s:
            return
        write_json_atomic(self.path, self.report, fsync=False)
        self._written = now
