"""Per-job measurements of a slot, as pure functions: measured speed, interference factor, GPU features.

* :func:`measure_slot` — for every job that ran in the slot: epochs trained (from the backend's progress),
  measured epochs/s, the predicted epochs/s for the (workers, PS) it ran with (a PS job: the DL2 speed
  table's; an all-reduce job: what its view believed, dl2d.daemon.jobmodel), their ratio (the
  *speed factor*: 1 = as the speed model predicts, below 1 = slower, e.g. interference), and its GPU
  features from the agents' samples of the slot (``dl2d.agents.features.job_gpu_features``; agent process
  Slurm job ids are matched to dl2d jobs through ``JobStatus.backend_ref``);
* :func:`job_flags` — which jobs to flag in the decision record: ``slow`` when the speed factor stayed
  below ``low`` for the last ``slots`` measured slots, ``shared_gpu`` when a GPU of the job carried another
  job's processes in its last slot with samples.

The daemon (``dl2d.daemon.loop``) stores :class:`JobSlotStats` in ``job_slot_stats`` at the end of each slot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dl2d.agents.features import job_gpu_features
from dl2d.core.contract import SPEED_FACTOR_SLOTS
from dl2d.daemon.backend import FAILED, FINISHED, JobStatus
from dl2d.workload.jobtypes import type_index
from dl2d.workload.speed import epochs_trained

#: a job is flagged ``slow`` when its speed factor stayed below LOW_FACTOR for SLOW_SLOTS measured slots
LOW_FACTOR = 0.8
SLOW_SLOTS = 3
#: the daemon keeps each job's last this many measured slots: enough for the slow flag and for the view's
#: job_speed_factor (speed_factor_estimate, SPEED_FACTOR_SLOTS of them), whichever needs more
HISTORY_SLOTS = max(SLOW_SLOTS, SPEED_FACTOR_SLOTS)


@dataclass(frozen=True)
class RanJob:
    """What a job was doing during the slot (the daemon's view before the slot's end is reconciled)."""

    job_id: int
    job_type: str
    workers: int
    ps: int
    epochs_before: float
    # the believed epochs/s at this size where the daemon has it (an all-reduce job: its view's est_speed, the
    # measured throughput or the prior); None: the DL2 speed table's for its type
    predicted: float | None = None


@dataclass(frozen=True)
class JobSlotStats:
    job_id: int
    workers: int  # the size the job ran with (and was predicted for)
    ps: int
    epochs: float  # trained in the slot
    epochs_per_s: float  # epochs / slot seconds
    predicted_epochs_per_s: float | None  # the speed model's, for (workers, ps)
    speed_factor: float | None  # measured / predicted; None when the job ended during the slot (partial slot)
    ended: bool = False  # finished or failed during the slot
    gpus: int | None = None  # None: no agent sample showed the job's processes
    gpu_util_mean_pct: float | None = None
    gpu_mem_per_gpu_max_bytes: float | None = None
    shared_gpu: bool | None = None
    gpu_observations: int = 0
    nodes: int | None = None  # nodes its tasks spanned at the slot's end (None: the backend named none)

    def row(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def predicted_epochs_per_s(table: np.ndarray, job_type: str, workers: int, ps: int) -> float:
    """Epochs per second the speed model gives a job of this type at (workers, ps) (the simulator's formula
    over one second, factor 1)."""
    return float(epochs_trained(table, np.array([type_index(job_type)]), np.array([ps]), np.array([workers]))[0])


def gpu_features_by_job(samples: Iterable[Mapping[str, Any]], statuses: Mapping[int, JobStatus]) -> dict[int, dict]:
    """The agents' per-Slurm-job GPU features keyed by dl2d job id (Slurm id = ``backend_ref``)."""
    by_ref = {st.backend_ref: job_id for job_id, st in statuses.items() if st.backend_ref}
    return {by_ref[ref]: f for ref, f in job_gpu_features(samples).items() if ref in by_ref}


def measure_slot(ran: Sequence[RanJob], statuses: Mapping[int, JobStatus], samples: Iterable[Mapping[str, Any]],
                 slot_seconds: float, table: np.ndarray) -> list[JobSlotStats]:
    """Stats of every job in ``ran`` with workers > 0 that the backend still reports, in ``ran``'s order."""
    gpu = gpu_features_by_job(samples, statuses)
    out = []
    for r in ran:
        st = statuses.get(r.job_id)
        if st is None or r.workers <= 0:
            continue
        epochs = max(float(st.epochs_done) - r.epochs_before, 0.0)
        rate = epochs / slot_seconds
        if r.predicted is not None:
            pred = r.predicted
        else:
            try:
                pred = predicted_epochs_per_s(table, r.job_type, r.workers, r.ps)
            except ValueError:  # a job type the speed model does not know
                pred = None
        ended = st.state in (FINISHED, FAILED)
        factor = rate / pred if pred and not ended else None
        g = gpu.get(r.job_id)
        out.append(JobSlotStats(
            r.job_id, r.workers, r.ps, epochs, rate, pred, factor, ended,
            gpus=g["gpus"] if g else None, gpu_util_mean_pct=g["gpu_util_mean_pct"] if g else None,
            gpu_mem_per_gpu_max_bytes=float(g["gpu_mem_per_gpu_max_bytes"]) if g else None,
            shared_gpu=g["shared_gpu"] if g else None, gpu_observations=g["observations"] if g else 0,
            nodes=len(st.nodes) or None))
    return out


def job_flags(history: Mapping[int, Sequence[JobSlotStats]], low: float = LOW_FACTOR,
              slots: int = SLOW_SLOTS) -> dict[int, list[str]]:
    """``{job_id: flags}`` for flagged jobs only; ``history`` is each job's stats, oldest first."""
    flags: dict[int, list[str]] = {}
    for job_id, hist in history.items():
        factors = [h.speed_factor for h in hist if h.speed_factor is not None][-slots:]
        f = []
        if len(factors) == slots and all(x < low for x in factors):
            f.append("slow")
        seen = [h.shared_gpu for h in hist if h.shared_gpu is not None]
        if seen and seen[-1]:
            f.append("shared_gpu")
        if f:
            flags[job_id] = f
    return flags


def speed_factor_estimate(history: Mapping[int, Sequence[JobSlotStats]],
                          slots: int = SPEED_FACTOR_SLOTS) -> dict[int, float]:
    """Mean speed factor of each job's last ``slots`` measured slots (jobs never measured are left out)."""
    out = {}
    for job_id, hist in history.items():
        factors = [h.speed_factor for h in hist if h.speed_factor is not None][-slots:]
        if factors:
            out[job_id] = float(np.mean(factors))
    return out
