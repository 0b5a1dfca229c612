"""dl2d.core.files: an atomic write replaces the file whole, leaves nothing behind, and on an error leaves the
old file as it was."""
from __future__ import annotations

import json
import os

import pytest

from dl2d.core.files import atomic_open, write_atomic, write_json_atomic


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
