"""What the daemon knows of a job's model: its catalog index, kind, default demand and believed speed, including
for a model it has never seen. Pure.

A job's ``job_type`` names its model. A PS job's is one of DL2's eight types; an all-reduce job's may be any name:

* one of the catalog's all-reduce models (dl2d.workload.catalog, indices 8-13: bert, cifar10, ...) is *known*:
  its speed is the measured throughput at its total batch (``catalog.speed_estimate``, packed placement);
* any other name (a DL2 type name trained with all-reduce counts here too) is *unseen*: its ``type_idx`` is
  :data:`UNSEEN_MODEL` (one past the catalog: a class no policy was trained on, so a policy that keys on the
  class sees none; the heuristics read the job's kind, demand and ``est_speed``) and its speed is the
  :func:`prior`.

The kind comes from the spec's ``kind`` (``dl2ctl submit --arch``); without one, a DL2 type name is a PS job
and any other name an all-reduce job (today's jobs are).

**The prior of an unseen model** (what the view's ``est_speed`` holds for it, row PS = 0):
``est(w) = S(w x g) / epoch_seconds``, where

* ``g`` is the job's GPUs per worker (its spec's ``[worker] gpus``, rounded up, at least 1);
* ``S(k)`` is the *median*, over the six measured models, of their speed-up on ``k`` GPUs packed on the
  cluster's nodes (fewest nodes) over one GPU, each model keeping the total batch its jobs use for the GPUs
  this job asked for (``BATCH_PER_GPU[model] x requested workers x g``, the Philly-derived workloads'
  batches, dl2d.workload.philly): a job keeps its user's batch, so its speed-up saturates as the measured
  ones do (on 4-GPU nodes, asking for 8: 1, 1.83, 3.5, 2.67, 3.43 on 1, 2, 4, 8, 16 GPUs; crossing a node
  costs what it costs the measured models);
* ``epoch_seconds`` is the job's one-GPU seconds per epoch: its spec's ``epoch_seconds`` hint, else
  :func:`default_epoch_seconds`, the median of the six models' one-GPU epoch time at their one-GPU batch
  (459 s: between deepspeech2's 243 s and yolov3's 675 s).

Both are in dl2d.workload.prior (Optimus starts from them too). It is a prior, stated so that a site can see
what the scheduler assumed: the measured speed factor of the job (dl2d.daemon.jobstats) corrects it once the
job runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from dl2d.core.jobs import JobDemand, JobKind, demand_from_spec
from dl2d.workload import catalog
from dl2d.workload.jobtypes import ALIASES, TYPE_NAMES
from dl2d.workload.prior import default_epoch_seconds, prior_speedup  # noqa: F401  (re-exported)

#: ``type_idx`` of an all-reduce model the catalog does not know (one past its last model).
UNSEEN_MODEL = catalog.UNSEEN


@dataclass(frozen=True)
class JobModel:
    """A job's model as the daemon plans with it (from its ``job_type`` and spec: :func:`model_of`)."""

    name: str
    type_idx: int  # index into catalog.MODEL_NAMES, or UNSEEN_MODEL
    kind: JobKind
    batch_size: float = 0.0  # total batch (all-reduce jobs; 0: PS jobs, or an unseen model that gave none)
    requested: int = 1  # workers the job asked for (``workers`` in the spec), 1 where it did not say
    epoch_seconds: float | None = None  # the spec's one-GPU seconds per epoch (unseen models); None: default

    @property
    def unseen(self) -> bool:
        return self.type_idx == UNSEEN_MODEL


def is_dl2_type(name: str) -> bool:
    key = str(name).strip().lower()
    return ALIASES.get(key, key) in TYPE_NAMES


def default_kind(job_type: str) -> JobKind:
    """The kind of a job whose spec does not say: a DL2 type is a PS job, any other model an all-reduce one."""
    return JobKind.PS if is_dl2_type(job_type) else JobKind.ALLREDUCE


def spec_kind(job_type: str, spec: Mapping[str, Any]) -> JobKind:
    kind = spec.get("kind")
    if kind is None:
        return default_kind(job_type)
    try:
        return JobKind(kind)
    except ValueError:
        raise ValueError(f"job spec kind must be one of {', '.join(k.value for k in JobKind)}, got {kind!r}") \
            from None


def _positive(spec: Mapping[str, Any], key: str, default):
    v = spec.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"job spec {key} must be a number > 0, got {v!r}")
    return v


def model_of(job_type: str, spec: Mapping[str, Any]) -> JobModel:
    """The job's model (module docstring); ValueError for a PS job of a model that is not a DL2 type, or a bad
    spec value (naming it)."""
    kind = spec_kind(job_type, spec)
    requested = int(_positive(spec, "workers", 1))
    if kind == JobKind.PS:
        if not is_dl2_type(job_type):
            raise ValueError(f"a PS job's model must be one of DL2's types ({', '.join(TYPE_NAMES)}), "
                             f"got {job_type!r}")
        return JobModel(str(job_type), catalog.model_index(job_type), kind, 0.0, requested)
    name = str(job_type).strip().lower()
    idx = catalog.MODEL_INDEX[name] if name in catalog.ALLREDUCE_MODELS else UNSEEN_MODEL
    batch = float(_positive(spec, "batch_size", 0.0))
    hint = _positive(spec, "epoch_seconds", None)
    if idx != UNSEEN_MODEL and not batch > 0:
        raise ValueError(f"job spec batch_size must be a number > 0 for an all-reduce job of {name}")
    return JobModel(name, idx, kind, batch, requested, None if hint is None else float(hint))


def default_demand(model: JobModel) -> JobDemand:
    """Per-task demand where the spec is silent: the catalog's for known models, one GPU (catalog.ALLREDUCE_DEMAND)
    per worker of an unseen all-reduce model."""
    if model.kind == JobKind.ALLREDUCE:
        return catalog.ALLREDUCE_DEMAND
    return catalog.default_demand(model.type_idx)


def job_demand(job_type: str, spec: Mapping[str, Any]) -> JobDemand:
    """The job's demand from its spec, :func:`default_demand` where it is silent (the one source the policy,
    the guardrails, the simulated and the Slurm backends all size a job with)."""
    return demand_from_spec(spec, default_demand(model_of(job_type, spec)))


def gpus_per_worker(demand: JobDemand) -> int:
    """Whole GPUs of one all-reduce worker (at least one: an all-reduce rank drives a GPU)."""
    return max(int(math.ceil(demand.worker.gpus)), 1)


# ------------------------------------------------------------------------------------------ the prior

def prior(model: JobModel, gpus_per_worker: int, per_node: int, max_workers: int) -> np.ndarray:
    """[max_workers + 1] the believed epochs per second of an unseen model with 0..max_workers workers."""
    seconds = model.epoch_seconds or default_epoch_seconds()
    return prior_speedup(model.requested * gpus_per_worker, gpus_per_worker, max(per_node, 1), max_workers) / seconds


def speed_estimate(models: Sequence[JobModel], gpus_per_worker: Sequence[float], max_ps: int, max_workers: int,
                   gpus_per_node: float) -> np.ndarray:
    """[J, max_ps + 1, max_workers + 1] the view's ``est_speed``: catalog.speed_estimate for known models,
    :func:`prior` for unseen ones (row PS = 0)."""
    n = len(models)
    out = np.zeros((n, max_ps + 1, max_workers + 1))
    known = [j for j, m in enumerate(models) if not m.unseen]
    if known:
        out[known] = catalog.speed_estimate(
            [models[j].type_idx for j in known], [models[j].batch_size for j in known], max_ps, max_workers,
            gpus_per_node, [gpus_per_worker[j] for j in known])
    per_node = max(int(gpus_per_node), 1)
    for j, m in enumerate(models):
        if m.unseen:
            out[j, 0] = prior(m, max(int(math.ceil(gpus_per_worker[j])), 1), per_node, max_workers)
    return out
