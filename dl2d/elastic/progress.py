"""Progress reporting to the daemon: best-effort HTTP POST + local JSON file.

Each report is one JSON object::

    {"job_id": str, "epoch": int, "step": int (global step = model version),
     "step_in_epoch": int, "total_steps": int, "epochs": int,
     "samples_per_s": float, "workers": int, "ps": int,
     "state": "starting|running|scaling|checkpointing|checkpointed|done|failed",
     "loss": float|null, "time": float (unix seconds),
     "last_resize": {...}|null  (the last scaling record: kind, method, timings)}

It is written atomically to the progress file (if any) and POSTed with
``Content-Type: application/json`` to the URL (flag ``--progress-url`` or env
``DL2D_PROGRESS_URL``) from a background thread with a short timeout; errors
(daemon down, timeouts) are counted and otherwise ignored: training never fails
because of reporting. The JSON is strict: a non-finite number (NaN, infinity)
is written as ``null``. What the coordinator reports was checked first
(:func:`dl2d.elastic.guards.check_progress`).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import urllib.request

from dl2d.core.files import write_atomic


def finite_json(obj):
    """``obj`` with every non-finite float replaced by None (strict JSON has no NaN or infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def dumps(rec: dict) -> str:
    try:
        return json.dumps(rec, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(finite_json(rec), default=str, allow_nan=False)


class ProgressReporter:
    def __init__(self, url: str | None = None, path: str | None = None, interval: float = 1.0,
                 timeout: float = 2.0):
        self.url = url if url is not None else os.environ.get("DL2D_PROGRESS_URL") or None
        self.path = path
        self.interval = interval
        self.timeout = timeout
        self.failures = 0
        self.sent = 0
        self._last = 0.0
        self._lock = threading.Lock()
        self.last: dict | None = None

    def report(self, rec: dict, force: bool = False) -> bool:
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last < self.interval:
                return False
            self._last = now
            self.last = rec
        body = dumps(rec)
        if self.path:
            try:
                write_atomic(self.path, body, fsync=False)
            except OSError:
                self.failures += 1
        if self.url:
            threading.Thread(target=self._post, args=(body,), daemon=True).start()
        return True

    def _post(self, body: str) -> None:
        try:
            req = urllib.request.Request(self.url, data=body.encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                r.read()
            self.sent += 1
        except Exception:
            self.failures += 1
