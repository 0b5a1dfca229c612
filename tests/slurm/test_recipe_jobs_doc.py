"""docs/jobs.md's JAX recipe as typed, on the real local Slurm (see conftest): the page's install block, run as
root in this checkout, then the page's `dl2ctl submit` command, run by the unprivileged user `nobody` in a shell
whose PATH holds the install's bin (as the page tells users to set it), against a root daemon whose jobs run as
their owners. The job must complete, and its output (the file `dl2ctl show` names) must say it ran: the commands
are read from the page, so the page and this test cannot drift apart.

The install goes where the page says (/opt/dl2d): the test makes it there only when nothing is there yet (or
only a leftover of its own, marked), and removes it at the end.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_daemon_on_slurm import Harness, clean_env, wait_alive
from testkit.as_user import dl2ctl

from dl2d.db.models import JobState

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "jobs.md"
INSTALL = Path("/opt/dl2d")
MARK = INSTALL / ".made-by-dl2d-tests"


def sh_blocks(markdown: str, heading: str) -> list[str]:
    """The ```sh blocks of the section whose `## ` heading starts with ``heading`` (up to the next `## `)."""
    sections = re.split(r"^## ", markdown, flags=re.M)
    [section] = [s for s in sections if s.startswith(heading)]
    return re.findall(r"^```sh\n(.*?)^```$", section, flags=re.M | re.S)


def page_commands() -> tuple[str, str]:
    """(the install block, the JAX recipe's submit command) as the page has them."""
    text = PAGE.read_text()
    [install] = sh_blocks(text, "Before the recipes")
    [submit] = sh_blocks(text, "The JAX recipe")
    return install, submit


def test_the_page_has_the_commands_this_test_runs():
    install, submit = page_commands()
    assert str(INSTALL) in install and "pip install ." in install
    assert submit.startswith("dl2ctl submit ") and "--export PATH=/opt/dl2d/venv/bin:" in submit


@pytest.fixture(scope="module")
def installed():
    """The page's install block, run as root from this checkout (cwd); removed afterwards."""
    if INSTALL.exists() and not MARK.exists():
        pytest.skip(f"{INSTALL} exists and was not made by this test: the page's recipe installs there")
    build_before = (REPO / "build").exists()
    INSTALL.mkdir(mode=0o755, exist_ok=True)
    INSTALL.chmod(0o755)
    MARK.touch()
    install, _ = page_commands()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DL2D_", "SLURM_", "PYTHON", "VIRTUAL_ENV"))}
        cp = subprocess.run(["bash", "-e", "-c", install], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
        assert cp.returncode == 0, (cp.stdout[-3000:], cp.stderr[-3000:])
        yield INSTALL
    finally:
        shutil.rmtree(INSTALL, ignore_errors=True)
        if not build_before:  # setuptools' build directory in the checkout, made by `pip install .`
            shutil.rmtree(REPO / "build", ignore_errors=True)


@pytest.fixture
def shared_dir():
    """The Slurm state dir and the socket's: the job's user (nobody) must pass through it, never list it."""
    d = Path(tempfile.mkdtemp(prefix="dl2d-recipe-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_nobody(script: str, socket_path: Path) -> subprocess.CompletedProcess:
    """A login-like shell of nobody's: the install's bin on PATH (what the page tells users to do), the
    daemon's socket named (the packaged one is /run/dl2d/dl2d.sock), no dl2d config of its own."""
    pw = pwd.getpwnam("nobody")
    env = {"PATH": f"{INSTALL}/venv/bin:/usr/local/bin:/usr/bin:/bin", "HOME": pw.pw_dir, "USER": "nobody",
           "LOGNAME": "nobody", "LANG": "C.UTF-8", "DL2D_SOCKET": str(socket_path),
           "DL2D_CONFIG": "/nonexistent/dl2d.toml"}
    return subprocess.run(["bash", "-e", "-c", script], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], env=env,
                          cwd="/", capture_output=True, text=True, timeout=300)


def test_the_jax_recipe_as_typed_runs_as_nobody_and_completes(installed, slurm, tmp_path, shared_dir, wait_for):
    _, submit = page_commands()
    nobody = pwd.getpwnam("nobody")
    h = Harness(slurm, tmp_path, prefix="recipe-")
    socket_path = shared_dir / "dl2d.sock"
    try:
        h.config.write_text(f"""
state_dir = "{tmp_path}"
backend = "slurm"
slot_seconds = 2
log_level = "info"
[policy]
name = "drf"
[metrics]
enabled = false
[control]
socket = "{socket_path}"
[slurm]
slurm_conf = "{slurm.conf}"
state_dir = "{shared_dir / 'slurm'}"
job_name_prefix = "recipe-"
checkpoint_timeout_s = 30
time_limit_min = 10
""")  # run_jobs_as = "owner" (the default): nobody's job runs as nobody
        log = tmp_path / "dl2d-recipe.log"
        daemon = subprocess.Popen([sys.executable, "-m", "dl2d.daemon.main", "--config", str(h.config)],
                                  stdout=log.open("w"), stderr=subprocess.STDOUT, env=clean_env(), cwd=tmp_path)
        h.runs.append((daemon, log))
        wait_alive(h, daemon, wait_for, socket_path.exists, 60, "the daemon's control socket")

        r = as_nobody(submit, socket_path)
        assert r.returncode == 0, (r.stdout, r.stderr)
        m = re.fullmatch(r"Submitted job (\d+) \(mlp, mlp, 1 epochs\) for nobody", r.stdout.strip())
        assert m and not r.stderr.strip(), (r.stdout, r.stderr)  # through the daemon: no "no dl2d answers" note
        job_id = int(m[1])
        wait_alive(h, daemon, wait_for, lambda: h.jobs()[job_id].state in (JobState.COMPLETED, JobState.FAILED),
                   240, "the recipe's job ended")
        job = h.jobs()[job_id]
        shown = dl2ctl("show", str(job_id), "--json", env={"DL2D_CONFIG": str(h.config)})
        assert shown.returncode == 0, shown.stderr
        output = Path(json.loads(shown.stdout)["output"])
        text = output.read_text() if output.exists() else f"(no output file {output})"
        print(f"--- the job's output ({output}) ---\n{text[-3000:]}")
        assert job.state == JobState.COMPLETED, (job.state, text[-4000:])
        assert h.stop_daemon(daemon) == 0

        assert output.parent == shared_dir / "slurm" / "jobs" / str(job_id) / "job"
        assert output.stat().st_uid == nobody.pw_uid  # Slurm wrote it as nobody: the job ran as its owner
        assert "command not found" not in text and "No such file" not in text, text[-4000:]
        progress = json.loads((output.parent / "progress.json").read_text())
        steps = int(re.search(r"--steps (\d+)", submit)[1])
        assert (progress["state"], progress["step"]) == ("done", steps), progress
        # the latest run's output (a resize relaunches the job: run 2, ...) says which run it was
        assert re.search(rf"^run {progress['runs']}: [1-4] processes, resuming at step \d+$", text, flags=re.M), \
            text[-4000:]
    finally:
        h.close()
        print(f"--- dl2d logs (tail) ---\n{h.logs()[-6000:]}")
