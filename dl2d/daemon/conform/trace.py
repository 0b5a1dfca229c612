"""The conformance trace (pure): a seeded set of short all-reduce jobs whose speed is declared, so the real
world and the twin train them alike.

Each job is the demo training program (dl2d.slurm.demo_job) with ``--speed``: epochs per second by its
workers, taken from the measured throughput of its model at its total batch (dl2d.sim.allreduce) on the
layout Slurm gives ``W`` one-GPU workers: the fewest nodes, the workers spread evenly (dl2d.daemon.slurm.mapping).
The twin trains the same model at the same batch on the servers of its own placement, so the two agree
where the placements do (the report names a slot where they do not). Total epochs are set so that each job
at its asked size takes a few slots: a trace of seconds-long slots stands for one of minutes-long ones.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl2d.core.placement import even_spread
from dl2d.sim import allreduce
from dl2d.workload import catalog
from dl2d.workload.philly import BATCH_PER_GPU

#: What a demo worker asks of Slurm besides its GPU: it sleeps, so a CPU and a little memory.
WORKER = {"gpus": 1, "cpus": 1, "mem_gb": 0.1}
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


def make_trace(num_jobs: int = 12, seed: int = 0, slot_seconds: float = 3.0, per_node: int = 4,
               max_workers: int = 16, arrive_within: int = 8, slots: tuple[int, int] = (3, 10)) -> list[ConformJob]:
    """``num_jobs`` jobs arriving over the first ``arrive_within`` slots, each taking ``slots`` (uniform) slots
    at its asked size."""
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
    return jobs


def demo_command(job: ConformJob, python: str) -> str:
    """The job's command: the demo program at its declared speed, saving to the job's checkpoint directory."""
    return (f"exec {shlex.quote(python)} -m dl2d.slurm.demo_job --epochs {job.epochs:g} --speed {job.speed_arg()}"
            ' --checkpoint "$DL2D_CHECKPOINT_DIR/ckpt.json" --progress "$DL2D_PROGRESS_FILE"')


def submission(job: ConformJob, python: str, owner: str) -> dict[str, Any]:
    """The job's spec as ``dl2ctl submit`` writes it (``--arch allreduce --type MODEL --batch-size B --workers W
    --launch once``): one process, which the daemon restarts from its checkpoint at a new size."""
    return {"name": job.name, "owner": owner, "kind": "allreduce", "job_type": job.model, "batch_size": job.batch,
            "workers": job.workers, "total_epochs": job.epochs, "command": demo_command(job, python),
            "launch": "once", "worker": dict(WORKER), "time_limit_min": 10}
