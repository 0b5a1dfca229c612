"""A job cannot reach past its own job, on the real local Slurm (see conftest): the real `dl2d` daemon runs as
root, every job of the attacker runs as `nobody`, as its owner.

* a job that writes ``"epoch": NaN`` to its progress file, and one that writes ``"time": 1e18``, each fail alone
  with the reason (their Slurm jobs cancelled); the daemon neither exits nor dies at its next start, though the
  files stay; a well-behaved job of the same slots finishes;
* a job that says done and runs on is RUNNING, with its GPUs, until ``done_grace_s`` after it said so, then its
  Slurm job is cancelled and it finishes at Slurm's EndTime: never finished in dl2d while Slurm runs it;
* a job that replaces its secret with a link to /etc/shadow and asks to be started again fails at that start with
  the reason, not retried every slot;
* `nobody` plants ``sbatch --job-name=<prefix><next id> --comment=dl2d:<next id>`` before root's next job: the
  daemon leaves it alone (logged) and root's job runs its own command in its own Slurm job.

The unit-level tests of the same (in-memory Slurm, the fuzz of every reader): tests/slurm/test_job_reports.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_daemon_on_slurm import Harness, clean_env, wait_alive

from dl2d.db.models import JobState
from dl2d.slurm.driver import JobSpec

pytestmark = pytest.mark.slurm

GRACE_S = 4
NAN = 'printf \'{"status": "running", "epoch": NaN}\' > "$DL2D_PROGRESS_FILE"; sleep 300'
FAR_TIME = 'printf \'{"status": "running", "epoch": 0.5, "time": 1e18}\' > "$DL2D_PROGRESS_FILE"; sleep 300'
LIAR = 'printf \'{"status": "done", "epoch": 1}\' > "$DL2D_PROGRESS_FILE"; sleep 300'
LINKER = ('rm -f "$DL2D_JOB_SECRET_FILE"; ln -s /etc/shadow "$DL2D_JOB_SECRET_FILE"; '
          'printf \'{"status": "checkpointed", "epoch": 0.5}\' > "$DL2D_PROGRESS_FILE"')
GOOD = ('for e in 1 2 3; do sleep 1; printf \'{"status": "running", "epoch": %d}\' $e > "$DL2D_PROGRESS_FILE.t"; '
        'mv "$DL2D_PROGRESS_FILE.t" "$DL2D_PROGRESS_FILE"; done; echo ran > "$DL2D_JOB_DIR/ran.txt"; '
        'printf \'{"status": "done", "epoch": 3}\' > "$DL2D_PROGRESS_FILE"')


@pytest.fixture
def shared_dir():
    """The Slurm state dir: the jobs (nobody) must pass through it, so not under pytest's 0700 tmp dirs."""
    d = Path(tempfile.mkdtemp(prefix="dl2d-hostile-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def scontrol_fields(slurm, slurm_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", slurm_id], capture_output=True, text=True, timeout=15,
                         env={**os.environ, **slurm.env}, check=True).stdout
    return dict(w.split("=", 1) for w in out.split() if "=" in w)


def test_hostile_jobs_fail_alone_and_cannot_take_over_another_users_job(slurm, tmp_path, shared_dir, wait_for):
    h = Harness(slurm, tmp_path, prefix="hj-")
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
socket = "{shared_dir / 'dl2d.sock'}"
[slurm]
slurm_conf = "{slurm.conf}"
state_dir = "{shared_dir / 'slurm'}"
job_name_prefix = "hj-"
checkpoint_timeout_s = 10
done_grace_s = {GRACE_S}
time_limit_min = 10
""")  # run_jobs_as = "owner": the default
        h.dir = shared_dir  # where Harness finds the jobs' directories
        env = clean_env(DL2D_DB_URL=h.db)

        def start() -> subprocess.Popen:
            log = tmp_path / f"dl2d-hostile-{len(h.runs)}.log"
            p = subprocess.Popen([sys.executable, "-m", "dl2d.daemon.main", "--config", str(h.config)],
                                 stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
            h.runs.append((p, log))
            return p

        def submit(name: str, owner: str, command: str) -> int:
            out = h.dl2ctl("submit", "--db", h.db, "-J", name, "--type", "resnet-50", "--epochs", "3", "--wrap",
                           command, "--gpus-per-worker", "1", "--cpus-per-worker", "1", "--mem-per-worker", "100M",
                           "--cpus-per-ps", "1", "--mem-per-ps", "100M", "--max-workers", "1", "--max-ps", "1",
                           "--owner", owner, "-t", "10", "--json").stdout
            return int(json.loads(out)["id"])

        daemon = start()
        nan, far, liar, linker, good = (submit(n, "nobody", c) for n, c in (
            ("nan", NAN), ("far", FAR_TIME), ("liar", LIAR), ("linker", LINKER), ("good", GOOD)))
        # the attacker plants the next id's name and comment, as nobody, before root submits it
        victim_id = good + 1
        planted = slurm.driver().submit(JobSpec(name=f"hj-{victim_id}", command="sleep 300", user="nobody",
                                                dl2d_job_id=str(victim_id), time_limit_min=10, requeue=False,
                                                output="/dev/null", checkpoint_signal=None))
        victim = submit("victim", "root", GOOD)
        assert victim == victim_id

        # the liar said done at once, and slept on: dl2d ended it only after the grace, then finished it at Slurm's
        # EndTime (checked after the fact: the submissions above take longer than the grace on a loaded machine)
        wait_alive(h, daemon, wait_for, lambda: h.jobs()[liar].state == JobState.COMPLETED, 90, "the liar ended")
        shown = scontrol_fields(slurm, h.jobs()[liar].slurm_job_id)
        assert shown["JobState"] == "CANCELLED", shown  # dl2d cancelled it: it would have slept 300 s
        began, ended = (time.mktime(time.strptime(shown[k], "%Y-%m-%dT%H:%M:%S")) for k in ("StartTime", "EndTime"))
        assert ended - began >= GRACE_S - 1, shown  # not at once: after the grace
        assert abs(h.jobs()[liar].finished_at.timestamp() - ended) <= 1.0, (h.jobs()[liar].finished_at, ended)
        assert f"job {liar} says done but its Slurm job" in h.logs()

        wait_alive(h, daemon, wait_for, lambda: all(h.jobs()[j].state == JobState.FAILED for j in (nan, far, linker))
                   and h.jobs()[good].state == JobState.COMPLETED and h.jobs()[victim].state == JobState.COMPLETED,
                   90, "the hostile jobs FAILED, the good ones COMPLETED")
        messages = {j: [d["message"] for k, d in h.events(j) if k == "fail"] for j in (nan, far, linker)}
        assert messages[nan] == ["its progress file is refused: epoch = nan is not a finite number"], messages
        assert messages[far] == ["its progress file is refused: time = 1e+18 is outside [9.46685e+08, 4.10244e+09]"], \
            messages
        assert len(messages[linker]) == 1 and messages[linker][0].endswith("job.secret: it is a symbolic link")
        for j in (nan, far):  # their Slurm jobs, which slept 300 s, were cancelled
            assert not slurm.driver().job(h.jobs()[j].slurm_job_id).active
        assert h.logs().count("job.secret: it is a symbolic link") <= 3  # once (and its echo), not every slot
        assert h.jobs()[good].epochs_done == 3.0

        # root's job ran its own command in its own Slurm job; nobody's planted job was left alone
        assert (h.job_dir(victim) / "job" / "ran.txt").read_text() == "ran\n"
        assert h.jobs()[victim].slurm_job_id != planted and slurm.driver().job(planted).active
        assert f"Slurm job {planted} (user nobody) carries its name or id but not its submission's token" in h.logs()
        comment = scontrol_fields(slurm, h.jobs()[victim].slurm_job_id)["Comment"]
        assert comment.startswith(f"dl2d:{victim}:") and len(comment) == len(f"dl2d:{victim}:") + 32

        # the bad files stay; the daemon starts again and runs slots
        assert h.stop_daemon(daemon) == 0
        daemon = start()
        first = h.last_slot()
        wait_alive(h, daemon, wait_for, lambda: h.last_slot() >= first + 2, 30, "two slots after the restart")
        assert h.stop_daemon(daemon) == 0
    finally:
        h.close()
        print(f"--- dl2d logs (tail) ---\n{h.logs()[-6000:]}")
