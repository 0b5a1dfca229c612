"""A job as the contract sees it: its kind and its per-task demand, as data.

Every task of a job asks for the same (GPUs, CPU cores, memory GB) as the job's other tasks of the same
role. The demand has one source, the job's submitted spec (``[worker]`` / ``[ps]`` tables, see
dl2d/cli/jobspec.py): the policy, the guardrails and the Slurm backend all plan a job from
:func:`demand_from_spec`, so a job asking for 2 GPUs per worker is planned with 2 everywhere. Where a spec
is silent, the job type's default demand (dl2d.workload.jobtypes) fills in.

Kinds: ``ps`` jobs have workers and parameter servers (DL2's model); ``allreduce`` jobs have workers only
(no PS, their PS demand is zero).
"""
from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

#: The resources of a task and of a server, in this order everywhere: (GPUs, CPU cores, memory GB).
RESOURCES = ("gpus", "cpus", "mem_gb")


class JobKind(str, enum.Enum):
    PS = "ps"  # workers + parameter servers
    ALLREDUCE = "allreduce"  # workers only, gradients all-reduced among them


class IntentKind(str, enum.Enum):
    """What a journalled action asks for (the daemon's plan makes them, the journal keeps them). How the
    backend carries a resize out (in place, hot, or a relaunch) is its choice, recorded as the event kind."""

    RESIZE = "resize"
    SUBMIT = "submit"
    CANCEL = "cancel"


#: How a job's processes are started (a spec's ``launch``, docs/jobs.md): ``srun``, one process per worker by
#: dl2d's own ``srun`` (each learns its rank from Slurm: the all-reduce jobs' default); ``once``, the command
#: runs once on the first node and starts its own processes (dl2-run, torchrun, the PS jobs' default).
LAUNCHES = ("srun", "once")
#: A variable a job declares for its environment (a spec's ``env`` table, docs/jobs.md): a shell variable name,
#: not one of the prefixes dl2d and Slurm set for the job (DL2D_*, SLURM_*) or that sbatch reads as its own
#: options (SBATCH_*).
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIXES = ("DL2D_", "SLURM_", "SBATCH_")


@dataclass(frozen=True)
class TaskDemand:
    """What one task asks for."""

    gpus: float = 0.0
    cpus: float = 1.0
    mem_gb: float = 0.0

    def __post_init__(self):
        for name in RESOURCES:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"task demand {name} must be a finite number >= 0, got {v!r}")

    def as_array(self) -> np.ndarray:
        return np.array([self.gpus, self.cpus, self.mem_gb], dtype=float)

    @staticmethod
    def of(values) -> "TaskDemand":
        g, c, m = (float(x) for x in values)
        return TaskDemand(g, c, m)


@dataclass(frozen=True)
class JobDemand:
    """A job's kind and the demand of each of its workers and PS."""

    worker: TaskDemand
    ps: TaskDemand
    kind: JobKind = JobKind.PS

    def __post_init__(self):
        if self.kind == JobKind.ALLREDUCE and self.ps != TaskDemand(0.0, 0.0, 0.0):
            raise ValueError("an all-reduce job has no parameter servers: its PS demand must be zero")


def _value(spec: Mapping[str, Any], section: str, key: str, default: float) -> float:
    sub = spec.get(section)
    if sub is None:
        return default
    if not isinstance(sub, Mapping):
        raise ValueError(f"job spec {section} must be a table of gpus/cpus/mem_gb, got {sub!r}")
    value = sub.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"job spec {section}.{key} must be a number >= 0, got {value!r}")
    return float(value)


def demand_from_spec(spec: Mapping[str, Any], default: JobDemand) -> JobDemand:
    """The job's demand: its spec's ``worker`` / ``ps`` values, ``default``'s where the spec gives none.

    ``spec["kind"]`` (``ps`` or ``allreduce``) overrides the default's kind. ValueError names the bad key."""
    kind = spec.get("kind")
    try:
        kind = default.kind if kind is None else JobKind(kind)
    except ValueError:
        raise ValueError(f"job spec kind must be one of {', '.join(k.value for k in JobKind)}, got {kind!r}") \
            from None
    worker = TaskDemand(*(_value(spec, "worker", k, getattr(default.worker, k)) for k in RESOURCES))
    if kind == JobKind.ALLREDUCE:
        return JobDemand(worker, TaskDemand(0.0, 0.0, 0.0), kind)
    ps = TaskDemand(*(_value(spec, "ps", k, getattr(default.ps, k)) for k in RESOURCES))
    return JobDemand(worker, ps, kind)
