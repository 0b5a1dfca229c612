"""dl2d.core.files: an atomic write replaces the file whole, leaves nothing behind, and on an error leaves the
old file as it was."""
from __future__ import annotations

import json
import os

import pytest

from dl2d.core.files import (
    MAX_TOML_BYTES,
    SecretFileError,
    TomlFileError,
    atomic_open,
    ensure_secret_file,
    read_secret_file,
    read_toml_file,
    write_atomic,
    write_json_atomic,
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
