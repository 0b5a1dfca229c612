"""dl2d.job.checkpoints: only whole checkpoints are ever resumed from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from dl2d.job import Checkpoints
from dl2d.job.checkpoints import MARKER


def test_the_latest_complete_checkpoint_is_found_and_old_ones_pruned(tmp_path):
    ck = Checkpoints(tmp_path, keep=2)
    assert ck.latest() is None
    for step in (10, 20, 30):
        with ck.save(step) as d:
            (d / "state.bin").write_bytes(bytes([step]) * 100)
    assert [c.step for c in ck.all()] == [20, 30]
    latest = ck.latest()
    assert latest.step == 30 and (latest.path / "state.bin").read_bytes() == bytes([30]) * 100


def test_a_save_that_fails_leaves_the_previous_checkpoint_and_no_debris(tmp_path):
    ck = Checkpoints(tmp_path)
    with ck.save(5) as d:
        (d / "a").write_text("five")
    with pytest.raises(RuntimeError):
        with ck.save(6) as d:
            (d / "a").write_text("half of six")
            raise RuntimeError("disk full")
    assert ck.latest().step == 5 and sorted(p.name for p in tmp_path.iterdir()) == ["step_000000000005"]


def test_a_directory_without_its_marker_is_not_a_checkpoint(tmp_path):
    ck = Checkpoints(tmp_path)
    with ck.save(5) as d:
        (d / "a").write_text("five")
    (tmp_path / "step_000000000009").mkdir()  # someone wrote straight into a step directory
    (tmp_path / "step_000000000009" / "a").write_text("nine, maybe")
    assert ck.latest().step == 5


WRITER = """
import sys, time
from dl2d.job import Checkpoints
ck = Checkpoints(sys.argv[1])
with ck.save(1) as d:
    (d / "a").write_text("one")
with ck.save(2) as d:
    (d / "a").write_text("two, first half")
    print("writing", flush=True)
    time.sleep(60)
"""


def test_a_checkpoint_cut_off_mid_write_is_never_resumed_from(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    os.kill(p.pid, signal.SIGKILL)  # killed inside the save of step 2
    p.wait(10)
    ck = Checkpoints(tmp_path)
    latest = ck.latest()
    assert latest.step == 1 and (latest.path / "a").read_text() == "one"
    assert any(x.name.endswith(".tmp") for x in tmp_path.iterdir())  # the half-written one is there ...
    with ck.save(2) as d:
        (d / "a").write_text("two")
    assert not any(x.name.endswith(".tmp") for x in tmp_path.iterdir())  # ... until the next save clears it
    assert not any((x / MARKER).exists() is False for x in tmp_path.iterdir())
    assert ck.latest().step == 2


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="keep must be at least 1"):
        Checkpoints(tmp_path, keep=0)
    with pytest.raises(ValueError, match="step is >= 0"):
        with Checkpoints(tmp_path).save(-1):
            pass
