"""Checkpoints a job can trust to be whole: each one is written into a hidden temporary directory and renamed
into place (``step_<n>``) only when complete, with a marker file written last. :meth:`Checkpoints.latest` only
ever returns such a one, so a run killed mid-write resumes from the checkpoint before.

For state every process holds whole (data-parallel replicas), rank 0 saves and every rank reads. Frameworks
with their own manager keep their own layout (orbax's ``CheckpointManager`` does the same dance: the
example job uses it).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

#: A complete checkpoint holds this file, written after everything else.
MARKER = "dl2d-complete.json"
_STEP_DIR = re.compile(r"step_(\d{1,18})\Z")


@dataclass(frozen=True)
class Checkpoint:
    step: int  # the global step it holds: steps 1..step are done
    path: Path  # its directory


class Checkpoints:
    """The complete checkpoints under ``directory``; keeps the newest ``keep`` of them."""

    def __init__(self, directory: str | os.PathLike, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep

    def path(self, step: int) -> Path:
        return self.directory / f"step_{int(step):012d}"

    def all(self) -> list[Checkpoint]:
        """The complete checkpoints, oldest first (a directory without its marker is not one)."""
        found = []
        try:
            entries = list(self.directory.iterdir())
        except FileNotFoundError:
            return []
        for p in entries:
            m = _STEP_DIR.match(p.name)
            if m and (p / MARKER).is_file():
                found.append(Checkpoint(int(m.group(1)), p))
        return sorted(found, key=lambda c: c.step)

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint; None when there is none (start from step 0)."""
        done = self.all()
        return done[-1] if done else None

    @contextmanager
    def save(self, step: int) -> Iterator[Path]:
        """``with ckpts.save(step) as d: write files into d``: ``d`` becomes ``step_<step>`` when the block
        ends without an error (its files fsynced, the marker last); on an error it is removed and nothing
        changes. Older checkpoints beyond ``keep`` are removed after."""
        if step < 0:
            raise ValueError(f"a checkpoint's step is >= 0, got {step}")
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".step_{int(step):012d}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        tmp.mkdir()
        try:
            yield tmp
            for f in tmp.rglob("*"):
                if f.is_file():
                    _fsync(f)
            marker = tmp / MARKER
            marker.write_text(json.dumps({"step": int(step), "time": time.time()}))
            _fsync(marker)
            final = self.path(step)
            if final.exists():  # saved again at the same step (a rerun): the new one wins
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune()

    def prune(self) -> None:
        """Remove all but the newest ``keep`` complete checkpoints, and temporary directories of writers
        that are gone (a run killed mid-write)."""
        for old in self.all()[:-self.keep]:
            shutil.rmtree(old.path, ignore_errors=True)
        for p in self.directory.glob(".step_*.tmp"):
            pid = p.name.split(".")[2] if p.name.count(".") >= 3 else ""
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        _fsync(path)
    except OSError:
        pass  # some file systems cannot sync a directory; the rename is still atomic
