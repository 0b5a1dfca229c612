"""What dl2d hands a training job when it starts it: the job contract (docs/jobs.md), read from the
environment. Pure: :func:`contract_from_env` takes the mapping, so a test or a script run by hand passes
its own.

dl2d's batch script exports the ``DL2D_*`` variables once per run; Slurm's ``srun`` adds each process's rank
(``SLURM_PROCID``), the number of processes (``SLURM_NTASKS``) and its rank on the node (``SLURM_LOCALID``).
A script started by hand, outside dl2d and Slurm, is one process of a world of one, with the checkpoint
directory it names itself.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from dl2d.core.signals import checkpoint_signal

#: The first port dl2d's coordinator ports are counted from (:func:`coordinator_port`).
COORDINATOR_PORT_BASE = 29500
#: How many ports above the base they spread over.
COORDINATOR_PORT_SPAN = 10000
#: The exit status of a job that saved its checkpoint on the checkpoint signal: it asks to be started
#: again (its progress file says ``checkpointed``).
EXIT_CHECKPOINTED = 0
#: Seconds a job has to save and exit after the checkpoint signal when dl2d does not say
#: (``[slurm] checkpoint_timeout_s``'s default).
DEFAULT_DEADLINE_S = 60.0


class JobContractError(ValueError):
    """An environment variable of the job contract holds something it cannot: the message names it."""


@dataclass(frozen=True)
class JobContract:
    """One process's view of its job (the fields are documented in docs/jobs.md)."""

    job_id: str | None  # dl2d's id of the job; None outside dl2d
    checkpoint_dir: Path  # checkpoints live here, kept across restarts and resizes
    progress_file: Path | None  # where rank 0 reports progress; None: nowhere
    workers: int  # the size dl2d gave this run (DL2D_WORKERS)
    ps: int  # parameter servers of a PS job (0 for an all-reduce job)
    rank: int  # this process, 0 .. world_size - 1
    world_size: int  # processes of this run
    local_rank: int  # this process's rank on its node
    coordinator: str | None  # host:port where rank 0 runs the framework's rendezvous; None for a world of one
    checkpoint_signal: signal.Signals  # the signal that asks the job to save and exit
    deadline_s: float  # seconds it has to do so before it is killed
    total_epochs: float | None  # the epochs the job was submitted for (DL2D_TOTAL_EPOCHS)
    restart_count: int  # how often Slurm requeued this Slurm job (0: its first run)
    #: the total batch of this run (DL2D_BATCH_SIZE: an adaptive job's, chosen by dl2d at each start); None: the
    #: job's own
    batch_size: float | None = None
    #: an adaptive job's submitted batch, the one its learning rate is tuned for (DL2D_INITIAL_BATCH_SIZE), and
    #: its own limits (DL2D_MAX_BATCH_SIZE, DL2D_MAX_LOCAL_BATCH); None where not given
    initial_batch_size: float | None = None
    max_batch_size: float | None = None
    max_local_batch: float | None = None

    @property
    def is_primary(self) -> bool:
        """Rank 0: the process that writes progress and commits checkpoints."""
        return self.rank == 0


def _int(env: Mapping[str, str], name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise JobContractError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise JobContractError(f"{name}={raw!r} is below {minimum}")
    return value


def _float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise JobContractError(f"{name}={raw!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise JobContractError(f"{name}={raw!r} must be a positive, finite number")
    return value


def parse_signal(raw: str) -> signal.Signals:
    """``USR1``, ``SIGUSR1`` or ``10`` -> the signal (dl2d.core.jobs.checkpoint_signal, the daemon's rule too);
    JobContractError for anything else."""
    try:
        return checkpoint_signal(raw)
    except ValueError as e:
        raise JobContractError(f"DL2D_CHECKPOINT_SIGNAL={e}") from None


def coordinator_port(slurm_job_id: int, restart_count: int) -> int:
    """The rendezvous port of a run: derived from the Slurm job id, so that every process of the run
    computes the same one without talking, and moved on by each requeue (the last run's port may still be
    held by a socket closing)."""
    return COORDINATOR_PORT_BASE + (slurm_job_id * 7 + restart_count) % COORDINATOR_PORT_SPAN


def coordinator_address(env: Mapping[str, str], world_size: int, restart_count: int) -> str | None:
    """Where rank 0 listens: ``DL2D_COORDINATOR`` (host:port) when set; else the node ``srun`` was started
    from (``SLURM_LAUNCH_NODE_IPADDR``: the batch host, the first node of the allocation, where rank 0
    runs) at :func:`coordinator_port`; None for a world of one."""
    given = env.get("DL2D_COORDINATOR", "").strip()
    if given:
        host, sep, port = given.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise JobContractError(f"DL2D_COORDINATOR={given!r} is not host:port")
        return given
    if world_size == 1:
        return None
    host = env.get("SLURM_LAUNCH_NODE_IPADDR", "").strip()
    job = _int(env, "SLURM_JOB_ID", None)
    if not host or job is None:
        raise JobContractError(
            f"a world of {world_size} processes needs DL2D_COORDINATOR, or SLURM_LAUNCH_NODE_IPADDR and "
            "SLURM_JOB_ID (set by srun)")
    return f"{host}:{coordinator_port(job, restart_count)}"


def contract_from_env(env: Mapping[str, str], checkpoint_dir: str | Path | None = None) -> JobContract:
    """The job contract from ``env``. ``checkpoint_dir``: where to keep checkpoints when dl2d does not say
    (``DL2D_CHECKPOINT_DIR`` wins). JobContractError names the variable that is wrong or missing."""
    ckpt = env.get("DL2D_CHECKPOINT_DIR", "").strip() or (str(checkpoint_dir) if checkpoint_dir else "")
    if not ckpt:
        raise JobContractError("no checkpoint directory: DL2D_CHECKPOINT_DIR is not set (dl2d sets it) and "
                               "the script named none")
    world = _int(env, "SLURM_NTASKS", None, minimum=1)
    workers = _int(env, "DL2D_WORKERS", None, minimum=0)
    if world is None:
        world = 1  # one process: started by hand, or by the batch script itself
    rank = _int(env, "SLURM_PROCID", 0)
    assert rank is not None
    if rank >= world:
        raise JobContractError(f"SLURM_PROCID={rank} is not below SLURM_NTASKS={world}")
    restarts = _int(env, "SLURM_RESTART_COUNT", 0) or 0
    progress = env.get("DL2D_PROGRESS_FILE", "").strip()
    return JobContract(
        job_id=env.get("DL2D_JOB_ID") or None,
        checkpoint_dir=Path(ckpt),
        progress_file=Path(progress) if progress else None,
        workers=workers if workers is not None else world,
        ps=_int(env, "DL2D_PS", 0) or 0,
        rank=rank,
        world_size=world,
        local_rank=_int(env, "SLURM_LOCALID", 0) or 0,
        coordinator=coordinator_address(env, world, restarts),
        checkpoint_signal=parse_signal(env.get("DL2D_CHECKPOINT_SIGNAL") or "USR1"),
        deadline_s=_float(env, "DL2D_CHECKPOINT_DEADLINE_S") or DEFAULT_DEADLINE_S,
        total_epochs=_float(env, "DL2D_TOTAL_EPOCHS"),
        restart_count=restarts,
        batch_size=_float(env, "DL2D_BATCH_SIZE"),
        initial_batch_size=_float(env, "DL2D_INITIAL_BATCH_SIZE"),
        max_batch_size=_float(env, "DL2D_MAX_BATCH_SIZE"),
        max_local_batch=_float(env, "DL2D_MAX_LOCAL_BATCH"),
    )
