"""Fixtures for the tests that need a real Slurm: ``scripts/slurm-localhost.sh`` starts a
4-node Slurm (fake GPUs) in a temp dir once per session and stops it at the end.

Without root or without installable Slurm packages these tests are skipped — except when the
``CI`` environment variable is set: CI must really run them, so there they fail instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from dl2d.slurm.cli_driver import CliDriver

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-localhost.sh"
BINARIES = ("slurmctld", "slurmd", "sbatch", "munged")


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"real-Slurm tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may reap daemons late)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


@dataclass
class LocalSlurm:
    dir: Path
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def driver(self, timeout: float = 15.0) -> CliDriver:
        return CliDriver(timeout=timeout, env=self.env)

    def script(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), command, str(self.dir)], capture_output=True,
                              text=True, timeout=timeout, check=False)

    def controller_pid(self) -> int | None:
        try:
            pid = int((self.dir / "run" / "slurmctld.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _running(pid) else None

    def stop_controller(self, sig: int = signal.SIGTERM) -> None:
        """Stop slurmctld and wait until it is gone. SIGTERM saves its state first; after
        SIGKILL it restarts from its last periodic state save (recent changes are lost)."""
        pid = self.controller_pid()
        assert pid, "slurmctld is not running"
        os.kill(pid, sig)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if not _running(pid):
                return
            time.sleep(0.05)
        raise AssertionError(f"slurmctld (pid {pid}) did not exit")

    def start(self) -> None:
        """(Re)start whatever is not running; raises with the script's output on failure."""
        cp = self.script("start")
        if cp.returncode != 0:
            raise AssertionError(f"slurm-localhost.sh start failed:\n{cp.stdout}\n{cp.stderr}")


@pytest.fixture(scope="session")
def local_slurm() -> LocalSlurm:
    if os.geteuid() != 0:
        _skip_or_fail("needs root to run slurmctld/slurmd")
    if _missing_binaries() and shutil.which("apt-get") is None:
        _skip_or_fail(f"Slurm not installed ({', '.join(_missing_binaries())}) and no apt-get")
    # A short path: munged's socket lives under it (unix socket paths are limited to 108 bytes).
    d = Path(tempfile.mkdtemp(prefix="dl2d-slurm-"))
    slurm = LocalSlurm(dir=d, conf=d / "slurm.conf")
    t0 = time.monotonic()
    cp = slurm.script("start", timeout=300)
    if cp.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        if _missing_binaries():
            _skip_or_fail(f"could not install Slurm packages: {cp.stderr.strip()[-2000:]}")
        pytest.fail(f"slurm-localhost.sh start failed (exit {cp.returncode}):\n"
                    f"{cp.stdout}\n{cp.stderr}", pytrace=False)
    print(f"\nlocal Slurm ready in {time.monotonic() - t0:.1f}s under {d}")
    yield slurm
    cp = slurm.script("stop")
    if cp.returncode != 0:
        print(f"slurm-localhost.sh stop failed:\n{cp.stdout}\n{cp.stderr}")
    if not os.environ.get("DL2D_KEEP_SLURM_DIR"):
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def slurm(local_slurm: LocalSlurm) -> LocalSlurm:
    """The session's Slurm, with the controller up and no job left behind by a test."""
    if local_slurm.controller_pid() is None:
        local_slurm.start()
    yield local_slurm
    if local_slurm.controller_pid() is None:
        local_slurm.start()
    driver = local_slurm.driver()
    for job in driver.jobs():
        if job.active:
            driver.cancel(job.job_id)
    # cancelled is not gone: a job still completing holds its nodes, and the next test starts from free ones
    deadline = time.monotonic() + 30
    while any(j.active for j in driver.jobs()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for node in driver.nodes():
        if node.drained:
            driver.resume_node(node.name)
    if any("NOT_RESPONDING" in n.flags for n in driver.nodes()):
        # a slurmd the controller lost a message to (e.g. after a refused job update) stays flagged until its
        # next ping, minutes away: have every slurmd register again so the next test starts from healthy nodes
        subprocess.run(["scontrol", "reconfigure"], env={**os.environ, **local_slurm.env}, capture_output=True,
                       timeout=60)
        _wait_for(lambda: not any("NOT_RESPONDING" in n.flags for n in local_slurm.driver().nodes()), 60,
                  "every slurmd responding again")


def _wait_for(predicate: Callable[[], object], timeout: float, what: str,
              interval: float = 0.2) -> object:
    """Poll until ``predicate()`` is truthy; returns its value or fails naming ``what``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@pytest.fixture
def wait_for() -> Callable[..., object]:
    """``wait_for(predicate, timeout, what)``: poll until truthy (a fixture, so that test
    modules need not import from this conftest)."""
    return _wait_for


@pytest.fixture
def strangers_job(slurm: LocalSlurm) -> Callable[[int], str]:
    """``strangers_job(gpus)``: submit, as the unprivileged user ``nobody``, a sleeping job that asks Slurm for
    ``gpus`` GPUs per job on one node (``--gpus=N``, a form dl2d never uses), and return its Slurm id: another
    user's work on a cluster dl2d shares."""
    def submit(gpus: int) -> str:
        out = subprocess.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "sbatch",
                              "--parsable", "--nodes=1", f"--gpus={gpus}", "--chdir=/tmp", "--output=/dev/null",
                              "--job-name=train", "--wrap=sleep 600"], capture_output=True, text=True,
                             env={**os.environ, **slurm.env}, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().split(";")[0]
    return submit
