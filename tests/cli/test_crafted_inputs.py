"""Files that are no files, given to the command line, fail at once with one line (docs/security.md).

A FIFO given as a config, a trace, a speed model or a checkpoint used to hang the command (opening a FIFO for
reading waits for a writer), and ``dl2ctl sim --speed-model /dev/zero`` read until it held 2.5 GB (a device's
size reads 0, so the size check passed). Every file input is now read with dl2d.core.files.read_bounded, which
refuses anything but a regular file before reading it. The commands run as subprocesses, so a regression is a
timeout (the hang guard) rather than a hung test run.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: A guard against a hang, not a measurement: each command below fails in about a second.
HANG_GUARD_S = 60


def run(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DL2D_")}
    base["DL2D_CONFIG"] = str(tmp_path / "no-such-config.toml")
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=HANG_GUARD_S,
                          cwd=tmp_path, env={**base, **(env or {})})


def error_line(r: subprocess.CompletedProcess) -> str:
    """The one error line a command printed (click's usage lines aside), checked to be the only one."""
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    lines = [line for line in r.stderr.splitlines() if line.startswith(("Error:", "dl2d:"))]
    assert len(lines) == 1, out
    return lines[0]


@pytest.fixture
def fifo(tmp_path) -> Path:
    os.mkfifo(tmp_path / "fifo.json")
    return tmp_path / "fifo.json"


FIFO = "it is a named pipe (FIFO), not a regular file"
DEVICE = "it is a character device, not a regular file"


@pytest.mark.parametrize("args, code, parts", [
    (["dl2d.cli.main", "sim", "--trace", "{fifo}"], 2, ["--trace", "cannot read trace", FIFO]),
    (["dl2d.cli.main", "sim", "--jobs", "20", "--speed-model", "{fifo}"], 2, ["--speed-model", "cannot read it",
                                                                              FIFO]),
    (["dl2d.cli.main", "sim", "--policy", "chic", "--checkpoint", "{fifo}"], 1, ["cannot read checkpoint", FIFO]),
    (["dl2d.cli.main", "train", "--init", "{fifo}", "--out", "p.msgpack"], 2, ["--init", FIFO]),
    (["dl2d.daemon.main", "--check-config", "--config", "{fifo}"], 2, ["dl2d: config error: cannot read", FIFO]),
], ids=["sim-trace", "sim-speed-model", "sim-checkpoint", "train-init", "daemon-config"])
def test_a_fifo_given_as_an_input_file_fails_at_once_naming_it(tmp_path, fifo, args, code, parts):
    r = run([a.replace("{fifo}", str(fifo)) for a in args], tmp_path)
    assert r.returncode == code, r.stdout + r.stderr
    line = error_line(r)
    for part in (str(fifo), *parts):
        assert part in line, line


def test_a_fifo_as_a_job_spec_an_agents_file_or_a_status_file_fails_at_once(tmp_path, fifo):
    r = run(["dl2d.cli.main", "submit", str(fifo)], tmp_path)
    assert r.returncode == 1 and f"job spec {fifo}: {FIFO}" in error_line(r)
    (tmp_path / "dl2d.toml").write_text(f'[agents]\nfile = "{fifo}"\n')
    r = run(["dl2d.daemon.main", "--config", str(tmp_path / "dl2d.toml"), "--sim", "--slots", "1", "--no-metrics",
             "--state-dir", str(tmp_path / "daemon")], tmp_path)
    assert r.returncode == 2 and f"agents.file {fifo}: {FIFO}" in error_line(r)
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "dl2d.status.json")
    r = run(["dl2d.cli.main", "daemon", "status", "--state-dir", str(state)], tmp_path,
            {"DL2D_SOCKET": str(tmp_path / "none.sock")})
    assert r.returncode == 1 and f"{state / 'dl2d.status.json'}: {FIFO}" in error_line(r)


def test_a_fifo_as_the_config_of_a_dl2ctl_command_fails_at_once(tmp_path, fifo):
    r = run(["dl2d.cli.main", "queue"], tmp_path, {"DL2D_CONFIG": str(fifo)})
    assert r.returncode == 1 and f"config file: cannot read {fifo}: {FIFO}" in error_line(r)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
@pytest.mark.parametrize("args, parts", [
    (["sim", "--jobs", "20", "--speed-model", "/dev/zero"], ["--speed-model", "/dev/zero: cannot read it", DEVICE]),
    (["sim", "--trace", "{zero}"], ["--trace", "cannot read trace", DEVICE]),
], ids=["speed-model", "trace"])
def test_dev_zero_as_an_input_file_is_refused_unread(tmp_path, args, parts):
    """The review's ``dl2ctl sim --speed-model /dev/zero`` held 2.49 GB after 10 s; now nothing is read."""
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    r = run(["dl2d.cli.main", *[a.replace("{zero}", str(tmp_path / "zero.json")) for a in args]], tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    line = error_line(r)
    for part in parts:
        assert part in line, line
