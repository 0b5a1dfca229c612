"""dl2d.daemon.slurm.jobdir: the batch script (run by bash) and the files of a job's directory."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess

import pytest

from dl2d.core.files import SecretFileError
from dl2d.daemon.backend import Target
from dl2d.daemon.slurm.jobdir import (
    MAX_JOB_FILE_BYTES,
    JobDir,
    batch_script,
    known_job_ids,
    read_job_file,
    target_env,
)
from dl2d.daemon.slurm.jobreport import JobReportError


def test_batch_script_exports_paths_and_reads_the_target_each_start(tmp_path):
    """Run the generated script with bash: the command sees the job's variables and the
    size from target.env, re-read at every start (a requeued job sees its new size)."""
    out = tmp_path / "out.txt"
    cmd = f'echo "$DL2D_JOB_ID $DL2D_WORKERS $DL2D_PS $DL2D_PROGRESS_FILE" >> {out}'
    script = tmp_path / "job.sh"
    script.write_text(batch_script(5, tmp_path, cmd, None))
    (tmp_path / "target.env").write_text(target_env(3, 2))
    subprocess.run(["bash", str(script)], check=True, timeout=10)
    (tmp_path / "target.env").write_text(target_env(1, 1))
    subprocess.run(["bash", str(script)], check=True, timeout=10)
    assert out.read_text().splitlines() == [f"5 3 2 {tmp_path}/job/progress.json",  # in the job's own directory
                                            f"5 1 1 {tmp_path}/job/progress.json"]
    assert (tmp_path / "job" / "checkpoint").is_dir()
    with pytest.raises(ValueError):
        batch_script(5, tmp_path, None, None)


def test_batch_script_quotes_commands_with_quotes(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(batch_script(1, tmp_path, "echo \"it's $((1+1))\"", None))
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=10)
    assert out.stdout == "it's 2\n"


def test_job_dir_files(tmp_path):
    jd = JobDir(tmp_path / "jobs" / "7")
    assert jd.record() == {} and jd.progress() is None and jd.coordinator() == (None, None)
    jd.save_record({"slurm_job_id": "101"})
    assert jd.record() == {"slurm_job_id": "101"} and known_job_ids(tmp_path / "jobs") == [7]
    jd.write_target(Target(2, 1, ("n2", "n1"), ("n2",)), ("n2", "n2", "n1"))
    assert (jd.path / "hostfile").read_text().split() == ["n2", "n2", "n1"]
    assert json.loads((jd.path / "target.json").read_text()) == {
        "workers": 2, "ps": 1, "worker_nodes": ["n2", "n1"], "ps_nodes": ["n2"]}
    jd.write_target(Target(3, 1), None)
    assert "DL2D_WORKERS=3" in (jd.path / "target.env").read_text()
    assert "DL2D_HOSTFILE" not in (jd.path / "target.env").read_text()
    (jd.checkpoint_dir).mkdir(parents=True)
    (jd.checkpoint_dir / "coordinator.json").write_text('{"address": "node1:4000"}')
    os.utime(jd.checkpoint_dir / "coordinator.json", (1000.0, 1000.0))
    assert jd.coordinator() == ({"address": "node1:4000"}, 1000.0)
    (jd.checkpoint_dir / "coordinator.json").write_text('{"addr')  # being written: not there yet
    assert jd.coordinator() == (None, None)


def test_batch_script_starts_one_process_per_worker_with_srun_and_exports_the_contract(tmp_path):
    """With srun_cpus_per_task the script runs srun with $DL2D_WORKERS tasks spread evenly over the
    allocation's nodes (a stand-in srun on PATH records its arguments and runs the program once)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\necho "srun $*" > "$DL2D_JOB_DIR/srun.args"\n'
                                  'while [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    out = tmp_path / "out.txt"
    script = tmp_path / "job.sh"
    script.write_text(batch_script(5, tmp_path, f'echo "$DL2D_CHECKPOINT_SIGNAL $DL2D_CHECKPOINT_DEADLINE_S '
                                               f'$DL2D_TOTAL_EPOCHS" > {out}', None, srun_cpus_per_task=2,
                                   exports={"DL2D_CHECKPOINT_SIGNAL": "USR1", "DL2D_CHECKPOINT_DEADLINE_S": "60",
                                            "DL2D_TOTAL_EPOCHS": "2.5"}))
    (tmp_path / "target.env").write_text(target_env(7, 0))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NUM_NODES": "3"}
    subprocess.run(["bash", str(script)], check=True, timeout=10, env=env)
    args = (tmp_path / "job" / "srun.args").read_text().split()
    assert args[:6] == ["srun", "--ntasks=7", "--ntasks-per-node=3", "--cpus-per-task=2", "--kill-on-bad-exit=1",
                        "--distribution=block"]
    assert out.read_text() == "USR1 60 2.5\n"
    with pytest.raises(ValueError, match="not a variable name"):
        batch_script(5, tmp_path, "true", None, exports={"BAD NAME": "x"})


def test_the_job_secret_is_made_once_private_and_kept(tmp_path):
    jd = JobDir(tmp_path / "jobs" / "7")
    assert jd.secret() is None  # a job submitted before there were secrets
    secret = jd.write_secret()
    assert len(secret) == 64 and int(secret, 16) >= 0
    assert jd.secret_file.stat().st_mode & 0o777 == 0o600
    assert jd.write_secret() == secret == jd.secret()  # kept across restarts and requeues
    assert jd.secret_file == jd.owned_dir / "job.secret" and os.listdir(jd.owned_dir) == ["job.secret"]
    jd.secret_file.chmod(0o640)
    with pytest.raises(SecretFileError, match="must not be accessible by group or others"):
        jd.secret()
    with pytest.raises(SecretFileError, match="must not be accessible by group or others"):
        jd.write_secret()  # an existing file is kept, never silently replaced
    jd.secret_file.unlink()
    (tmp_path / "elsewhere").write_text("x" * 64)
    (tmp_path / "elsewhere").chmod(0o600)
    jd.secret_file.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SecretFileError, match="symbolic link"):
        jd.secret()


def test_batch_script_exports_the_secret_file(tmp_path):
    out = tmp_path / "out.txt"
    script = tmp_path / "job.sh"
    script.write_text(batch_script(5, tmp_path, f'echo "$DL2D_JOB_SECRET_FILE" > {out}', None))
    subprocess.run(["bash", str(script)], check=True, timeout=10)
    assert out.read_text().strip() == str(tmp_path / "job" / "job.secret") == str(JobDir(tmp_path).secret_file)


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")


@root_only
def test_prepare_gives_the_job_its_own_directory_and_nothing_else(tmp_path):
    """The daemon's part stays the daemon's (0755, files 0644 whatever the umask); the job's part is its owner's
    (0700), with checkpoint/ and whatever the daemon put there for the job alone (a secret file); links the job
    planted are not followed and a hard link to someone else's file does not change hands."""
    nobody = pwd.getpwnam("nobody")
    jd = JobDir(tmp_path / "jobs" / "7")
    old = os.umask(0o027)  # the unit's UMask
    try:
        jd.save_record({"slurm_job_id": "1"})
        jd.write_target(Target(2, 1, ("n1", "n1"), ("n1",)), ("n1", "n1", "n1"))
        jd.owned_dir.mkdir(parents=True)
        (jd.owned_dir / "job.secret").write_text("s" * 64)  # what the daemon writes for the job, before prepare
        assert jd.prepare(nobody.pw_uid, nobody.pw_gid) == jd.owned_dir
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(os.lstat(p).st_mode)  # noqa: E731
    assert mode(jd.path) == 0o755 and os.stat(jd.path).st_uid == 0
    for name in ("target.env", "target.json", "hostfile"):
        assert mode(jd.path / name) == 0o644 and os.stat(jd.path / name).st_uid == 0, name
    for p in (jd.owned_dir, jd.checkpoint_dir, jd.owned_dir / "job.secret"):
        assert (os.stat(p).st_uid, os.stat(p).st_gid) == (nobody.pw_uid, nobody.pw_gid), p
    assert mode(jd.owned_dir) == mode(jd.checkpoint_dir) == 0o700
    # the job plants a link to a file of root's and a hard link to another; a restart prepares again
    victim = tmp_path / "victim"
    victim.write_text("root's")
    (jd.owned_dir / "progress.json").symlink_to(victim)
    os.link(victim, jd.owned_dir / "hard")
    (jd.owned_dir / "new.secret").write_text("x")  # written by the daemon for this run
    jd.prepare(nobody.pw_uid, nobody.pw_gid)
    assert os.stat(victim).st_uid == 0 and os.lstat(jd.owned_dir / "progress.json").st_uid == 0
    assert os.stat(jd.owned_dir / "new.secret").st_uid == nobody.pw_uid
    # ... and the daemon does not read through the link: it refuses the file, naming it (the job fails with it)
    with pytest.raises(JobReportError, match="progress.json .*is a symbolic link"):
        jd.progress()
    # without a user (run_jobs_as = "daemon") the job's directory stays the daemon's
    other = JobDir(tmp_path / "jobs" / "8")
    other.prepare()
    assert os.stat(other.owned_dir).st_uid == os.geteuid() and mode(other.owned_dir) == 0o700


def test_the_daemon_reads_what_a_job_wrote_only_as_a_bounded_regular_file(tmp_path):
    jd = JobDir(tmp_path / "jobs" / "7")
    jd.prepare()
    jd.progress_file.write_text('{"epoch": 2}')
    os.utime(jd.progress_file, (1000.0, 1000.0))
    assert jd.progress_and_mtime() == ({"epoch": 2}, 1000.0)
    assert read_job_file(jd.path, "job", "progress.json") == (b'{"epoch": 2}', 1000.0)
    jd.progress_file.write_text(" " * (MAX_JOB_FILE_BYTES + 1))  # larger than any progress file
    with pytest.raises(JobReportError, match="more than the 1048576 a job's file may have"):
        read_job_file(jd.path, "job", "progress.json")
    jd.progress_file.unlink()
    assert jd.progress_and_mtime() == (None, None)  # none (yet): nothing to refuse
    os.mkfifo(jd.progress_file)  # a FIFO nobody writes: not read, not waited on, refused
    with pytest.raises(JobReportError, match="progress.json is not a regular file"):
        jd.progress()
    jd.progress_file.unlink()
    jd.progress_file.write_bytes(b"\xff\xfe")  # not text: nothing
    assert jd.progress() is None
    # the checkpoint directory replaced by a link to another directory: its coordinator.json is not read
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "coordinator.json").write_text('{"address": "evil:1"}')
    jd.checkpoint_dir.rmdir()
    jd.checkpoint_dir.symlink_to(elsewhere)
    with pytest.raises(JobReportError, match="checkpoint/coordinator.json .*symbolic link"):
        jd.coordinator()
