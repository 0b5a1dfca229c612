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


#: A config file is a few kilobytes; one of a megabyte is not one (and parsing it costs what it costs).
MAX_TOML_BYTES = 1024 * 1024


class TomlFileError(ValueError):
    """A TOML file that cannot be read or is not valid TOML: the message says which and why."""


def read_toml_file(path: str | os.PathLike) -> dict[str, Any] | None:
    """The TOML file's table; None when it does not exist. TomlFileError (one line) for anything else: a file
    that cannot be read, is larger than MAX_TOML_BYTES, is not UTF-8, is not valid TOML, or holds an integer
    too long to convert (Python refuses more than 4300 digits) or nesting too deep to parse."""
    import tomllib

    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_TOML_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TomlFileError(f"cannot read {p}: {e.strerror or e}") from None
    if len(data) > MAX_TOML_BYTES:
        raise TomlFileError(f"{p} is larger than {MAX_TOML_BYTES} bytes: not a config file")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise TomlFileError(f"{p} is not UTF-8 text (byte {e.start})") from None
    except (ValueError, RecursionError) as e:  # TOMLDecodeError is a ValueError; so is a 5000-digit integer's
        raise TomlFileError(f"{p} is not valid TOML: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
            from None
