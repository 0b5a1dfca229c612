"""Unit tests without Slurm: CLI driver over a fake runner, backoff, demo job, driver selection
and the pyslurm driver's missing-dependency path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dl2d.slurm import demo_job
from dl2d.slurm.backoff import BackoffPolicy, RetryingDriver, backoff_delay, retry
from dl2d.slurm.cli_driver import (
    CliDriver,
    RunAs,
    parse_sbatch_output,
    sbatch_args,
    sbatch_environment,
    submitted_job_problem,
    switch_problem,
)
from dl2d.slurm.driver import (
    DEFAULT_PATH,
    JobSpec,
    SlurmDriver,
    SlurmError,
    SlurmJob,
    SlurmUnavailable,
    UnixUser,
    UnknownUserError,
    job_environment,
    lookup_user,
    make_driver,
    process_user,
)
from dl2d.slurm.pyslurm_driver import (
    PyslurmUnavailableError,
    import_pyslurm,
    submit_description_kwargs,
)

FIXTURES = Path(__file__).parent / "fixtures"


class FakeRunner:
    """Records commands; answers from a list of (returncode, stdout, stderr) or raises."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls: list[tuple[list[str], str | None, dict]] = []
        self.run_as: list[RunAs | None] = []  # who each command ran as (None: this process's user)

    def __call__(self, argv, stdin, env, timeout, run_as=None):
        self.calls.append((list(argv), stdin, dict(env)))
        self.run_as.append(run_as)
        answer = self.answers.pop(0) if self.answers else (0, "", "")
        if isinstance(answer, BaseException):
            raise answer
        rc, out, err = answer
        return subprocess.CompletedProcess(list(argv), rc, out, err)


def test_sbatch_args_cover_the_spec():
    spec = JobSpec(name="j", command="echo hi", nodes=3, gpus_per_node=2, cpus_per_task=4,
                   ntasks_per_node=1, time_limit_min=30, output="/o/%j.out", workdir="/w",
                   partition="gpu", nodelist=("n1", "n2"), exclude=("n9",), dl2d_job_id="42",
                   checkpoint_signal="USR1", checkpoint_signal_secs=90, requeue=False,
                   account="proj-a", qos="high", user="alice", env={"SECRET": "not on the command line"})
    args = sbatch_args(spec)
    assert not any("SECRET" in a or "alice" in a for a in args)  # the environment and user are not options
    for expected in ["--parsable", "--job-name=j", "--nodes=3", "--gres=gpu:2",
                     "--cpus-per-task=4", "--ntasks-per-node=1", "--time=30",
                     "--output=/o/%j.out", "--chdir=/w", "--partition=gpu", "--account=proj-a", "--qos=high",
                     "--signal=B:USR1@90", "--no-requeue", "--nodelist=n1,n2", "--exclude=n9",
                     "--comment=dl2d:42", "--wrap=echo hi", "--export=ALL"]:
        assert expected in args
    minimal = sbatch_args(JobSpec(name="m", script="#!/bin/sh\ntrue\n", checkpoint_signal=None))
    assert "--requeue" in minimal and not any(a.startswith(("--wrap", "--gres", "--signal", "--account", "--qos"))
                                              for a in minimal)


def test_jobspec_validation():
    with pytest.raises(ValueError, match="exactly one"):
        JobSpec(name="x")
    with pytest.raises(ValueError, match="exactly one"):
        JobSpec(name="x", command="a", script="b")
    with pytest.raises(ValueError, match="nodes"):
        JobSpec(name="x", command="a", nodes=0)


def test_parse_sbatch_output():
    assert parse_sbatch_output("123\n") == "123"
    assert parse_sbatch_output("124;cluster\n") == "124"
    with pytest.raises(SlurmError, match="no job id"):
        parse_sbatch_output("sbatch: error\n")


ALICE = UnixUser("alice", 1234, 1234, "/home/alice", "/bin/bash", (1234, 27))


def test_the_job_environment_is_the_base_and_what_the_job_declares():
    env = job_environment(ALICE, {"A": "1,2", "PATH": "/opt/venv/bin:/usr/bin"}, slurm_conf="/etc/s.conf")
    assert env == {"PATH": "/opt/venv/bin:/usr/bin", "LANG": "C.UTF-8", "HOME": "/home/alice", "USER": "alice",
                   "LOGNAME": "alice", "SHELL": "/bin/bash", "SLURM_CONF": "/etc/s.conf", "A": "1,2"}
    assert job_environment(ALICE)["PATH"] == DEFAULT_PATH and "SLURM_CONF" not in job_environment(ALICE)
    with pytest.raises(ValueError, match="not an environment variable name: 'A=B'"):
        job_environment(ALICE, {"A=B": "1"})
    with pytest.raises(ValueError, match="environment variable X: the value must be text without NUL"):
        job_environment(ALICE, {"X": "a\x00b"})
    # sbatch's: the driver's SLURM_CONF, nothing else of the environment its commands run with
    daemon = {"PATH": "/d/bin", "DL2D_DB_URL": "postgresql://dl2d:pw@db/dl2d", "SLURM_CONF": "/x/slurm.conf",
              "HOME": "/var/lib/dl2d", "AWS_SECRET_ACCESS_KEY": "k"}
    env = sbatch_environment(ALICE, JobSpec(name="s", command="true", env={"B": "2"}), daemon)
    assert env == {**job_environment(ALICE, {"B": "2"}), "SLURM_CONF": "/x/slurm.conf"}


def test_submit_passes_script_and_only_the_jobs_environment(monkeypatch):
    monkeypatch.setenv("DL2D_DB_URL", "postgresql://dl2d:hunter2@db/dl2d")
    run = FakeRunner((0, "77\n", ""))
    d = CliDriver(runner=run, env={"SLURM_CONF": "/x/slurm.conf"})
    job_id = d.submit(JobSpec(name="s", script="#!/bin/sh\ntrue\n", env={"A": "1,2"}))
    argv, stdin, env = run.calls[0]
    assert job_id == "77" and os.path.basename(argv[0]) == "sbatch" and stdin == "#!/bin/sh\ntrue\n"
    assert env["A"] == "1,2" and env["SLURM_CONF"] == "/x/slurm.conf" and "DL2D_DB_URL" not in env
    assert set(env) == {"PATH", "LANG", "HOME", "USER", "LOGNAME", "SHELL", "SLURM_CONF", "A"}
    assert run.run_as == [None]  # this process's own user: no switch, no check
    # a PATH the job declares is the job's; sbatch itself is found on the driver's
    run = FakeRunner((0, "78\n", ""))
    CliDriver(runner=run).submit(JobSpec(name="s", command="true", env={"PATH": "/home/eve/bin"}))
    assert not run.calls[0][0][0].startswith("/home/eve") and run.calls[0][2]["PATH"] == "/home/eve/bin"
    with pytest.raises(SlurmError, match="not an environment variable name"):
        d.submit(JobSpec(name="s", command="true", env={"": "1"}))


def scontrol_line(job_id: str, user: str, name: str, comment: str) -> str:
    return (f"JobId={job_id} JobName={name} UserId={user}(65534) GroupId=nogroup(65534) Priority=1 "
            f"JobState=PENDING Reason=None Comment={comment} NumNodes=1\n")


def test_submit_as_another_user_switches_to_it_and_checks_the_job_it_printed(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # as the daemon runs (the runner is a stand-in)
    nobody = lookup_user("nobody")
    run = FakeRunner((0, "88\n", ""), (0, scontrol_line("88", "nobody", "j", "dl2d:5"), ""))
    spec = JobSpec(name="j", command="id", user="nobody", dl2d_job_id="5", account="a", qos="q")
    assert CliDriver(runner=run).submit(spec) == "88"
    (sbatch, _, env), (check, _, _) = run.calls
    assert "--account=a" in sbatch and "--qos=q" in sbatch
    assert env["USER"] == env["LOGNAME"] == "nobody" and env["HOME"] == nobody.home
    assert run.run_as[0] == RunAs(nobody.uid, nobody.gid, nobody.groups or (nobody.gid,),
                                  nobody.home if os.path.isdir(nobody.home) else "/")
    assert check == ["scontrol", "show", "job", "-o", "88"] and run.run_as[1] is None  # the check: as root
    # sbatch run as the user is the user's process: an id it prints for someone else's job is refused
    run = FakeRunner((0, "3\n", ""), (0, scontrol_line("3", "root", "other", ""), ""))
    with pytest.raises(SlurmError, match="sbatch run as nobody printed job id 3, which is not the job it "
                                         "submitted: Slurm shows user root"):
        CliDriver(runner=run).submit(spec)
    run = FakeRunner((0, "4\n", ""), (1, "", "slurm_load_jobs error: Invalid job id specified"))
    with pytest.raises(SlurmError, match="printed job id 4, which Slurm does not know"):
        CliDriver(runner=run).submit(spec)


def test_who_may_submit_as_whom(monkeypatch):
    assert switch_problem(ALICE, 0) is None and switch_problem(ALICE, 1234) is None
    problem = switch_problem(ALICE, 999)
    assert problem.startswith("cannot submit a job as user alice (uid 1234): this process runs as uid 999")
    assert 'run_jobs_as = "daemon"' in problem and "CAP_SETUID" in problem
    monkeypatch.setattr(os, "geteuid", lambda: 999)  # the driver refuses before running anything
    run = FakeRunner()
    with pytest.raises(SlurmError, match="only root"):
        CliDriver(runner=run).submit(JobSpec(name="j", command="id", user="nobody"))
    assert run.calls == []
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(UnknownUserError, match="user 'no-such-user-dl2d' has no account on this host"):
        CliDriver(runner=run).submit(JobSpec(name="j", command="id", user="no-such-user-dl2d"))
    assert run.calls == []
    # root without CAP_SETUID (a unit's bounding set): the switch fails in the child, a one-line SlurmError
    with pytest.raises(SlurmError, match=r"sbatch could not be started as uid 65534 \(needs CAP_SETUID and "
                                         r"CAP_SETGID\): Operation not permitted"):
        CliDriver(runner=FakeRunner(PermissionError(1, "Operation not permitted"))).submit(
            JobSpec(name="j", command="id", user="nobody"))


def test_submitted_job_problem():
    spec = JobSpec(name="j", command="true", dl2d_job_id="5")
    good = SlurmJob("7", "j", "PENDING", comment="dl2d:5", user="nobody")
    assert submitted_job_problem(good, "7", spec, "nobody") is None
    assert submitted_job_problem(SlurmJob("7", "j", "PENDING", comment="dl2d:5"), "7", spec, "nobody") is None
    assert "user root" in submitted_job_problem(SlurmJob("7", "j", "PENDING", comment="dl2d:5", user="root"),
                                                 "7", spec, "nobody")
    assert "comment 'dl2d:6'" in submitted_job_problem(SlurmJob("7", "j", "PENDING", comment="dl2d:6",
                                                                user="nobody"), "7", spec, "nobody")


def test_errors_are_classified():
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    d = CliDriver(runner=FakeRunner((1, "", down)))
    with pytest.raises(SlurmUnavailable) as e:
        d.jobs()
    assert e.value.returncode == 1 and e.value.command == ("squeue", "--json")
    assert "Unable to contact" in str(e.value)
    d = CliDriver(runner=FakeRunner((1, "", "sbatch: error: Invalid generic resource")))
    with pytest.raises(SlurmError) as e:
        d.submit(JobSpec(name="x", command="true"))
    assert not isinstance(e.value, SlurmUnavailable)
    d = CliDriver(runner=FakeRunner(subprocess.TimeoutExpired("squeue", 3)), timeout=3)
    with pytest.raises(SlurmUnavailable, match="timed out after 3s"):
        d.nodes()
    d = CliDriver(runner=FakeRunner(FileNotFoundError("sinfo")))
    with pytest.raises(SlurmError, match="slurm-client"):
        d.nodes()
    # 22.05 exits 0 with an "errors" list when the controller is down
    d = CliDriver(runner=FakeRunner(
        (0, (FIXTURES / "squeue-22.05-controller-down.json").read_text(), "")))
    with pytest.raises(SlurmUnavailable):
        d.jobs()


def test_ping_and_cancel_idempotence():
    assert CliDriver(runner=FakeRunner((0, "Slurmctld(primary) at h is UP\n", ""))).ping()
    assert not CliDriver(runner=FakeRunner((1, "Slurmctld(primary) at h is DOWN\n", ""))).ping()
    CliDriver(runner=FakeRunner(
        (1, "", "scancel: error: Kill job error on job id 5: Job/step already completing or "
                "completed"))).cancel("5")
    with pytest.raises(SlurmError):
        CliDriver(runner=FakeRunner((1, "", "scancel: error: Invalid job id 5"))).cancel("5")


def test_requeue_waits_for_pending_then_resizes():
    squeue = json.loads((FIXTURES / "squeue-22.05.json").read_text())
    job = next(j for j in squeue["jobs"] if j["job_id"] == 3)
    completing = {**squeue, "jobs": [{**job, "job_state": "COMPLETING"}]}
    pending = {**squeue, "jobs": [{**job, "job_state": "PENDING"}]}
    run = FakeRunner((0, "", ""), (0, json.dumps(completing), ""), (0, json.dumps(pending), ""),
                     (0, "", ""))
    CliDriver(runner=run).requeue("3", num_nodes=4)
    argvs = [c[0] for c in run.calls]
    assert argvs[0] == ["scontrol", "requeue", "3"]
    assert argvs[-1] == ["scontrol", "update", "JobId=3", "NumNodes=4-4"]
    assert len(argvs) == 4


def test_actions_build_the_right_commands():
    run = FakeRunner()
    d = CliDriver(runner=run)
    d.shrink("9", 2)
    d.signal("9", "USR1")
    d.drain_node("node2", "xid 79")
    d.resume_node("node2")
    assert [c[0] for c in run.calls] == [
        ["scontrol", "update", "JobId=9", "NumNodes=2"],
        ["scancel", "--signal=USR1", "--full", "9"],
        ["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=xid 79"],
        ["scontrol", "update", "NodeName=node2", "State=RESUME"],
    ]
    with pytest.raises(ValueError):
        d.shrink("9", 0)


# -- backoff ----------------------------------------------------------------------------------

def test_backoff_delay_grows_caps_and_jitters():
    p = BackoffPolicy(base=1, factor=2, cap=5, jitter=0.5)
    assert [backoff_delay(n, p, rand=lambda: 0.0) for n in range(5)] == [1, 2, 4, 5, 5]
    assert backoff_delay(2, p, rand=lambda: 0.999999) == pytest.approx(2.0, abs=1e-4)
    assert backoff_delay(10_000, p, rand=lambda: 0.0) == 5
    for _ in range(100):
        assert 2 <= backoff_delay(2, p) <= 4
    with pytest.raises(ValueError):
        BackoffPolicy(jitter=2)
    with pytest.raises(ValueError):
        BackoffPolicy(max_attempts=None, max_elapsed=None)


def test_retry_until_success_and_give_up():
    sleeps: list[float] = []
    outcomes = [SlurmUnavailable("down"), SlurmUnavailable("down"), "ok"]

    def flaky():
        o = outcomes.pop(0)
        if isinstance(o, Exception):
            raise o
        return o

    seen = []
    assert retry(flaky, BackoffPolicy(base=1, jitter=0), sleep=sleeps.append,
                 on_retry=lambda a, d, e: seen.append(a)) == "ok"
    assert sleeps == [1, 2] and seen == [1, 2]

    def down():
        raise SlurmUnavailable("down")

    sleeps.clear()
    with pytest.raises(SlurmUnavailable):
        retry(down, BackoffPolicy(base=1, jitter=0, max_attempts=3), sleep=sleeps.append)
    assert sleeps == [1, 2]
    clock = iter(range(0, 1000, 10))
    with pytest.raises(SlurmUnavailable):
        retry(down, BackoffPolicy(base=1, jitter=0, max_attempts=None, max_elapsed=25),
              sleep=lambda s: None, clock=lambda: next(clock))

    def bad():
        raise SlurmError("bad request")

    with pytest.raises(SlurmError):
        retry(bad, sleep=sleeps.append)


def test_retrying_driver_wraps_methods_but_not_ping():
    calls = []

    class Flaky:
        def jobs(self):
            calls.append("jobs")
            if len(calls) < 3:
                raise SlurmUnavailable("down")
            return ["j"]

        def ping(self):
            raise SlurmUnavailable("ping is not retried")

    r = RetryingDriver(Flaky(), BackoffPolicy(base=0, jitter=0), sleep=lambda s: None)
    assert r.jobs() == ["j"] and calls == ["jobs"] * 3
    with pytest.raises(SlurmUnavailable):
        r.ping()


# -- driver selection / pyslurm ---------------------------------------------------------------

def test_make_driver_selection():
    d = make_driver("cli", timeout=3)
    assert isinstance(d, CliDriver) and d.timeout == 3 and isinstance(d, SlurmDriver)
    with pytest.raises(ValueError, match="cli, pyslurm"):
        make_driver("slurmrestd")


def test_pyslurm_missing_names_the_requirement(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # makes `import pyslurm` fail
    with pytest.raises(PyslurmUnavailableError) as e:
        make_driver("pyslurm")
    msg = str(e.value)
    assert "Slurm 25.11" in msg and "pip install pyslurm" in msg and "'cli' driver" in msg
    assert isinstance(e.value, SlurmError)


def test_pyslurm_too_old_names_the_requirement(monkeypatch):
    old = type(sys)("pyslurm")
    old.__version__ = "18.8.1"
    monkeypatch.setitem(sys.modules, "pyslurm", old)
    with pytest.raises(PyslurmUnavailableError, match="predates"):
        import_pyslurm()


def test_pyslurm_driver_over_a_stand_in(monkeypatch):
    """The driver's mapping, on a minimal stand-in for pyslurm's object API."""
    made = []

    class Desc:
        def __init__(self, **kw):
            self.kw = kw
            made.append(kw)

        def submit(self):
            return 31

    class FakeJob:
        def __init__(self, id, **kw):
            self.id, self.__dict__ = id, {**kw, "id": id}

        def modify(self, desc):
            made.append(("modify", self.id, desc.kw))

    class Jobs:
        @staticmethod
        def load():
            return {31: FakeJob(31, name="a", state="RUNNING", nodes="n[1-2]", num_nodes=2,
                                gres_per_node={"gpu": 2}, comment="dl2d:7", requeue_count=0)}

    class FakeNode:
        def __init__(self, name=None, **kw):
            self.name, self.__dict__ = name, {**kw, "name": name}

    class Nodes:
        @staticmethod
        def load():
            return {"n1": FakeNode("n1", state="IDLE+DRAIN", total_cpus=8, configured_gres={"gpu": 4},
                                   allocated_gres={}, reason="r", partitions=["p"])}

    mod = type(sys)("fakepyslurm")
    mod.Job, mod.Jobs, mod.Nodes, mod.Node, mod.JobSubmitDescription = FakeJob, Jobs, Nodes, FakeNode, Desc
    monkeypatch.setitem(sys.modules, "fakepyslurm", mod)
    d = make_driver("pyslurm", module="fakepyslurm")
    assert d.submit(JobSpec(name="a", command="true", nodes=2, gpus_per_node=2,
                            dl2d_job_id="7")) == "31"
    assert made[0]["gres_per_node"] == "gpu:2" and made[0]["script"] == "#!/bin/sh\ntrue\n"
    assert "user_id" not in made[0] and made[0]["environment"]["USER"] == process_user().name
    if os.geteuid() == 0:  # as another user (root only): its ids, its environment
        assert d.submit(JobSpec(name="b", command="true", user="nobody", qos="q")) == "31"
        nobody = lookup_user("nobody")
        assert (made[-1]["user_id"], made[-1]["group_id"], made[-1]["qos"]) == (nobody.uid, nobody.gid, "q")
        assert made[-1]["environment"]["HOME"] == nobody.home and made[-1]["working_directory"] == nobody.home
    made.clear()
    [job] = d.jobs()
    assert (job.job_id, job.nodes, job.gpus_per_node, job.dl2d_job_id) == ("31", ("n1", "n2"), 2, "7")
    [node] = d.nodes()
    assert node.drained and node.gpus == 4 and node.cpus == 8
    d.shrink("31", 1)
    assert made[-1] == ("modify", 31, {"nodes": 1})


def test_submit_description_kwargs_env_and_signal(monkeypatch):
    monkeypatch.setenv("DL2D_DB_URL", "postgresql://dl2d:hunter2@db/dl2d")
    spec = JobSpec(name="a", script="#!/bin/sh\n", env={"X": "1"}, checkpoint_signal="USR1",
                   checkpoint_signal_secs=30, account="acct", qos="q")
    kw = submit_description_kwargs(spec)
    assert kw["environment"]["X"] == "1" and "DL2D_DB_URL" not in kw["environment"]  # never "ALL"
    assert kw["signal"] == "B:USR1@30" and (kw["account"], kw["qos"]) == ("acct", "q")
    assert "user_id" not in kw and "working_directory" not in kw
    kw = submit_description_kwargs(spec, ALICE, {"X": "1"})
    assert (kw["user_id"], kw["group_id"], kw["working_directory"], kw["environment"]) == (
        1234, 1234, "/home/alice", {"X": "1"})


# -- demo job ---------------------------------------------------------------------------------

def test_demo_job_runs_to_the_end(tmp_path):
    args = ["--epochs", "3", "--checkpoint", str(tmp_path / "c.json"),
            "--progress", str(tmp_path / "p.json"), "--seconds-per-epoch", "0.01"]
    assert demo_job.main(args) == 0
    progress = json.loads((tmp_path / "p.json").read_text())
    assert (progress["epoch"], progress["status"], progress["runs"]) == (3, "done", 1)
    assert demo_job.main(args) == 0  # rerun after done: resumes at the end, no-op
    assert json.loads((tmp_path / "p.json").read_text())["resumed_from"] == 3


def test_demo_job_checkpoints_on_signal_and_resumes(tmp_path):
    files = ["--checkpoint", str(tmp_path / "c.json"), "--progress", str(tmp_path / "p.json")]
    cmd = [sys.executable, "-m", "dl2d.slurm.demo_job", "--epochs", "50",
           "--seconds-per-epoch", "0.05", *files]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        p = tmp_path / "p.json"
        if p.exists() and json.loads(p.read_text())["epoch"] >= 2:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(10) == 0
    saved = json.loads((tmp_path / "c.json").read_text())["epoch"]
    assert json.loads((tmp_path / "p.json").read_text())["status"] == "checkpointed"
    assert 2 <= saved < 50
    assert demo_job.main(["--epochs", str(saved + 2), "--seconds-per-epoch", "0.01", *files]) == 0
    progress = json.loads((tmp_path / "p.json").read_text())
    assert (progress["resumed_from"], progress["epoch"], progress["runs"]) == (saved, saved + 2, 2)
