"""Atomic file writes: a reader (another process, a daemon restarted after kill -9) sees the old file or the new
one, never a partial one. The data goes to a temporary file beside the target (same file system), is flushed
(and fsynced, with the directory after the rename, unless the caller says a power loss does not matter), then
renamed over the target; on an error
the temporary file is removed and the target is untouched. New files get the usual permissions (0666 less the
umask), as a plain ``open`` would give them.
"""
from __future__ import annotations

import json
import os
import secrets
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any, Iterator


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", *, fsync: bool = True) -> Iterator[IO]:
    """``with atomic_open(path, "wb") as f: ...``: write ``f``; ``path`` is replaced when the block ends."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if fsync:  # the rename itself survives a power loss once the directory is on disk (where it can be synced)
        with suppress(OSError):
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def write_atomic(path: str | os.PathLike, data: str | bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` (text or bytes) atomically."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", fsync=fsync) as f:
        f.write(data)


def write_json_atomic(path: str | os.PathLike, doc: Any, *, fsync: bool = True, **dumps_kw) -> None:
    """Replace ``path`` with ``doc`` as JSON atomically (``dumps_kw`` go to ``json.dumps``)."""
    write_atomic(path, json.dumps(doc, **dumps_kw), fsync=fsync)
