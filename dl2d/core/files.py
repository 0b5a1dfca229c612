"""Atomic file writes: a reader (another process, a daemon restarted after kill -9) sees the old file or the new
one, never a partial one. The data goes to a temporary file beside the target (same file system), is flushed
(and fsynced, with the directory after the rename, unless the caller says a power loss does not matter), then
renamed over the target; on an error
the temporary file is removed and the target is untouched. New files get the usual permissions (0666 less the
umask), as a plain ``open`` would give them, unless the caller asks for fewer (``mode``).

Secret files (a node agent's token, an elastic job's secret): :func:`read_secret_file` refuses one that group
or others can access; :func:`ensure_secret_file` creates one (0600, atomically) unless it exists.
"""
from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any, Iterator


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", *, fsync: bool = True,
                perms: int = 0o666) -> Iterator[IO]:
    """``with atomic_open(path, "wb") as f: ...``: write ``f``; ``path`` is replaced when the block ends. ``perms``:
    the new file's permission bits (less the umask)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, perms)
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


def write_atomic(path: str | os.PathLike, data: str | bytes, *, fsync: bool = True, perms: int = 0o666) -> None:
    """Replace ``path`` with ``data`` (text or bytes) atomically (``perms``: the new file's permission bits)."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", fsync=fsync, perms=perms) as f:
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


#: The shortest secret accepted: a guessable one is no authentication.
MIN_SECRET_CHARS = 16
#: A secret file is one line; a larger file is not one.
MAX_SECRET_BYTES = 4096


class SecretFileError(Exception):
    """A secret file that is missing, unreadable, empty, too short or that group or others can access."""


def read_secret_file(path: str | os.PathLike, *, what: str = "secret file",
                     owners: tuple[int, ...] | None = None, owner_desc: str = "the user running this process",
                     follow_symlinks: bool = True) -> str:
    """The secret in ``path`` (stripped), refusing a file that is not a regular file of mode 0600 or 0400, is
    owned by someone other than root or this process's user (``owners``: the uids allowed; ``()`` allows any),
    is empty, shorter than MIN_SECRET_CHARS or larger than MAX_SECRET_BYTES. The checks are made on the opened
    file (no race with a rename); ``follow_symlinks=False`` refuses a symbolic link. SecretFileError (one line,
    naming ``what`` and the path) says what is wrong."""
    owners = (0, os.geteuid()) if owners is None else owners
    flags = os.O_RDONLY | (0 if follow_symlinks else os.O_NOFOLLOW) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        why = "it is a symbolic link" if e.errno == errno.ELOOP and not follow_symlinks else e.strerror
        raise SecretFileError(f"cannot read {what} {path}: {why}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError(f"{what} {path} is not a regular file")
        if st.st_mode & 0o077:
            raise SecretFileError(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must not be "
                                  f"accessible by group or others (run: chmod 600 {path})")
        if owners and st.st_uid not in owners:
            raise SecretFileError(f"{what} {path} must be owned by root or {owner_desc}")
        data = f.read(MAX_SECRET_BYTES + 1)
    if len(data) > MAX_SECRET_BYTES:
        raise SecretFileError(f"{what} {path} is larger than {MAX_SECRET_BYTES} bytes: not a secret file")
    try:
        secret = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise SecretFileError(f"{what} {path} is not UTF-8 text") from None
    if not secret:
        raise SecretFileError(f"{what} {path} is empty")
    if len(secret) < MIN_SECRET_CHARS:
        raise SecretFileError(f"{what} {path} holds a {len(secret)}-character token; use at least "
                              f"{MIN_SECRET_CHARS} (e.g. openssl rand -hex 32 > {path})")
    return secret


def ensure_secret_file(path: str | os.PathLike, *, what: str = "secret file", owners: tuple[int, ...] | None = None,
                       follow_symlinks: bool = True) -> str:
    """The secret in ``path``, first created there when there is none: ``secrets.token_hex(32)``, mode 0600,
    written whole to a temporary file and linked into place, so a reader sees no file or the whole secret, and
    of two writers one wins and both return its secret. An existing file is kept (a job's secret stays the same
    across its restarts) and read back with :func:`read_secret_file`'s checks (``owners``, ``follow_symlinks``)."""
    path = Path(path)
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # fails if another writer got there first: theirs is kept
            except FileExistsError:
                pass
        finally:
            with suppress(FileNotFoundError):
                os.unlink(tmp)
    return read_secret_file(path, what=what, owners=owners, follow_symlinks=follow_symlinks)
