"""The conformance trace (pure): a seeded set of short all-reduce jobs whose speed is declared, so the real
world and the twin train them alike.

Each job is the demo training program (dl2d.slurm.demo_job) with ``--speed``: epochs per second by its
workers, taken from the measured throughput of its model at its total batch (dl2d.sim.allreduce) on the
layout Slurm gives ``W`` one-GPU workers: the fewest nodes, the workers spread evenly (dl2d.daemon.slurm.mapping).
The twin trains the same model at the same batch on the servers of its own placement, so the two agree
where the placements do (the report names a slot where they do not). Total epochs are set so that each job
at its asked size takes a few slots: a trace of seconds-long slots stands for one of minutes-long ones.

The JAX jobs (``jax_jobs``) are the JAX recipe of docs/jobs.md as it is written: ``examples/jax_allreduce.py``,
one process a worker (``srun``), resized by checkpoint-restart, submitted as ``--type mlp --workers 2
--max-workers 4`` (a model dl2d does not know). Their speed is not declared: the twin gets it from
``dl2ctl calibrate`` of the real run (dl2d.daemon.conform.worlds), and their start and restart costs from the
same run.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dl2d.core.placement import even_spread
from dl2d.sim import allreduce
from dl2d.workload import catalog
from dl2d.workload.philly import BATCH_PER_GPU

#: What a demo worker asks of Slurm besides its GPU: it sleeps, so a CPU and a little memory.
WORKER = {"gpus": 1, "cpus": 1, "mem_gb": 0.1}
#: A JAX worker's (docs/jobs.md asks 1 CPU and 2G; the local Slurm's nodes hold 16 GB); its class for calibrate.
JAX_WORKER = {"gpus": 1, "cpus": 1, "mem_gb": 1.0}
JAX_LABEL = "jax-mlp"
#: Asked sizes, and how often: Philly's jobs mostly ask for one GPU, a few for a node or more.
ASKED = (1, 2, 4, 8)
ASKED_P = (0.4, 0.25, 0.25, 0.1)


@dataclass(frozen=True)
class ConformJob:
    name: str
    model: str  # one of catalog.ALLREDUCE_MODELS
    batch: float  # total batch, kept at every size
    workers: int  # asked
    epochs: float  # total (exact: the twin and the program are told the same)
    arrival: int  # slot (from the first) at which it is submitted
    speed: tuple[tuple[int, float], ...]  # (workers, epochs per second) up to the largest size
    program: str = "demo"  # "demo" (dl2d.slurm.demo_job at ``speed``) or "jax" (examples/jax_allreduce.py)
    steps: int = 0  # a JAX job's global steps in all
    max_workers: int = 0  # its own bound (0: none but the daemon's)

    def speed_arg(self) -> str:
        return ",".join(f"{w}:{r:.6g}" for w, r in self.speed)


def slurm_layout(workers: int, per_node: int) -> list[int]:
    """Each worker's node index as Slurm lays out ``workers`` one-GPU workers: the fewest nodes, spread evenly
    (dl2d.daemon.slurm.mapping.allocation_for; ``srun --distribution=block``)."""
    _, per = even_spread(workers, per_node)
    return [i // per for i in range(workers)]


def speed_curve(model: str, batch: float, per_node: int, max_workers: int) -> tuple[tuple[int, float], ...]:
    """(workers, epochs per second) for 1..max_workers, on Slurm's layout."""
    layouts = [slurm_layout(w, per_node) for w in range(1, max_workers + 1)]
    rates = allreduce.epoch_rates([model] * len(layouts), [batch] * len(layouts), layouts, [1] * len(layouts))
    return tuple((w, float(r)) for w, r in zip(range(1, max_workers + 1), rates))


#: The JAX recipe's job (docs/jobs.md): a global batch of 12, which splits over 1-4 processes, so at most 4.
JAX_ASKED, JAX_MAX_WORKERS, JAX_BATCH = 2, 4, 12
#: A JAX step's sleep (``--step-seconds``): the tiny model trained as slowly as a real one, so that its speed,
#: not its start, is most of its time; and its steps in all.
JAX_STEP_SECONDS, JAX_STEPS = 0.05, 120


def make_trace(num_jobs: int = 12, seed: int = 0, slot_seconds: float = 3.0, per_node: int = 4,
               max_workers: int = 16, arrive_within: int = 8, slots: tuple[int, int] = (3, 10),
               jax_jobs: int = 0) -> list[ConformJob]:
    """``num_jobs`` demo jobs arriving over the first ``arrive_within`` slots, each taking ``slots`` (uniform)
    slots at its asked size; then ``jax_jobs`` JAX jobs arriving over the same slots (their own draws, so the
    demo jobs are the same with or without them)."""
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.integers(0, arrive_within, num_jobs))
    arrivals -= arrivals[0]  # the first arrives at once
    jobs = []
    for i in range(num_jobs):
        model = str(rng.choice(catalog.ALLREDUCE_MODELS))
        asked = int(rng.choice(ASKED, p=ASKED_P))
        batch = float(BATCH_PER_GPU[model] * asked)
        curve = speed_curve(model, batch, per_node, max_workers)
        duration = float(rng.uniform(*slots)) * slot_seconds
        epochs = float(f"{duration * dict(curve)[asked]:.4g}")
        jobs.append(ConformJob(f"cf-{i:02d}", model, batch, asked, epochs, int(arrivals[i]), curve))
    jax_rng = np.random.default_rng([seed, 1])
    for i, arrival in enumerate(np.sort(jax_rng.integers(1, max(arrive_within, 2), jax_jobs))):
        jobs.append(ConformJob(f"cf-jax-{i}", "mlp", float(JAX_BATCH), JAX_ASKED, 1.0, int(arrival), (),
                               program="jax", steps=JAX_STEPS, max_workers=JAX_MAX_WORKERS))
    return jobs


def demo_command(job: ConformJob, python: str) -> str:
    """The job's command: the demo program at its declared speed, saving to the job's checkpoint directory."""
    return (f"exec {shlex.quote(python)} -m dl2d.slurm.demo_job --epochs {job.epochs:g} --speed {job.speed_arg()}"
            ' --checkpoint "$DL2D_CHECKPOINT_DIR/ckpt.json" --progress "$DL2D_PROGRESS_FILE"')


def jax_example() -> Path:
    """examples/jax_allreduce.py of the checkout dl2d runs from (as docs/jobs.md installs it beside the venv)."""
    return Path(__file__).resolve().parents[3] / "examples" / "jax_allreduce.py"


def jax_command(job: ConformJob, python: str) -> str:
    """The JAX recipe's command (docs/jobs.md), by absolute paths: the batch script runs it once a worker."""
    return (f"{shlex.quote(python)} {shlex.quote(str(jax_example()))} --steps {job.steps} "
            f"--step-seconds {JAX_STEP_SECONDS:g}")


def submission(job: ConformJob, python: str, owner: str) -> dict[str, Any]:
    """The job's spec as ``dl2ctl submit`` writes it. A demo job: ``--arch allreduce --type MODEL --batch-size B
    --workers W --launch once``, one process, which the daemon restarts from its checkpoint at a new size. A JAX
    job: the recipe's ``--arch allreduce --type mlp --epochs 1 --workers 2 --max-workers 4`` (one process a
    worker), labelled ``jax-mlp`` for ``dl2ctl calibrate``."""
    if job.program == "jax":
        return {"name": job.name, "owner": owner, "kind": "allreduce", "job_type": job.model,
                "workers": job.workers, "max_workers": job.max_workers, "total_epochs": job.epochs,
                "command": jax_command(job, python), "label": JAX_LABEL, "worker": dict(JAX_WORKER),
                "time_limit_min": 10}
    return {"name": job.name, "owner": owner, "kind": "allreduce", "job_type": job.model, "batch_size": job.batch,
            "workers": job.workers, "total_epochs": job.epochs, "command": demo_command(job, python),
            "launch": "once", "worker": dict(WORKER), "time_limit_min": 10}
