"""Unit tests without Slurm: CLI driver over a fake runner, backoff, demo job, driver selection
and the pyslurm driver's missing-dependency path."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dl2d.slurm import demo_job
from dl2d.slurm.backoff import BackoffPolicy, RetryingDriver, backoff_delay, retry
from dl2d.slurm.cli_driver import CliDriver, parse_sbatch_output, sbatch_args
from dl2d.slurm.driver import JobSpec, SlurmDriver, SlurmError, SlurmUnavailable, make_driver
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

    def __call__(self, argv, stdin, env, timeout):
        self.calls.append((list(argv), stdin, dict(env)))
        answer = self.answers.pop(0) if self.answers else (0, "", "")
        if isinstance(answer, BaseException):
            raise answer
        rc, out, err = answer
        return subprocess.CompletedProcess(list(argv), rc, out, err)


def test_sbatch_args_cover_the_spec():
    spec = JobSpec(name="j", command="echo hi", nodes=3, gpus_per_node=2, cpus_per_task=4,
                   ntasks_per_node=1, time_limit_min=30, output="/o/%j.out", workdir="/w",
                   partition="gpu", nodelist=("n1", "n2"), exclude=("n9",), dl2d_job_id="42",
                   checkpoint_signal="USR1", checkpoint_signal_secs=90, requeue=False)
    args = sbatch_args(spec)
    for expected in ["--parsable", "--job-name=j", "--nodes=3", "--gres=gpu:2",
                     "--cpus-per-task=4", "--ntasks-per-node=1", "--time=30",
                     "--output=/o/%j.out", "--chdir=/w", "--partition=gpu",
                     "--signal=B:USR1@90", "--no-requeue", "--nodelist=n1,n2", "--exclude=n9",
                     "--comment=dl2d:42", "--wrap=echo hi", "--export=ALL"]:
        assert expected in args
    minimal = sbatch_args(JobSpec(name="m", script="#!/bin/sh\ntrue\n", checkpoint_signal=None))
    assert "--requeue" in minimal and not any(a.startswith(("--wrap", "--gres", "--signal"))
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


def test_submit_passes_script_and_env():
    run = FakeRunner((0, "77\n", ""))
    d = CliDriver(runner=run, env={"SLURM_CONF": "/x/slurm.conf"})
    job_id = d.submit(JobSpec(name="s", script="#!/bin/sh\ntrue\n", env={"A": "1,2"}))
    argv, stdin, env = run.calls[0]
    assert job_id == "77" and argv[0] == "sbatch" and stdin == "#!/bin/sh\ntrue\n"
    assert env["A"] == "1,2" and env["SLURM_CONF"] == "/x/slurm.conf"


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
    [job] = d.jobs()
    assert (job.job_id, job.nodes, job.gpus_per_node, job.dl2d_job_id) == ("31", ("n1", "n2"), 2, "7")
    [node] = d.nodes()
    assert node.drained and node.gpus == 4 and node.cpus == 8
    d.shrink("31", 1)
    assert made[-1] == ("modify", 31, {"nodes": 1})


def test_submit_description_kwargs_env_and_signal():
    kw = submit_description_kwargs(JobSpec(name="a", script="#!/bin/sh\n", env={"X": "1"},
                                           checkpoint_signal="USR1", checkpoint_signal_secs=30))
    assert kw["environment"] == {"ALL": True, "X": "1"} and kw["signal"] == "B:USR1@30"


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
