"""dl2d.job.contract: what a process reads from the environment dl2d and srun give it."""

from __future__ import annotations

import signal

import pytest

from dl2d.job.contract import (
    COORDINATOR_PORT_BASE,
    JobContractError,
    contract_from_env,
    coordinator_port,
)

SRUN = {"DL2D_JOB_ID": "7", "DL2D_CHECKPOINT_DIR": "/shared/jobs/7/checkpoint",
        "DL2D_PROGRESS_FILE": "/shared/jobs/7/progress.json", "DL2D_WORKERS": "3", "DL2D_PS": "0",
        "DL2D_CHECKPOINT_SIGNAL": "USR2", "DL2D_CHECKPOINT_DEADLINE_S": "45", "DL2D_TOTAL_EPOCHS": "2.5",
        "SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "1234",
        "SLURM_LAUNCH_NODE_IPADDR": "10.1.2.3", "SLURM_RESTART_COUNT": "1"}


def test_a_process_started_by_dl2ds_srun_knows_its_rank_size_coordinator_and_deadline():
    c = contract_from_env(SRUN)
    assert (c.job_id, c.rank, c.world_size, c.local_rank, c.workers, c.ps) == ("7", 2, 3, 0, 3, 0)
    assert str(c.checkpoint_dir) == "/shared/jobs/7/checkpoint" and str(c.progress_file).endswith("progress.json")
    assert c.coordinator == f"10.1.2.3:{coordinator_port(1234, 1)}"
    assert (c.checkpoint_signal, c.deadline_s, c.total_epochs, c.restart_count) == (signal.SIGUSR2, 45.0, 2.5, 1)
    assert not c.is_primary and contract_from_env({**SRUN, "SLURM_PROCID": "0"}).is_primary


def test_the_coordinator_port_is_the_same_for_every_rank_and_moves_on_with_each_requeue():
    ports = {coordinator_port(1234, r) for r in range(5)}
    assert len(ports) == 5 and all(COORDINATOR_PORT_BASE <= p < 65536 for p in ports)
    assert contract_from_env({**SRUN, "DL2D_COORDINATOR": "head:4000"}).coordinator == "head:4000"


def test_a_script_run_by_hand_is_a_world_of_one_with_the_directory_it_names(tmp_path):
    c = contract_from_env({}, checkpoint_dir=tmp_path)
    assert (c.rank, c.world_size, c.coordinator, c.progress_file, c.job_id) == (0, 1, None, None, None)
    assert c.checkpoint_dir == tmp_path and c.checkpoint_signal == signal.SIGUSR1 and c.deadline_s == 60.0


@pytest.mark.parametrize("change, names", [
    ({"SLURM_PROCID": "3"}, "SLURM_PROCID=3 is not below SLURM_NTASKS=3"),
    ({"SLURM_NTASKS": "zero"}, "SLURM_NTASKS='zero' is not an integer"),
    ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS='0' is below 1"),
    ({"DL2D_COORDINATOR": "nohost"}, "DL2D_COORDINATOR='nohost' is not host:port"),
    ({"DL2D_COORDINATOR": "h:70000"}, "DL2D_COORDINATOR='h:70000' is not host:port"),
    ({"DL2D_CHECKPOINT_SIGNAL": "USR9"}, "DL2D_CHECKPOINT_SIGNAL='USR9' is not a signal"),
    ({"DL2D_CHECKPOINT_SIGNAL": "9"}, "DL2D_CHECKPOINT_SIGNAL='9' cannot be caught by a job"),
    ({"DL2D_CHECKPOINT_DEADLINE_S": "-1"}, "DL2D_CHECKPOINT_DEADLINE_S='-1' must be a positive"),
    ({"DL2D_CHECKPOINT_DEADLINE_S": "nan"}, "DL2D_CHECKPOINT_DEADLINE_S='nan' must be a positive"),
    ({"SLURM_LAUNCH_NODE_IPADDR": ""}, "a world of 3 processes needs DL2D_COORDINATOR"),
    ({"DL2D_CHECKPOINT_DIR": ""}, "no checkpoint directory"),
])
def test_a_bad_environment_is_refused_naming_the_variable(change, names):
    with pytest.raises(JobContractError, match=names.replace("(", r"\(").replace(")", r"\)")):
        contract_from_env({**SRUN, **change})
