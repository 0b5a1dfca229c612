"""dl2d.daemon.slurm.jobdir: the batch script (run by bash) and the files of a job's directory."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from dl2d.daemon.backend import Target
from dl2d.daemon.slurm.jobdir import JobDir, batch_script, known_job_ids, target_env


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
    assert out.read_text().splitlines() == [f"5 3 2 {tmp_path}/progress.json",
                                            f"5 1 1 {tmp_path}/progress.json"]
    assert (tmp_path / "checkpoint").is_dir()
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
    (jd.checkpoint_dir).mkdir()
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
    args = (tmp_path / "srun.args").read_text().split()
    assert args[:6] == ["srun", "--ntasks=7", "--ntasks-per-node=3", "--cpus-per-task=2", "--kill-on-bad-exit=1",
                        "--distribution=block"]
    assert out.read_text() == "USR1 60 2.5\n"
    with pytest.raises(ValueError, match="not a variable name"):
        batch_script(5, tmp_path, "true", None, exports={"BAD NAME": "x"})
