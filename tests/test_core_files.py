"""dl2d.core.files: an atomic write replaces the file whole, leaves nothing behind, and on an error leaves the
old file as it was; a bounded read refuses what is no regular file or is over its bound, reading no more than
the bound; an .npz is checked from what it declares before anything of it is decompressed."""
from __future__ import annotations

import json
import os

import pytest

from dl2d.core.files import (
    MAX_TOML_BYTES,
    InputFileError,
    NpzArchive,
    NpzError,
    SecretFileError,
    TomlFileError,
    atomic_open,
    ensure_secret_file,
    file_kind,
    npy_problem,
    read_bounded,
    read_secret_file,
    read_toml_file,
    write_atomic,
    write_json_atomic,
    zip_directory_problem,
)


def test_write_replaces_whole_files_with_plain_permissions(tmp_path):
    p = tmp_path / "sub" / "state.json"
    write_json_atomic(p, {"a": 1})
    assert json.loads(p.read_text()) == {"a": 1}
    write_atomic(p, b"\x00\x01", fsync=False)
    assert p.read_bytes() == b"\x00\x01"
    umask = os.umask(0)
    os.umask(umask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(x.name for x in p.parent.iterdir()) == ["state.json"]  # no temporary file left


def test_an_error_while_writing_keeps_the_old_file(tmp_path):
    p = tmp_path / "ckpt"
    write_atomic(p, "old")
    with pytest.raises(RuntimeError):
        with atomic_open(p) as f:
            f.write("half of the new")
            raise RuntimeError("killed mid-write")
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["ckpt"]
    with pytest.raises(ValueError, match="mode 'w' or 'wb'"):
        with atomic_open(p, "a"):
            pass


@pytest.mark.parametrize("content, message", [
    (b"x = " + b"9" * 5000 + b"\n", "is not valid TOML"),  # Python refuses to convert over 4300 digits
    (b"x = " + b"[" * 100000 + b"]" * 100000 + b"\n", "is not valid TOML"),
    (b"x = \xff\xfe\n", "is not UTF-8 text"),
    (b"x = = 1\n", "is not valid TOML"),
    (b"# " + b"a" * (MAX_TOML_BYTES + 10) + b"\n", "is larger than"),
])
def test_a_toml_file_that_is_not_a_config_is_one_clear_error(tmp_path, content, message):
    p = tmp_path / "dl2d.toml"
    p.write_bytes(content)
    with pytest.raises(TomlFileError, match=message) as e:
        read_toml_file(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_a_missing_toml_file_is_none_and_a_good_one_its_table(tmp_path):
    assert read_toml_file(tmp_path / "missing.toml") is None
    (tmp_path / "ok.toml").write_text('state_dir = "/srv"\n[sim]\ncluster = "tiny"\n')
    assert read_toml_file(tmp_path / "ok.toml") == {"state_dir": "/srv", "sim": {"cluster": "tiny"}}
    with pytest.raises(TomlFileError, match="cannot read"):
        read_toml_file(tmp_path)  # a directory


def test_a_secret_file_is_made_once_with_mode_0600_and_two_makers_agree(tmp_path):
    import threading

    p = tmp_path / "d" / "job.secret"
    got: list[str] = []
    ts = [threading.Thread(target=lambda: got.append(ensure_secret_file(p))) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(set(got)) == 1 and len(got[0]) == 64  # one winner; everyone reads its secret
    assert p.stat().st_mode & 0o777 == 0o600 and os.listdir(p.parent) == ["job.secret"]
    assert read_secret_file(p) == got[0] == ensure_secret_file(p)


@pytest.mark.parametrize("content, mode, message", [
    ("x" * 64, 0o644, r"mode 0644; it must not be accessible by group or others \(run: chmod 600"),
    ("x" * 64, 0o604, "must not be accessible by group or others"),
    ("  \n", 0o600, "is empty"),
    ("short", 0o600, "holds a 5-character token; use at least 16"),
    ("x" * 5000, 0o600, "larger than 4096 bytes"),
    (b"\xff" * 20, 0o600, "not UTF-8"),
])
def test_a_secret_file_that_is_not_private_or_not_a_secret_is_one_clear_error(tmp_path, content, mode, message):
    p = tmp_path / "s"
    (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)
    p.chmod(mode)
    with pytest.raises(SecretFileError, match=message) as e:
        read_secret_file(p, what="job secret file")
    assert str(e.value).startswith(("job secret file", "cannot read job secret file")) and "\n" not in str(e.value)


def test_a_secret_file_owned_by_another_user_or_not_a_file_is_refused(tmp_path):
    p = tmp_path / "s"
    p.write_text("x" * 64)
    p.chmod(0o600)
    assert read_secret_file(p, owners=(os.geteuid(),)) == "x" * 64
    with pytest.raises(SecretFileError, match="must be owned by root or the agent's user"):
        read_secret_file(p, owners=(os.geteuid() + 1,), owner_desc="the agent's user")
    with pytest.raises(SecretFileError, match="cannot read secret file"):
        read_secret_file(tmp_path / "missing")
    with pytest.raises(SecretFileError, match="is not a regular file"):
        os.mkfifo(tmp_path / "fifo", 0o600)
        read_secret_file(tmp_path / "fifo")  # (a FIFO: refused without blocking on it)
    (tmp_path / "link").symlink_to(p)
    assert read_secret_file(tmp_path / "link") == "x" * 64
    with pytest.raises(SecretFileError, match="symbolic link"):
        read_secret_file(tmp_path / "link", follow_symlinks=False)


# ---------------------------------------------------------------- bounded reads

def _traced_peak(fn) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_bounded_read_returns_a_regular_files_bytes_costing_its_size_not_the_bound(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 50_000)
    assert read_bounded(p, 50_000) == b"x" * 50_000
    assert _traced_peak(lambda: read_bounded(p, 2 ** 30)) < 120_000  # one buffer of the file's size
    p.write_bytes(b"")
    assert read_bounded(p, 0) == b""
    assert len(read_bounded("/proc/self/status", 1 << 20)) > 0  # a file whose size reads 0 is read to its end


def _socket(path):
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


@pytest.mark.parametrize("make, kind", [
    (lambda p: os.mkfifo(p), "a named pipe (FIFO)"),
    (lambda p: p.symlink_to("/dev/zero"), "a character device"),
    (lambda p: p.mkdir(), "a directory"),
    (_socket, "a socket"),
], ids=["fifo", "device", "directory", "socket"])
def test_what_is_no_regular_file_is_refused_at_once_naming_what_it_is(tmp_path, make, kind):
    p = tmp_path / "input"
    keep = make(p)  # noqa: F841 (a socket stays bound while it is open)
    with pytest.raises(InputFileError) as e:
        read_bounded(p, 1024)
    assert str(e.value) == f"{p}: it is {kind}, not a regular file" and e.value.kind == kind
    with pytest.raises(TomlFileError, match=f"cannot read {p}: it is {kind.replace('(', '.').replace(')', '.')}"):
        read_toml_file(p)


def test_a_missing_file_and_one_over_the_bound(tmp_path):
    with pytest.raises(InputFileError) as e:
        read_bounded(tmp_path / "nope", 10)
    assert e.value.missing and "No such file" in str(e.value)
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(2 ** 40)  # sparse: a terabyte that takes no disk, refused from its size alone
    with pytest.raises(InputFileError) as e:
        read_bounded(big, 1024)
    assert e.value.too_large and str(e.value) == f"{big}: larger than 1024 bytes (it has {2 ** 40})"


def test_a_file_that_holds_more_than_it_says_is_read_only_to_the_bound(tmp_path, monkeypatch):
    """A file that grows while it is read, or a file system that reports a wrong size: the read stops at the
    bound's next byte, whatever the size said."""
    p = tmp_path / "f"
    p.write_bytes(b"y" * (4 << 20))
    real = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((*real(fd)[:6], 10, *real(fd)[7:])))
    with pytest.raises(InputFileError) as e:
        read_bounded(p, 1 << 20)
    assert e.value.too_large
    assert read_bounded(p, 4 << 20) == b"y" * (4 << 20)


def test_file_kind_names_what_a_mode_is():
    import stat

    assert file_kind(stat.S_IFREG | 0o644) is None
    assert file_kind(stat.S_IFIFO) == "a named pipe (FIFO)" and file_kind(stat.S_IFBLK) == "a block device"


# ---------------------------------------------------------------- .npz archives

def _npz(**arrays) -> bytes:
    import io

    import numpy as np

    b = io.BytesIO()
    np.savez_compressed(b, **arrays)
    return b.getvalue()


def test_an_npz_reads_back_what_numpy_wrote_checked_against_what_the_caller_wants():
    import numpy as np

    z = NpzArchive(_npz(a=np.arange(6.0).reshape(2, 3), f=np.asfortranarray(np.ones((3, 2))), s=np.array("hi"),
                        v=np.array(7)))
    assert sorted(z.names) == ["a", "f", "s", "v"]
    np.testing.assert_array_equal(z.array("a", 1024, (2, 3)), np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(z.array("f", 1024), np.ones((3, 2)))
    assert z.text("s", 1024) == "hi" and z.integer("v") == 7
    for args, message in [(("a", 1024, (3, 2)), "a: shape (2, 3), expected (3, 2)"),
                          (("a", 100), "a: 176 bytes uncompressed, more than the 100 allowed"),
                          (("v", 1024), "v: dtype <i8 (want float)"),
                          (("zz", 1024), "zz missing")]:
        with pytest.raises(NpzError) as e:
            z.array(*args)
        assert str(e.value) == message


def test_an_npz_of_nan_is_refused_unless_the_caller_allows_it():
    import numpy as np

    z = NpzArchive(_npz(a=np.array([1.0, np.nan])))
    with pytest.raises(NpzError, match="a holds NaN or infinite values"):
        z.array("a", 1024)
    assert np.isnan(z.array("a", 1024, finite=False)[1])


def test_npy_problem_judges_a_header_against_the_declared_size():
    import numpy as np

    f8 = np.dtype("<f8")
    assert npy_problem((10,), f8, 128, 208, 1000) is None
    assert npy_problem((10,), f8, 128, 208, 200) == "208 bytes (shape (10,) of <f8), more than the 200 allowed"
    assert npy_problem((10,), f8, 128, 9999, 100000) == "its header says 208 bytes, the archive 9999"
    assert npy_problem((10 ** 12,), np.dtype("<U100"), 128, 208, 10 ** 6, kinds="U").startswith(
        "400000000000128 bytes")
    assert npy_problem((), np.dtype("O"), 128, 136, 1000) == "dtype |O (want float)"
    assert npy_problem((), np.dtype([("x", "<f8")]), 128, 136, 1000, kinds="fV").startswith("dtype")


def test_a_zip_directory_is_bounded_before_zipfile_parses_it():
    import numpy as np

    assert zip_directory_problem(_npz(a=np.zeros(1))) is None
    assert zip_directory_problem(b"") == "not a zip archive (too short)"
    assert zip_directory_problem(b"\0" * 100) == "not a zip archive (no end of central directory)"
    eocd = b"PK\x05\x06" + bytes(4) + (300).to_bytes(2, "little") * 2 + (300 * 46).to_bytes(4, "little") + bytes(6)
    assert zip_directory_problem(eocd) == "300 members, more than the 256 this file may have"
    eocd = b"PK\x05\x06" + bytes(4) + (3).to_bytes(2, "little") * 2 + (10 ** 9).to_bytes(4, "little") + bytes(6)
    assert zip_directory_problem(eocd) == "a zip directory of 1000000000 bytes, more than 256 members need"
