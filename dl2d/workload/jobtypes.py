"""The job types of DL2's evaluation (Table 1) with the settings of the authors' simulator.

Resources are (GPUs, CPU cores, memory GB). The authors' simulator counts 8 "slots" of CPU and of GPU per
server, a worker taking 4 GPU slots and 2 CPU slots and a PS 2 CPU slots. Our default server is the DL2
testbed machine (2 GPUs, 8 cores, 48 GB), so 4 GPU slots = 1 GPU and 2 CPU slots = 2 cores: the packing is
the same. CTC and DSSM train with CPU-only workers there, and here.

Epochs: the authors count an "epoch" as `batches_per_epoch` steps of a downscaled data set (115 batches for
ResNet-50) and give jobs up to 30000 of them. We count 100 of theirs as one epoch, so jobs have tens to
hundreds of epochs as in the paper's text, and every duration stays exactly what their simulator gives.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dl2d.core.jobs import JobDemand, JobKind, TaskDemand

EPOCH_SCALE = 100  # authors' epochs per dl2d epoch
MAX_EPOCHS = 300.0  # = the authors' MAX_NUM_EPOCHS (30000) / EPOCH_SCALE


@dataclass(frozen=True)
class JobType:
    name: str
    batches_per_epoch: int  # steps in one dl2d epoch
    worker_demand: tuple[float, float, float]
    ps_demand: tuple[float, float, float]
    local_comp_time_s: float  # one step's compute at a worker (Optimus-style models)
    model_size_mb: float
    inter_bw_mbps: float  # measured bandwidth between servers, MB/s
    intra_bw_mbps: float  # within a server, MB/s
    epochs_fraction: float  # typical total epochs as a fraction of MAX_EPOCHS

    @property
    def demand(self) -> JobDemand:
        """The default per-task demand of a job of this type (a submission's spec may say otherwise)."""
        return JobDemand(TaskDemand.of(self.worker_demand), TaskDemand.of(self.ps_demand), JobKind.PS)


def _t(name, comp, size, bpe, inter, intra, gpus, frac):
    return JobType(
        name=name,
        batches_per_epoch=bpe * EPOCH_SCALE,
        worker_demand=(gpus, 2.0, 8.0),
        ps_demand=(0.0, 2.0, 4.0),
        local_comp_time_s=comp,
        model_size_mb=size,
        inter_bw_mbps=inter,
        intra_bw_mbps=intra,
        epochs_fraction=frac,
    )


#: The 8 models, in the order of the authors' simulator.
JOB_TYPES: tuple[JobType, ...] = (
    _t("resnet-50", 0.449, 102.2, 115, 91.875, 306.5, 1.0, 0.30),
    _t("vgg-16", 0.535, 553.4, 115, 233.0, 427.75, 1.0, 0.96),
    _t("resnext-110", 0.226, 6.92, 390, 59.5, 63.0, 1.0, 0.05),
    _t("inception-bn", 0.815, 42.1, 120, 145.875, 1082.125, 1.0, 0.54),
    _t("seq2seq", 0.075, 36.5, 780, 120.125, 181.125, 1.0, 0.95),
    _t("cnn-text-classification", 0.585, 24.0, 193, 60.75, 159.625, 0.0, 0.46),
    _t("dssm", 0.567, 6.0, 349, 92.125, 65.625, 0.0, 0.33),
    _t("wlm", 0.154, 19.2, 165, 10.375, 22.875, 1.0, 0.23),
)
TYPE_NAMES: tuple[str, ...] = tuple(t.name for t in JOB_TYPES)
TYPE_INDEX: dict[str, int] = {n: i for i, n in enumerate(TYPE_NAMES)}
#: Per type, as arrays: default worker / PS demand [types, 3], steps per epoch, one step's compute (s).
WORKER_DEMAND = np.array([t.worker_demand for t in JOB_TYPES])
PS_DEMAND = np.array([t.ps_demand for t in JOB_TYPES])
BATCHES_PER_EPOCH = np.array([t.batches_per_epoch for t in JOB_TYPES], dtype=float)
LOCAL_COMP_TIME = np.array([t.local_comp_time_s for t in JOB_TYPES])
#: Short names used in the paper's figures.
ALIASES = {"ctc": "cnn-text-classification", "resnet50": "resnet-50", "vgg16": "vgg-16"}


def type_index(name: str) -> int:
    """Index of a job type by name (case-insensitive, paper aliases accepted); ValueError if unknown."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in TYPE_INDEX:
        raise ValueError(f"unknown job type {name!r}; known: {', '.join(TYPE_NAMES)}")
    return TYPE_INDEX[key]
