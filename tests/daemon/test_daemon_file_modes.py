"""The daemon's files are root's and its group's whatever umask it was started with (a shell's 022 left the
database, and every job's declared secrets in it, readable by any user), and two daemons never share a Slurm
state dir: the real `dl2d` process, the real user `nobody` (setpriv) as the reader."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dl2d.db.engine import DB_FILE_MODE, make_engine

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DL2D_", "SLURM_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.fixture
def open_dir():
    """A state dir others may pass through and list (0755), as /var/lib often is: the files must guard themselves."""
    d = Path(tempfile.mkdtemp(prefix="dl2d-modes-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_new_sqlite_database_is_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        make_engine(f"sqlite:///{tmp_path / 'x.sqlite'}").dispose()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "x.sqlite").st_mode) == DB_FILE_MODE == 0o640
    (tmp_path / "y.sqlite").write_bytes(b"")
    (tmp_path / "y.sqlite").chmod(0o600)  # an existing file keeps the mode its owner gave it
    make_engine(f"sqlite:///{tmp_path / 'y.sqlite'}").dispose()
    assert stat.S_IMODE(os.stat(tmp_path / "y.sqlite").st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_the_daemon_started_with_umask_0_writes_nothing_others_can_read(tmp_path, open_dir):
    (tmp_path / "dl2d.toml").write_text("")
    cmd = [sys.executable, "-m", "dl2d.daemon.main", "--sim", "--cluster", "tiny", "--state-dir", str(open_dir),
           "--config", str(tmp_path / "dl2d.toml"), "--policy", "drf", "--slots", "2", "--slot-seconds", "0.2",
           "--no-metrics"]
    old = os.umask(0)  # the daemon inherits it (no preexec_fn: forking a process that runs JAX's threads warns)
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(), cwd=open_dir)
    finally:
        os.umask(old)
    assert cp.returncode == 0, cp.stderr[-3000:]
    made = [p for p in open_dir.rglob("*") if not p.is_socket()]
    assert any(p.name == "dl2d.sqlite" for p in made), made
    for p in made:
        assert not stat.S_IMODE(os.lstat(p).st_mode) & 0o007, (p, oct(os.lstat(p).st_mode))
    nobody = ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "--"]
    read = subprocess.run([*nobody, "cat", str(open_dir / "dl2d.sqlite")], capture_output=True, timeout=30)
    assert read.returncode != 0 and b"Permission denied" in read.stderr


def test_a_second_daemon_on_the_same_slurm_state_dir_is_refused(tmp_path, open_dir):
    """Each daemon has its own state dir, both name one [slurm] state_dir: the second says so and exits 2 (it
    would take the first one's jobs for its own). No Slurm is needed: the first one keeps the lock while its
    slots fail to reach a controller."""
    shared = open_dir / "slurm"

    def config(name: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        path = d / "dl2d.toml"
        path.write_text(f'state_dir = "{d}"\nbackend = "slurm"\nslot_seconds = 1\n[metrics]\nenabled = false\n'
                        f'[control]\nenabled = false\n[slurm]\nstate_dir = "{shared}"\nrun_jobs_as = "daemon"\n'
                        f'slurm_conf = "{tmp_path / "no-slurm.conf"}"\ncommand_timeout_s = 2\n'
                        'backoff = { base = 0.1, cap = 0.1, max_attempts = 1 }\n')
        return path

    first = subprocess.Popen([sys.executable, "-m", "dl2d.daemon.main", "--config", str(config("a"))],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        lock = shared / "dl2d-slurm.lock"
        while not (lock.exists() and lock.read_text().strip() == str(first.pid)):
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() else ""
            time.sleep(0.2)
        second = subprocess.run([sys.executable, "-m", "dl2d.daemon.main", "--config", str(config("b"))],
                                capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path)
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr.strip().splitlines()[-1] == (
            f"dl2d: config error: slurm.state_dir {shared} is in use by another dl2d (pid {first.pid}); give each "
            "daemon its own [slurm] state_dir")
        assert first.poll() is None  # the first goes on
    finally:
        first.terminate()
        first.wait(timeout=60)
