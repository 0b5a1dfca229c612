"""Workloads of today's all-reduce jobs: the Pollux artifact's sixteen 160-job workloads, and the work each job
needs to finish.

A workload file (``data/pollux/workloads*/workload-<k>.csv``, README there) lists ``name,time,application,
num_replicas,batch_size``: a job, its arrival second, its model (one of :data:`dl2d.workload.throughput.MODELS`),
the GPUs its user asked for and its total batch size. ``workloads/`` holds the jobs as Pollux's evaluation tuned
them (several GPUs each), ``workloads-realistic/`` as users submitted them (nearly all ask for one GPU).

How much work a job is (:func:`iterations_to_finish`): the artifact measured each model's training at several
total batches B (``validation-<B>.csv``, one row per epoch, cumulative iterations); a job trained at B needs the
iterations of the last epoch of that run. Between measured batches the samples needed (iterations x B) are
interpolated linearly in log B; outside them the nearest measured batch's samples are kept (the same epochs).
"""
from __future__ import annotations

import csv
import functools
import io
import math
from dataclasses import dataclass
from importlib import resources

import numpy as np

from dl2d.workload.throughput import MODELS

FOLDERS = ("workloads", "workloads-realistic")
WORKLOADS = tuple(range(1, 9))


@dataclass(frozen=True)
class WorkloadJob:
    """One job of a workload: what its user submitted."""

    name: str
    arrival_s: float  # seconds after the workload's start
    model: str
    gpus: int  # GPUs asked for
    batch_size: int  # total batch, kept whatever the GPU count


def _int(row, key: str, source: str, n: int, low: int) -> int:
    raw = row.get(key)
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{source} line {n}: {key} is not a number: {raw!r}") from None
    if not math.isfinite(v) or v != int(v) or v < low:
        raise ValueError(f"{source} line {n}: {key} must be a whole number >= {low}, got {raw!r}")
    return int(v)


def parse_workload(text: str, source: str = "workload.csv") -> tuple[WorkloadJob, ...]:
    """The jobs of a workload file, by arrival; ValueError naming the line of the first bad field."""
    reader = csv.DictReader(io.StringIO(text))
    columns = ("name", "time", "application", "num_replicas", "batch_size")
    missing = [c for c in columns if c not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"{source}: missing column(s) {', '.join(missing)}")
    jobs = []
    for n, row in enumerate(reader, 2):
        model = str(row["application"] or "").strip()
        if model not in MODELS:
            raise ValueError(f"{source} line {n}: unknown model {model!r}; known: {', '.join(MODELS)}")
        name = str(row["name"] or "").strip()
        if not name:
            raise ValueError(f"{source} line {n}: a job needs a name")
        jobs.append(WorkloadJob(name, float(_int(row, "time", source, n, 0)), model,
                                _int(row, "num_replicas", source, n, 1), _int(row, "batch_size", source, n, 1)))
    if not jobs:
        raise ValueError(f"{source}: no jobs")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        dup = next(x for x in names if names.count(x) > 1)
        raise ValueError(f"{source}: job name {dup!r} appears twice")
    return tuple(sorted(jobs, key=lambda j: (j.arrival_s, j.name)))


def packaged_workload(k: int, folder: str = "workloads") -> tuple[WorkloadJob, ...]:
    """Workload ``k`` (1-8) of ``folder`` (``workloads`` or ``workloads-realistic``)."""
    if folder not in FOLDERS or k not in WORKLOADS:
        raise ValueError(f"packaged workloads are {', '.join(FOLDERS)} 1-8, not {folder} {k}")
    path = resources.files("dl2d.workload").joinpath("data/pollux", folder, f"workload-{k}.csv")
    return parse_workload(path.read_text(), f"pollux/{folder}/workload-{k}.csv")


# ------------------------------------------------------------------------------------------ work to finish

def parse_validation(text: str, source: str = "validation.csv") -> tuple[int, int]:
    """(epochs, cumulative iterations at the last epoch) of a validation file (one row per epoch)."""
    last, epochs = None, 0
    for n, row in enumerate(csv.DictReader(io.StringIO(text)), 2):
        last = _int(row, "iteration", source, n, 1)
        epochs += 1
    if last is None:
        raise ValueError(f"{source}: no epochs")
    return epochs, last


@functools.cache
def _runs(model: str) -> dict[int, tuple[int, int]]:
    if model not in MODELS:
        raise ValueError(f"no convergence measurements for model {model!r}; measured: {', '.join(MODELS)}")
    base = resources.files("dl2d.workload").joinpath("data/pollux", model)
    runs = {}
    for f in base.iterdir():
        if f.name.startswith("validation-") and f.name.endswith(".csv"):
            batch = int(f.name[len("validation-"):-len(".csv")])
            runs[batch] = parse_validation(f.read_text(), f"pollux/{model}/{f.name}")
    return runs


def convergence_runs(model: str) -> tuple[tuple[int, int], ...]:
    """(total batch, iterations to finish) of every measured run of ``model``, by batch."""
    return tuple(sorted((b, it) for b, (_, it) in _runs(model).items()))


def validation_epochs(model: str, batch: int) -> int:
    """Epochs of the measured run of ``model`` at total batch ``batch``."""
    return _runs(model)[batch][0]


def iterations_to_finish(model: str, batch_size: float) -> float:
    """Iterations a job of ``model`` trained at total batch ``batch_size`` needs (rule in the module doc)."""
    if not math.isfinite(batch_size) or batch_size <= 0:
        raise ValueError(f"the total batch must be > 0, got {batch_size!r}")
    runs = convergence_runs(model)
    log_b = np.log([b for b, _ in runs])
    samples = np.array([b * it for b, it in runs], float)
    return float(np.interp(math.log(batch_size), log_b, samples)) / batch_size  # np.interp clamps at the ends
