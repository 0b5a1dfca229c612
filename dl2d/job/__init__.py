"""The job side of dl2d's job contract (docs/jobs.md): a training script imports this to learn the size dl2d
gave it, save and exit on the checkpoint signal, resume where its last checkpoint ends, and report progress.

    import dl2d.job
    run = dl2d.job.start(total_steps=1000)          # the contract, the signal handler, the progress file
    ...  # initialise the framework's distributed runtime with run.contract.coordinator, .world_size, .rank
    step = restored_step or 0
    run.resumed(step)
    while step < run.total_steps:
        step += 1; train_one_step(step)
        run.step_done(step, samples=...)
        if run.stop_requested and all_ranks_agree():     # one all-reduce of the flag
            save_checkpoint(step); run.exit_checkpointed(step)
    run.finished(step)

It imports no framework (nor anything of dl2d but atomic file writes), so it loads in a second.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, NoReturn

from dl2d.job.checkpoints import Checkpoint, Checkpoints
from dl2d.job.contract import (
    EXIT_CHECKPOINTED,
    JobContract,
    JobContractError,
    contract_from_env,
)
from dl2d.job.progress import ProgressFile

if TYPE_CHECKING:
    from dl2d.job.batch import BatchPlan, GradientNoise

__all__ = ["Checkpoint", "Checkpoints", "EXIT_CHECKPOINTED", "JobContract", "JobContractError", "JobRun",
           "contract_from_env", "start"]


class JobRun:
    """One process of one run of a job: its contract, whether it was asked to stop, its progress."""

    def __init__(self, contract: JobContract, total_steps: int, *, install_handlers: bool = True,
                 progress_interval_s: float = 0.5) -> None:
        if total_steps < 1:
            raise ValueError(f"total_steps must be at least 1, got {total_steps}")
        self.contract = contract
        self.total_steps = int(total_steps)
        self.stop_signal: int | None = None  # the signal that asked us to stop, once one did
        self.stop_requested_at: float | None = None  # time.monotonic() of it
        self.progress = ProgressFile(contract.progress_file, write=contract.is_primary,
                                     total_steps=total_steps, epochs=contract.total_epochs or 1.0,
                                     world_size=contract.world_size, min_interval_s=progress_interval_s)
        self.checkpoints = Checkpoints(contract.checkpoint_dir)
        if install_handlers:
            for sig in {contract.checkpoint_signal, signal.SIGTERM}:
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
            self.stop_requested_at = time.monotonic()

    @property
    def stop_requested(self) -> bool:
        """This process was asked to save and exit. Ranks get the signal at slightly different moments:
        agree on the step to stop at (all-reduce the flag, max) before saving."""
        return self.stop_signal is not None

    def resumed(self, step: int) -> None:
        """Say the run starts at global step ``step`` (what its checkpoint holds; 0: from scratch). Rank 0
        counts the steps the last run reported beyond it as lost."""
        if not 0 <= step <= self.total_steps:
            raise ValueError(f"resume step {step} outside 0..{self.total_steps}")
        self.progress.resumed(step)

    @property
    def run_number(self) -> int | None:
        """Which run of the job this is (1: the first), counted in the progress file's ``runs`` after
        :meth:`resumed`. Slurm's ``SLURM_RESTART_COUNT`` is no such count: dl2d restarts a job as a new Slurm
        job (``restart_method = "resubmit"``, the default), whose count starts at 0 again. Only rank 0 reads the
        progress file, so other ranks (and any rank before :meth:`resumed`) get None."""
        runs = self.progress.report.get("runs")
        return runs if self.progress.path is not None and isinstance(runs, int) else None

    def batch_plan(self, default_batch: float, max_local_batch: float) -> "BatchPlan":
        """This run's split of its total batch over its workers (dl2d.job.batch.plan): the batch dl2d gave it
        (``DL2D_BATCH_SIZE``), else ``default_batch``; at most the job's own per-GPU limit (``DL2D_MAX_LOCAL_BATCH``,
        else ``max_local_batch``) in a pass, gradient accumulation beyond it."""
        from dl2d.job.batch import plan

        c = self.contract
        return plan(c.batch_size or default_batch, c.world_size, c.max_local_batch or max_local_batch,
                    c.max_batch_size)

    def report_batch(self, total_batch: float, noise: "GradientNoise | None" = None) -> None:
        """Tell dl2d the total batch this run trains at and, once measured, its gradient noise (``grad_sqr``,
        ``grad_var``: dl2d.job.batch.GradientNoise at the job's submitted batch); carried in every report after."""
        fields: dict = {"batch_size": float(total_batch)}
        if noise is not None and noise.known:
            fields.update(grad_sqr=noise.sqr, grad_var=noise.var)
        news = any(k not in self.progress.report for k in fields) or \
            self.progress.report.get("batch_size") != fields["batch_size"]
        self.progress.report.update(fields)
        if news:  # a new batch, or the first noise: said now (else with the next step's report)
            self.progress.write_now()

    def step_done(self, step: int, samples: int | None = None) -> None:
        """Global step ``step`` is done (written at most every ``progress_interval_s``)."""
        self.progress.update("running", step, samples)

    def checkpointed(self, step: int) -> int:
        """The checkpoint of ``step`` is saved on the signal: report it; returns the exit status to use."""
        self.progress.update("checkpointed", step, force=True)
        if self.stop_signal == signal.SIGTERM:
            return 128 + signal.SIGTERM
        return EXIT_CHECKPOINTED

    def exit_checkpointed(self, step: int) -> NoReturn:
        """:meth:`checkpointed`, then exit with its status."""
        code = self.checkpointed(step)
        sys.stdout.flush()
        sys.stderr.flush()
        sys.exit(code)

    def finished(self, step: int) -> None:
        """The job trained all its steps: dl2d counts it done."""
        self.progress.update("done", step, force=True)


def start(total_steps: int, *, checkpoint_dir: str | os.PathLike | None = None,
          env: Mapping[str, str] | None = None, install_handlers: bool = True) -> JobRun:
    """Read the contract from the environment (``env``: os.environ) and set the run up.
    ``checkpoint_dir`` is used when dl2d gives none (a script run by hand). JobContractError names what
    is wrong with the environment."""
    contract = contract_from_env(os.environ if env is None else env,
                                 checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None)
    return JobRun(contract, total_steps, install_handlers=install_handlers)
