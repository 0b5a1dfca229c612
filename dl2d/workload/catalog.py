"""Every model a job can be, in both worlds, in one index space, and what a scheduler believes of each job's
speed.

Indices 0-7 are DL2's eight parameter-server job types (dl2d.workload.jobtypes, the paper's order, so the
DL2 world is unchanged); indices 8-13 are today's six all-reduce models with measured throughput
(dl2d.workload.throughput). A job's ``type_idx`` anywhere in dl2d (trace, view) is an index into
:data:`MODEL_NAMES`.

Work is counted in epochs in both worlds. An all-reduce model's epochs to convergence are the epochs of its
measured training runs (the rows of its ``validation-<B>.csv``: 100 for cifar10, 90 for imagenet, ...), and one
epoch at total batch B is ``iterations_to_finish(model, B) / epochs`` iterations. So its speed in epochs per
second on a placement is ``1 / (step_time(placement, B / GPUs) x iterations per epoch)``. :class:`SpeedRules`
names how the measurements become that speed; the Pollux artifact's simulator's rules (a per-GPU batch cap with
gradient accumulation, off-table placements interpolated, work as statistical-efficiency progress) are
:data:`REFERENCE_RULES`.

What a scheduler knows of a job's speed (:func:`speed_estimate`, the view's ``est_speed``): for a DL2 job, the
Optimus-style parametric fit of its type (dl2d.workload.speed), which is smooth where the measurements are
noisy; for an all-reduce job, the measured throughput at the *packed* placement (fewest nodes), without the
job's hidden interference factor, the slot noise or the slowdown of sharing nodes. Both are what a site's
speed model would say, and both are wrong the way a real cluster makes them wrong.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from dl2d.core.jobs import JobDemand, JobKind, TaskDemand
from dl2d.workload import batching, efficiency, throughput, workloads
from dl2d.workload.jobtypes import BATCHES_PER_EPOCH, JOB_TYPES, TYPE_NAMES
from dl2d.workload.speed import lookup, parametric_table

ALLREDUCE_MODELS: tuple[str, ...] = throughput.MODELS
MODEL_NAMES: tuple[str, ...] = TYPE_NAMES + ALLREDUCE_MODELS
NUM_DL2_TYPES = len(TYPE_NAMES)
MODEL_INDEX = {n: i for i, n in enumerate(MODEL_NAMES)}
#: The class of an all-reduce model the catalog does not hold (the daemon schedules it on a stated prior,
#: dl2d.daemon.jobmodel): one past the catalog. Model classes, for encodings that one-hot them: NUM_CLASSES.
UNSEEN = len(MODEL_NAMES)
NUM_CLASSES = len(MODEL_NAMES) + 1
#: [classes] True where the model trains with all-reduce (no parameter servers); UNSEEN's row: an all-reduce
#: job of a class the catalog does not hold (a site's own, dl2d.workload.speedfit), whose speed only a site's
#: speed model gives
IS_ALLREDUCE = np.array([i >= NUM_DL2_TYPES for i in range(NUM_CLASSES)])
#: One worker of an all-reduce job: one GPU (one rank), with a quarter of the measured nodes' CPUs and memory
#: (16 x 4 T4 nodes of 48 vCPUs / 192 GB, data/pollux/README.md) less room for the system.
ALLREDUCE_WORKER = TaskDemand(1.0, 8.0, 40.0)
ALLREDUCE_DEMAND = JobDemand(ALLREDUCE_WORKER, TaskDemand(0.0, 0.0, 0.0), JobKind.ALLREDUCE)


#: Parameter size in MB (fp32) of each model: DL2's from its authors' simulator; the all-reduce models' from
#: their published parameter counts, approximate (BERT-base 110 M, ResNet-18 on CIFAR-10 11 M, DeepSpeech2
#: about 38 M, ResNet-50 25.6 M, NeuMF on MovieLens about 5 M, YOLOv3 62 M). A job feature, nothing more.
#: An unseen model (index UNSEEN) gets the median of the six.
MODEL_SIZE_MB = np.array([t.model_size_mb for t in JOB_TYPES] + [440.0, 45.0, 150.0, 102.0, 20.0, 248.0, 126.0])


def model_index(name: str) -> int:
    """The index of a model (a DL2 type name or alias, or an all-reduce model); ValueError if unknown."""
    key = str(name).lower()
    if key in MODEL_INDEX:
        return MODEL_INDEX[key]
    from dl2d.workload.jobtypes import type_index  # DL2 aliases ("resnet50", "ctc")
    try:
        return type_index(key)
    except ValueError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}") from None


def default_demand(type_idx: int) -> JobDemand:
    """The per-task demand of a job of this model when its spec says nothing."""
    return ALLREDUCE_DEMAND if IS_ALLREDUCE[type_idx] else JOB_TYPES[type_idx].demand


WORKER_DEMAND = np.array([default_demand(i).worker.as_array() for i in range(NUM_CLASSES)])
PS_DEMAND = np.array([default_demand(i).ps.as_array() for i in range(NUM_CLASSES)])


def demand_fields(type_idx) -> dict:
    """The SlotView fields of jobs of these models asking for their model's default demand (the simulator's
    jobs do): ``worker_demand`` / ``ps_demand`` [J, 3] and ``kind``."""
    t = np.asarray(type_idx, int)
    return {"worker_demand": WORKER_DEMAND[t].astype(float), "ps_demand": PS_DEMAND[t].astype(float),
            "kind": tuple(JobKind.ALLREDUCE.value if IS_ALLREDUCE[i] else JobKind.PS.value for i in t)}


# ------------------------------------------------------------------------------------------ all-reduce work

@functools.cache
def epochs_to_converge(model: str) -> int:
    """Epochs of the model's measured training runs (every run of a model has the same number)."""
    counts = {workloads.validation_epochs(model, b) for b, _ in workloads.convergence_runs(model)}
    if len(counts) != 1:
        raise ValueError(f"{model}: runs at different batches have different epochs: {sorted(counts)}")
    return counts.pop()


WORK_RULES = ("iterations", "progress")


@dataclass(frozen=True)
class SpeedRules:
    """How an all-reduce job's speed follows from the measurements. dl2d's defaults: a total batch split evenly
    over the GPUs whatever its size, off-table placements by Pollux's fit, work as the iterations of the measured
    runs interpolated in log batch (dl2d.workload.workloads). :data:`REFERENCE_RULES`: the Pollux artifact's
    simulator's (each GPU's batch capped, with gradient accumulation beyond, dl2d.workload.batching; off-table
    placements interpolated; work as statistical-efficiency progress, dl2d.workload.efficiency)."""

    accumulate: bool = False  # the per-GPU batch cap and gradient accumulation beyond it
    one_gpu_accumulates: bool = False  # the artifact's: one GPU accumulates over 2 passes beyond the initial batch
    off_table: str = "fit"  # fit | interpolate (dl2d.workload.throughput.OFF_TABLE)
    work: str = "iterations"  # iterations | progress

    def __post_init__(self):
        if self.off_table not in throughput.OFF_TABLE:
            raise ValueError(f"off_table must be one of {', '.join(throughput.OFF_TABLE)}, got {self.off_table!r}")
        if self.work not in WORK_RULES:
            raise ValueError(f"work must be one of {', '.join(WORK_RULES)}, got {self.work!r}")
        if self.one_gpu_accumulates and not self.accumulate:
            raise ValueError("one_gpu_accumulates needs accumulate")

    def as_dict(self) -> dict:
        return {"accumulate": self.accumulate, "one_gpu_accumulates": self.one_gpu_accumulates,
                "off_table": self.off_table, "work": self.work}


DEFAULT_RULES = SpeedRules()
REFERENCE_RULES = SpeedRules(accumulate=True, one_gpu_accumulates=True, off_table="interpolate", work="progress")


def iterations_per_epoch(model: str, batch_size: float, work: str = "iterations") -> float:
    if work == "progress":
        return efficiency.iterations_to_finish(model, float(batch_size)) / epochs_to_converge(model)
    return workloads.iterations_to_finish(model, batch_size) / epochs_to_converge(model)


def packed(gpus: int, per_node: int) -> throughput.Placement:
    """``gpus`` on the fewest nodes of ``per_node`` GPUs (full nodes, then the rest)."""
    full, rest = divmod(int(gpus), int(per_node))
    return throughput.canonical([per_node] * full + ([rest] if rest else []))


def iteration_seconds(model: str, batch_size: float, placement: throughput.Placement,
                      rules: SpeedRules = DEFAULT_RULES) -> tuple[float, float]:
    """(seconds per iteration, the total batch it trains) of ``model`` at total batch ``batch_size`` on
    ``placement`` under ``rules``: the batch split evenly, or capped per GPU with accumulation beyond."""
    if rules.accumulate:
        return batching.iteration_seconds(model, placement, batch_size, rules.off_table, rules.one_gpu_accumulates)
    return throughput.throughput_model(model).times(placement, batch_size / sum(placement), rules.off_table)[0], \
        float(batch_size)


@functools.lru_cache(maxsize=65536)
def allreduce_epoch_rate(model: str, batch_size: float, placement: throughput.Placement,
                         rules: SpeedRules = DEFAULT_RULES) -> float:
    """Epochs per second of an all-reduce job of ``model`` keeping total batch ``batch_size`` on ``placement``
    (GPUs per node, canonical) under ``rules``: the measured lookup, no interference, no noise. Under the
    progress rule, the mean over the job's epochs (the engine walks them one by one: dl2d.sim.allreduce)."""
    step, trained = iteration_seconds(model, batch_size, placement, rules)
    return 1.0 / (step * iterations_per_epoch(model, trained, rules.work))


# ------------------------------------------------------------------------------------------ the estimate

@functools.lru_cache(maxsize=4096)
def _allreduce_curve(model: str, batch_size: float, gpus_per_worker: int, per_node: int, max_workers: int,
                     rules: SpeedRules):
    curve = np.zeros(max_workers + 1)
    for w in range(1, max_workers + 1):
        curve[w] = allreduce_epoch_rate(model, batch_size, packed(w * gpus_per_worker, per_node), rules)
    curve.setflags(write=False)
    return curve


def speed_estimate(type_idx, batch_size, max_ps: int, max_workers: int, gpus_per_node: float,
                   gpus_per_worker=None, rules: SpeedRules = DEFAULT_RULES) -> np.ndarray:
    """[J, max_ps + 1, max_workers + 1]: each job's believed speed in epochs per second with (PS, workers)
    (module docstring), an all-reduce job's under ``rules``. All-reduce jobs have speed in row PS = 0 only; PS
    jobs none there."""
    t = np.asarray(type_idx, int)
    out = np.zeros((len(t), max_ps + 1, max_workers + 1))
    dl2 = np.flatnonzero(~IS_ALLREDUCE[t])
    if len(dl2):
        p, w = np.meshgrid(np.arange(max_ps + 1), np.arange(max_workers + 1), indexing="ij")
        table = parametric_table()
        out[dl2] = lookup(table, t[dl2, None, None], p[None], w[None]) / BATCHES_PER_EPOCH[t[dl2], None, None]
    per_node = max(int(gpus_per_node), 1)
    g = np.ones(len(t)) if gpus_per_worker is None else np.asarray(gpus_per_worker, float)
    b = np.asarray(batch_size, float)
    for j in np.flatnonzero(IS_ALLREDUCE[t] & (t != UNSEEN)):  # an unseen class: no belief here (zeros)
        gw = max(int(math.ceil(g[j])), 1)
        out[j, 0] = _allreduce_curve(MODEL_NAMES[t[j]], float(b[j]), gw, per_node, max_workers, rules)
    return out


def view_fields(type_idx, max_ps: int, max_workers: int, gpus_per_node: float = 2.0, batch_size=None) -> dict:
    """:func:`demand_fields` and ``est_speed``: every per-job SlotView field that follows from the jobs'
    models (``batch_size`` for all-reduce jobs; gpus_per_node: the cluster's, for the packed estimate)."""
    t = np.asarray(type_idx, int)
    b = np.zeros(len(t)) if batch_size is None else batch_size
    return {**demand_fields(t), "est_speed": speed_estimate(t, b, max_ps, max_workers, gpus_per_node)}
