"""Atomic file writes: a reader (another process, a daemon restarted after kill -9) sees the old file or the new
one, never a partial one. The data goes to a temporary file beside the target (same file system), is flushed
(and fsynced, with the directory after the rename, unless the caller says a power loss does not matter), then
renamed over the target; on an error
the temporary file is removed and the target is untouched. New files get the usual permissions (0666 less the
umask), as a plain ``open`` would give them, unless the caller asks for fewer (``mode``).

Secret files (a node agent's token, an elastic job's secret): :func:`read_secret_file` refuses one that group
or others can access; :func:`ensure_secret_file` creates one (0600, atomically) unless it exists.

Bounded reads: every file dl2d is handed (configs, traces, speed models, checkpoints, learned tables) is read with
:func:`read_bounded`, so none can hang the process (a FIFO), feed it forever (a device such as ``/dev/zero``,
whose size reads 0) or make it allocate more than the caller's bound. An ``.npz`` (numpy's zip of ``.npy``
members) is then read with :class:`NpzArchive`, which checks what the archive declares (its directory, each
member's uncompressed size and ``.npy`` header) before it decompresses anything, so a small zip bomb costs
nothing to refuse.
"""
from __future__ import annotations

import errno
import io
import json
import os
import secrets
import stat
import struct
import zipfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any, Callable, Iterator


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
    that cannot be read or is no regular file (:func:`read_bounded`), is larger than MAX_TOML_BYTES, is not
    UTF-8, is not valid TOML, or holds an integer too long to convert (Python refuses more than 4300 digits) or
    nesting too deep to parse."""
    import tomllib

    p = Path(path)
    try:
        data = read_bounded(p, MAX_TOML_BYTES)
    except InputFileError as e:
        if e.missing:
            return None
        if e.too_large:
            raise TomlFileError(f"{p} is larger than {MAX_TOML_BYTES} bytes: not a config file") from None
        raise TomlFileError(f"cannot read {p}: {e.reason}") from None
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
    try:
        fd, st = _open_regular(path, follow_symlinks)
    except InputFileError as e:
        if e.kind:
            raise SecretFileError(f"{what} {path} is not a regular file: it is {e.kind}") from None
        raise SecretFileError(f"cannot read {what} {path}: {e.reason}") from None
    with os.fdopen(fd, "rb") as f:
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


# ------------------------------------------------------------------------------------------ bounded file inputs

class LockHeld(Exception):
    """Another process holds the lock file; ``pid`` is what it wrote there ("unknown" when nothing)."""

    def __init__(self, path, pid: str):
        super().__init__(f"{path} is held by pid {pid}")
        self.path, self.pid = str(path), pid


def hold_lock(path: str | os.PathLike) -> IO:
    """An exclusive lock on the file ``path`` (made if missing), held while the returned open file is: this
    process's pid is written in it. LockHeld names the holder's pid when another process has it; OSError when the
    file cannot be opened. One daemon per state dir is this rule."""
    import fcntl

    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "unknown"
        f.close()
        raise LockHeld(path, pid) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


class InputFileError(ValueError):
    """A file input that cannot be read, is no regular file or is larger than its bound. The message is one line
    naming the path; ``reason`` is why in a few words (for callers that word their own error), ``missing`` says
    the file does not exist, ``kind`` what it is when it is no regular file ("a named pipe (FIFO)", "a
    character device", "a directory", "a socket"), ``too_large`` that it is over the bound."""

    def __init__(self, path, reason: str, *, missing: bool = False, kind: str | None = None,
                 too_large: bool = False):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason
        self.missing, self.kind, self.too_large = missing, kind, too_large


_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str | None:
    """What a file of ``mode`` (its ``st_mode``) is when it is no regular file, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def _open_regular(path: str | os.PathLike, follow_symlinks: bool = True) -> tuple[int, os.stat_result]:
    """(descriptor, its fstat) of ``path`` opened for reading, refusing what is no regular file.

    O_NONBLOCK: opening a FIFO for reading waits for a writer without it (and a FIFO is then refused, never
    read). The checks are made on the open descriptor, so a rename between the check and the read changes
    nothing."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | \
        (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise InputFileError(path, e.strerror, missing=True) from None
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise InputFileError(path, "it is a symbolic link") from None
        kind = None
        if e.errno == errno.ENXIO:  # a socket cannot be opened: say what it is
            with suppress(OSError):
                kind = file_kind(os.stat(path).st_mode)
        if kind:
            raise InputFileError(path, f"it is {kind}, not a regular file", kind=kind) from None
        raise InputFileError(path, e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        kind = file_kind(st.st_mode)
        if kind:
            raise InputFileError(path, f"it is {kind}, not a regular file", kind=kind)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


#: Bytes read at a time beyond what a file said it holds (a growing file, /proc's files of size 0).
_CHUNK = 1024 * 1024


#: What a ``head_check`` of :func:`read_bounded` is shown of a file: its first bytes, where a checkpoint keeps
#: its format, version and config.
HEAD_BYTES = 64 * 1024


def read_bounded(path: str | os.PathLike, max_bytes: int,
                 head_check: Callable[[bytes, int], int | None] | None = None) -> bytes:
    """The bytes of the regular file ``path``, of which there may be at most ``max_bytes``; InputFileError (one
    line naming the path and what is wrong) for a missing or unreadable file, one that is no regular file (a
    FIFO would block, a device like /dev/zero never ends and says it is empty, a directory is no input) or one
    larger than the bound.

    A file whose size is over the bound is refused before anything is read; then no more than ``max_bytes + 1``
    bytes are read, so a file that grows while it is read, or says the wrong size, is still bounded. The read
    asks for the size the file states, so a small file costs a buffer of its own size, not of the bound.

    ``head_check(head, size)``, when given, sees the file's first HEAD_BYTES and its size before the rest is
    read: it raises (the caller's own error) to refuse the file, or returns a tighter bound (a checkpoint's
    config says how large its arrays can be, so a large file asking for a small network is refused after 64 KiB,
    not after reading it all), or None."""
    fd, st = _open_regular(path)
    with os.fdopen(fd, "rb", buffering=0) as f:
        if st.st_size > max_bytes:
            raise InputFileError(path, f"larger than {max_bytes} bytes (it has {st.st_size})", too_large=True)
        if head_check is not None:
            try:
                head = os.pread(fd, min(st.st_size, HEAD_BYTES), 0)
            except OSError as e:
                raise InputFileError(path, e.strerror or str(e)) from None
            tighter = head_check(head, st.st_size)
            del head
            if tighter is not None and tighter < max_bytes:
                max_bytes = tighter
                if st.st_size > max_bytes:
                    raise InputFileError(path, f"larger than {max_bytes} bytes (it has {st.st_size})",
                                         too_large=True)
        chunks: list[bytes] = []
        size = 0
        want = st.st_size + 1  # then 1 byte to find the end, or chunks while the file holds more than it said
        try:
            while size <= max_bytes and (chunk := f.read(min(want, max_bytes + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
                want = _CHUNK if len(chunk) == want else 1
        except OSError as e:
            raise InputFileError(path, e.strerror or str(e)) from None
    if size > max_bytes:
        raise InputFileError(path, f"larger than {max_bytes} bytes", too_large=True)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# ------------------------------------------------------------------------------------------ .npz archives

#: The most members an .npz dl2d reads may have (its files have a few to a few dozen).
MAX_NPZ_MEMBERS = 256
#: The longest .npy header read (numpy writes 128 bytes for a plain array; the format allows 4 GB).
MAX_NPY_HEADER = 4096
#: A zip's end-of-central-directory record: signature, disk numbers, entries (this disk, all), directory size
#: and offset, comment length.
_EOCD = struct.Struct("<4s4H2LH")
_EOCD_SIG, _ZIP64_LOCATOR_SIG = b"PK\x05\x06", b"PK\x06\x07"
#: A central directory entry is 46 bytes and a name; dl2d's member names are short.
_MAX_ENTRY_BYTES = 46 + 512


class NpzError(ValueError):
    """An .npz that is not what the caller reads: one line saying why (the caller names the file)."""


def zip_directory_problem(data: bytes, max_members: int = MAX_NPZ_MEMBERS) -> str | None:
    """What is wrong with an archive's end-of-central-directory record, read from the archive's last bytes
    (``data`` may be the whole archive or its tail of at least 22 + 65535 bytes), for an archive of at most
    ``max_members`` members; None when it is fine. zipfile builds an object for every directory entry, so the
    directory is bounded here first: its entry count and byte size, and no zip64 record (whose counts and sizes
    are 64-bit; no file dl2d reads needs one)."""
    at = len(data) - _EOCD.size
    if at < 0:
        return "not a zip archive (too short)"
    if data[at:at + 4] != _EOCD_SIG:  # a comment follows the record: search the last 64 KiB for it
        at = data.rfind(_EOCD_SIG, max(0, len(data) - _EOCD.size - 65535), at)
        if at < 0:
            return "not a zip archive (no end of central directory)"
    _, disk, dir_disk, count_here, count, dir_size, _, _ = _EOCD.unpack_from(data, at)
    if at >= 20 and data[at - 20:at - 16] == _ZIP64_LOCATOR_SIG or 0xFFFF in (count_here, count) or \
            dir_size == 0xFFFFFFFF:
        return "a zip64 archive: more members or bytes than this file may have"
    if disk or dir_disk or count_here != count:
        return "a multi-disk zip archive"
    if count > max_members:
        return f"{count} members, more than the {max_members} this file may have"
    if dir_size > max_members * _MAX_ENTRY_BYTES:
        return f"a zip directory of {dir_size} bytes, more than {max_members} members need"
    return None


def npy_header(prefix: bytes) -> tuple[tuple[int, ...], bool, Any, int]:
    """(shape, Fortran order, dtype, offset of the data) of the .npy whose first bytes are ``prefix``, parsed by
    numpy's own header reader on those bytes only (a header longer than MAX_NPY_HEADER is refused);
    ValueError when they are no .npy header."""
    import numpy as np

    f = io.BytesIO(prefix)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=MAX_NPY_HEADER)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=MAX_NPY_HEADER)
        else:
            raise ValueError(f"npy format version {version[0]}.{version[1]}")
    except ValueError:
        raise
    except Exception as e:  # numpy's parser of an untrusted header raises more than ValueError
        raise ValueError(f"{type(e).__name__}: {e}") from None
    return shape, fortran, dtype, f.tell()


def npy_problem(shape: tuple[int, ...], dtype, offset: int, declared: int, max_bytes: int,
                want_shape: tuple[int, ...] | None = None, kinds: str = "f") -> str | None:
    """What is wrong with an .npy member whose header says ``shape`` and ``dtype`` with its data at ``offset``,
    of ``declared`` uncompressed bytes in the archive's directory, for a caller that wants at most ``max_bytes``,
    the shape ``want_shape`` (any when None) and a dtype of one of numpy's ``kinds`` (``f`` float, ``i``/``u``
    integer, ``b`` bool, ``U`` text; never objects, records or sub-arrays); None when it is fine."""
    if dtype.kind not in kinds or dtype.fields is not None or dtype.subdtype is not None or dtype.hasobject:
        return f"dtype {dtype.str} (want {'/'.join(_KIND_NAMES.get(k, k) for k in kinds)})"
    if want_shape is not None and tuple(shape) != tuple(want_shape):
        return f"shape {tuple(shape)}, expected {tuple(want_shape)}"
    nbytes = dtype.itemsize
    for n in shape:
        nbytes *= n
    if offset + nbytes > max_bytes:
        return f"{offset + nbytes} bytes (shape {tuple(shape)} of {dtype.str}), more than the {max_bytes} allowed"
    if offset + nbytes != declared:
        return f"its header says {offset + nbytes} bytes, the archive {declared}"
    return None


_KIND_NAMES = {"f": "float", "i": "int", "u": "unsigned int", "b": "bool", "U": "text"}


class NpzArchive:
    """The members of an .npz held in memory (from :func:`read_bounded`), each read only when asked for and
    only after what the archive declares about it has been checked: the directory first (when the archive is
    opened), then the member's uncompressed size and its .npy header (dtype, shape, their size) against what
    the caller wants, before its data is decompressed. A zip bomb (a small member that inflates to gigabytes)
    is refused from its declared size; one that lies about its size is cut at the declared size (zipfile reads
    no further) and fails its CRC. Every failure is an NpzError of one line."""

    def __init__(self, data: bytes, max_members: int = MAX_NPZ_MEMBERS):
        problem = zip_directory_problem(data, max_members)
        if problem:
            raise NpzError(problem)
        try:
            self._zip = zipfile.ZipFile(io.BytesIO(data))
            infos = self._zip.infolist()
        except Exception as e:  # zipfile raises BadZipFile, ValueError, struct.error, ... on garbage
            raise NpzError(f"not a zip archive ({type(e).__name__})") from None
        self._members: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            name = info.filename
            if not name.endswith(".npy"):
                raise NpzError(f"member {name!r} is no .npy array")
            if name[:-4] in self._members:
                raise NpzError(f"member {name!r} appears twice")
            if info.flag_bits & 0x1:
                raise NpzError(f"member {name!r} is encrypted")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise NpzError(f"member {name!r} uses compression method {info.compress_type}")
            self._members[name[:-4]] = info

    @property
    def names(self) -> list[str]:
        return list(self._members)

    def declared_size(self, name: str) -> int:
        """The uncompressed size the directory declares for member ``name`` (KeyError if there is none)."""
        return self._members[name].file_size

    def array(self, name: str, max_bytes: int, shape: tuple[int, ...] | None = None, kinds: str = "f",
              finite: bool = True):
        """Member ``name`` as an array (NpzError when it is missing or :func:`npy_problem` finds a problem);
        ``finite``: a float array holding NaN or an infinity is refused too."""
        import numpy as np

        info = self._members.get(name)
        if info is None:
            raise NpzError(f"{name} missing")
        if info.file_size > max_bytes:
            raise NpzError(f"{name}: {info.file_size} bytes uncompressed, more than the {max_bytes} allowed")
        try:
            with self._zip.open(info) as f:
                prefix = f.read(min(info.file_size, 10 + MAX_NPY_HEADER))
                try:
                    shape_, fortran, dtype, offset = npy_header(prefix)
                except ValueError as e:
                    raise NpzError(f"{name}: not an .npy array ({str(e).splitlines()[0] if str(e) else e!r})") \
                        from None
                problem = npy_problem(shape_, dtype, offset, info.file_size, max_bytes, shape, kinds)
                if problem:
                    raise NpzError(f"{name}: {problem}")
                buf = bytearray(info.file_size - offset)
                got = len(prefix) - offset
                buf[:got] = prefix[offset:]
                view = memoryview(buf)
                while got < len(buf) and (chunk := f.read(min(_CHUNK, len(buf) - got))):
                    view[got:got + len(chunk)] = chunk
                    got += len(chunk)
                if got != len(buf) or f.read(1):
                    raise NpzError(f"{name}: holds {got} bytes of data, its header says {len(buf)}")
        except NpzError:
            raise
        except Exception as e:  # a bad CRC, a truncated or corrupt deflate stream
            raise NpzError(f"{name}: unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") \
                from None
        a = np.frombuffer(buf, dtype)
        a = a.reshape(shape_[::-1]).transpose() if fortran else a.reshape(shape_)
        if finite and dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise NpzError(f"{name} holds NaN or infinite values")
        return a

    def text(self, name: str, max_bytes: int) -> str:
        """Member ``name`` as the string it holds (a 0-d text array, as numpy saves a str)."""
        return str(self.array(name, max_bytes, (), "U").item())

    def integer(self, name: str) -> int:
        """Member ``name`` as the integer it holds (a 0-d integer array)."""
        return int(self.array(name, 1024, (), "iu").item())
