"""Issue #14 item 1 on the real local Slurm (see conftest): a job runs as the user who submitted it, with the
Slurm account it names, and its environment holds what it declared and dl2d's and Slurm's own variables, none
of the daemon's.

The real `dl2d` daemon runs as root with secrets in its environment (its database URL, a token, a cloud key);
`dl2ctl submit --owner nobody` submits a job for the real non-root user `nobody` with `--account` and
`--export`; the job writes who it runs as (`id -un`, `id -u`), its whole environment, and whether it could change
the daemon's files of the job. A second job's owner has no account on the host: it fails with the reason and
the daemon goes on. The backend, driven directly, shows what reaches sbatch (`--qos`: a Slurm without accounting,
as this one, records no QOS, so the QOS is checked on sbatch's command line).
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_daemon_on_slurm import Harness, clean_env, wait_alive
from testkit.as_user import dl2ctl

from dl2d.daemon.backend import RUNNING, START, JobRequest, Target
from dl2d.daemon.slurm.backend import SlurmBackend
from dl2d.daemon.slurm.settings import SlurmBackendConfig
from dl2d.db.models import JobState
from dl2d.slurm.cli_driver import CliDriver, _default_runner
from dl2d.slurm.driver import DEFAULT_PATH

pytestmark = pytest.mark.slurm

#: In the daemon's environment, never in a job's.
DAEMON_SECRETS = {"DL2D_TEST_DB_URL": "postgresql://dl2d:hunter2-db-password@db.example/dl2d",
                  "DL2D_TEST_TOKEN": "daemon-token-7f3a9c", "AWS_SECRET_ACCESS_KEY": "aws-key-of-the-daemon-0042"}
#: The job's environment beyond its declared variables: dl2d's base (docs/jobs.md), and what the batch script's
#: bash and Slurm's job step set themselves (whatever the daemon's environment holds)
BASE = {"PATH", "LANG", "HOME", "USER", "LOGNAME", "SHELL", "SLURM_CONF"}
SET_BY_BASH_OR_SLURM = {"PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME", "TMPDIR", "ENVIRONMENT"}
#: The job: who it runs as, its environment, whether it can change the daemon's files of the job, then done.
JOB = ('{ id -un; id -u; } > "$DL2D_JOB_DIR/who.txt"; env -0 > "$DL2D_JOB_DIR/env.bin"; '
       'if { echo tampered >> "$DL2D_TARGET_FILE"; } 2>/dev/null || touch "${DL2D_TARGET_FILE%/*}/mine" 2>/dev/null; '
       'then echo changed; else echo refused; fi > "$DL2D_JOB_DIR/tamper.txt"; '
       'printf \'{"status": "done", "epoch": 1}\' > "$DL2D_PROGRESS_FILE"')


@pytest.fixture
def shared_dir():
    """The Slurm state dir: the job (nobody) must pass through it, so not under pytest's 0700 tmp dirs."""
    d = Path(tempfile.mkdtemp(prefix="dl2d-owner-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def job_env(path: Path) -> dict[str, str]:
    return dict(item.split("=", 1) for item in path.read_bytes().decode().split("\0") if "=" in item)


def scontrol_job(slurm, slurm_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", "-o", slurm_id], capture_output=True, text=True, timeout=15,
                          env={**os.environ, **slurm.env}, check=True).stdout


def test_a_job_runs_as_its_owner_with_its_account_and_none_of_the_daemons_environment(slurm, tmp_path, shared_dir,
                                                                                        wait_for):
    nobody = pwd.getpwnam("nobody")
    h = Harness(slurm, tmp_path, prefix="own-")
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
job_name_prefix = "own-"
checkpoint_timeout_s = 20
time_limit_min = 5
""")  # run_jobs_as = "owner": the default
        daemon_env = clean_env(**DAEMON_SECRETS, DL2D_DB_URL=h.db)
        log = tmp_path / "dl2d-owner.log"
        daemon = subprocess.Popen([sys.executable, "-m", "dl2d.daemon.main", "--config", str(h.config)],
                                  stdout=log.open("w"), stderr=subprocess.STDOUT, env=daemon_env, cwd=tmp_path)
        h.runs.append((daemon, log))

        def submit(name: str, owner: str, *extra: str) -> int:
            out = h.dl2ctl("submit", "--db", h.db, "-J", name, "--type", "resnet-50", "--epochs", "1", "--wrap", JOB,
                           "--cpus-per-worker", "1", "--mem-per-worker", "100M", "--cpus-per-ps", "1",
                           "--mem-per-ps", "100M", "--max-workers", "1", "--max-ps", "1", "--owner", owner, "-t", "5",
                           "--json", *extra).stdout
            return int(json.loads(out)["id"])

        mine = submit("whoami", "nobody", "-A", "proj-a", "--export", "WANDB_PROJECT=owner-test",
                      "--export", "TRICKY=a,b=c d")
        ghost = submit("ghost", "nosuchuserdl2d")
        wait_alive(h, daemon, wait_for, lambda: h.jobs()[mine].state == JobState.COMPLETED
                   and h.jobs()[ghost].state == JobState.FAILED, 90, "nobody's job COMPLETED, the ghost's FAILED")
        another_user_cannot_cancel_a_running_job(h, daemon, submit, shared_dir, wait_for)
        assert h.stop_daemon(daemon) == 0

        jobs = shared_dir / "slurm" / "jobs"
        owned = jobs / str(mine) / "job"
        # it ran as nobody ...
        assert (owned / "who.txt").read_text().split() == ["nobody", str(nobody.pw_uid)]
        env = job_env(owned / "env.bin")
        # ... with what it declared, dl2d's base for nobody, and dl2d's and Slurm's own variables ...
        assert env["WANDB_PROJECT"] == "owner-test" and env["TRICKY"] == "a,b=c d"
        assert (env["USER"], env["LOGNAME"], env["HOME"], env["PATH"]) == ("nobody", "nobody", nobody.pw_dir,
                                                                         DEFAULT_PATH)
        assert env["SLURM_JOB_USER"] == "nobody" and env["SLURM_JOB_ACCOUNT"] == "proj-a"
        assert env["DL2D_JOB_ID"] == str(mine) and env["DL2D_JOB_DIR"] == str(owned)
        # ... and none of the daemon's: no name of its environment beyond the base, no value of its secrets
        leaked = {k for k in daemon_env if k in env and k not in BASE | SET_BY_BASH_OR_SLURM
                  and not k.startswith("SLURM_")}
        assert not leaked, leaked
        assert not any(secret in value for secret in DAEMON_SECRETS.values() for value in env.values())
        assert "DL2D_DB_URL" not in env and "PYTHONPATH" not in env
        # the job could not change the daemon's files of it; its own directory is its own
        assert (owned / "tamper.txt").read_text().strip() == "refused"
        assert "tampered" not in (jobs / str(mine) / "target.json").read_text()
        st = os.stat(owned)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (nobody.pw_uid, nobody.pw_gid, 0o700)
        for path in (jobs / str(mine), jobs / str(mine) / "record.json", jobs / str(mine) / "target.env"):
            assert os.stat(path).st_uid == 0, path
        assert [p.name for p in owned.glob("slurm-*.out")]  # Slurm wrote its output, as nobody, there
        # Slurm knows the job as nobody's, charged to the account it named
        record = json.loads((jobs / str(mine) / "record.json").read_text())
        assert record["user"] == "nobody"
        assert slurm.driver().job(record["slurm_job_id"]).user == "nobody"
        shown = scontrol_job(slurm, record["slurm_job_id"])
        assert f"UserId=nobody({nobody.pw_uid})" in shown and "Account=proj-a" in shown, shown
        # the owner without an account: FAILED with the reason, nothing submitted, the daemon went on
        ghost_job = h.jobs()[ghost]
        fails = [d for k, d in h.events(ghost) if k == "fail"]
        why = "cannot run as its owner: user 'nosuchuserdl2d' has no account on this host"
        assert ghost_job.slurm_job_id is None and fails and why in fails[0]["message"], (ghost_job, fails)
        assert why in h.logs()
    finally:
        h.close()
        print(f"--- dl2d logs (tail) ---\n{h.logs()[-6000:]}")


def another_user_cannot_cancel_a_running_job(h: Harness, daemon, submit, shared_dir: Path, wait_for) -> None:
    """Issue #14, acceptance, on the real Slurm: nobody's job runs; the user `daemon`, with a dl2ctl config of its
    own that names its group the admin group and the daemon's socket, cannot cancel it (the daemon decides, from
    the caller's uid); the job keeps running in Slurm; root can."""
    sleeper = submit("sleeper", "nobody", "--wrap", "sleep 300")
    wait_alive(h, daemon, wait_for, lambda: h.jobs()[sleeper].state == JobState.RUNNING, 60, "nobody's sleeper RUNNING")
    own = shared_dir / "intruder.toml"
    own.write_text(f'admin_group = "daemon"\n[control]\nsocket = "{shared_dir / "dl2d.sock"}"\n')
    own.chmod(0o644)
    r = dl2ctl("cancel", str(sleeper), user="daemon", env={"DL2D_CONFIG": str(own)})
    assert r.returncode == 1 and (f"user 'daemon' may not cancel job {sleeper}: it belongs to 'nobody'"
                                  in r.stderr), (r.stdout, r.stderr)
    time.sleep(2 * 2)  # two slots: a cancel would have been carried out by now
    record = json.loads((shared_dir / "slurm" / "jobs" / str(sleeper) / "record.json").read_text())
    assert h.jobs()[sleeper].state == JobState.RUNNING and not record.get("cancelled")
    assert h.slurm.driver().job(record["slurm_job_id"]).active
    r = dl2ctl("cancel", str(sleeper), env={"DL2D_CONFIG": str(h.config)})  # root, the daemon's own config
    assert r.returncode == 0, (r.stdout, r.stderr)
    wait_alive(h, daemon, wait_for, lambda: h.jobs()[sleeper].state == JobState.CANCELLED, 60,
               "the sleeper CANCELLED by root")


def test_the_backend_hands_sbatch_the_owner_account_and_qos(slurm, shared_dir, wait_for, monkeypatch):
    """In process, the backend's sbatch command line: --account and --qos as the spec says (Slurm without
    accounting keeps the account, drops the QOS), run as nobody with the job's environment only."""
    monkeypatch.setenv("DL2D_DB_URL", DAEMON_SECRETS["DL2D_TEST_DB_URL"])  # this process is the daemon here
    seen: list[tuple[list[str], dict, object]] = []

    def runner(argv, stdin, env, timeout, run_as=None):
        seen.append((list(argv), dict(env), run_as))
        return _default_runner(argv, stdin, env, timeout, run_as=run_as)

    b = SlurmBackend(CliDriver(env=slurm.env, runner=runner),
                     SlurmBackendConfig(state_dir=shared_dir / "state", checkpoint_timeout_s=10))
    job = JobRequest(901, "resnet-50", 1, {
        "command": "sleep 30", "owner": "nobody", "account": "proj-b", "qos": "high", "partition": "gpu",
        "worker": {"gpus": 1, "cpus": 1, "mem_gb": 0}, "ps": {"cpus": 1, "mem_gb": 0}})
    assert b.apply(job, Target(1, 1)).method == START
    [(argv, env, run_as)] = [s for s in seen if os.path.basename(s[0][0]) == "sbatch"]
    assert {"--account=proj-b", "--qos=high", "--partition=gpu", "--export=ALL"} <= set(argv)
    assert run_as is not None and run_as.uid == pwd.getpwnam("nobody").pw_uid
    assert env["USER"] == "nobody" and "DL2D_DB_URL" not in env
    st = wait_for(lambda: (s := b.observe()[901]).state == RUNNING and s, 30, "the job RUNNING")
    shown = scontrol_job(slurm, st.backend_ref)
    assert "UserId=nobody(" in shown and "Account=proj-b" in shown and "Partition=gpu" in shown, shown
    b.cancel(901)
