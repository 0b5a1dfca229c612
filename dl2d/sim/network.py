"""Cross-node PS <-> worker traffic, and what it costs a job's training speed.

The model (DLTAP's setting, section 3 of the paper): a job's parameters are split evenly over its p PS
tasks. After every mini-batch step a worker sends each PS its gradient shard (M/p MB) and receives the
updated shard back (M/p MB), so one worker step moves 2M MB, 2M/p to and from each PS. A (worker, PS)
pair whose tasks sit on different servers is one of DLTAP's "cross-node transmissions"; the share of the
job's traffic that crosses servers is therefore

    cross_fraction = (#(worker, PS) pairs on different servers) / (w * p)

and the cross-node traffic of a slot is  worker steps trained * 2M * cross_fraction  (worker steps =
epochs trained * batches per epoch: the speed table counts steps summed over workers).

Speed (used only when `SimConfig.cross_node_comm` is on): one worker step takes
t(f) = local compute time + 2M * (f / inter-node bandwidth + (1 - f) / intra-node bandwidth), with the
per-model compute time, model size and the two bandwidths of the DL2 authors' simulator (jobtypes.py).
The speed table is read as the speed with all traffic inside a server (f = 0), so a job runs at
t(0) / t(f) of its table speed. Check against DLTAP's own measurement: their "ideal" placement cuts the
cross-node transmissions of a 2-PS / 3-worker job from 6 to 4 and reports 15% less training time; for the
same change this model gives 19% for ResNet-50, 14% for VGG-16, 12% for Inception-BN and 1% for ResNeXt-110
(whose 7 MB model makes it compute-bound).

Everything here is a pure function of its arguments.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from dl2d.workload.jobtypes import JOB_TYPES

MODEL_SIZE_MB = np.array([t.model_size_mb for t in JOB_TYPES])
INTER_BW_MBPS = np.array([t.inter_bw_mbps for t in JOB_TYPES])
# Staying inside a server is never slower than crossing: DSSM's measured intra-node figure (65.6 MB/s) is
# below its inter-node one (92.1 MB/s), so the intra-node bandwidth used is max(intra, inter).
INTRA_BW_MBPS = np.maximum([t.intra_bw_mbps for t in JOB_TYPES], INTER_BW_MBPS)
LOCAL_COMP_S = np.array([t.local_comp_time_s for t in JOB_TYPES])


def cross_pairs(worker_servers: Sequence[int], ps_servers: Sequence[int]) -> tuple[int, int]:
    """(number of (worker, PS) pairs on different servers, number of pairs)."""
    ps_on = Counter(int(s) for s in ps_servers)
    p = len(ps_servers)
    cross = sum(p - ps_on.get(int(s), 0) for s in worker_servers)
    return cross, len(worker_servers) * p


def cross_fraction(worker_servers: Sequence[int], ps_servers: Sequence[int]) -> float:
    """Share of a job's PS <-> worker traffic that crosses servers (0 when it has no worker or no PS)."""
    cross, pairs = cross_pairs(worker_servers, ps_servers)
    return cross / pairs if pairs else 0.0


def traffic_mb(model_mb, worker_steps, fraction):
    """(total, cross-node) MB moved by `worker_steps` steps of a job with `fraction` of its pairs crossing."""
    total = 2.0 * np.asarray(model_mb, float) * np.asarray(worker_steps, float)
    return total, total * np.asarray(fraction, float)


def step_time_s(type_idx, fraction):
    """Seconds of one worker step with `fraction` of its traffic crossing servers (element-wise)."""
    t = np.asarray(type_idx)
    f = np.asarray(fraction, float)
    return LOCAL_COMP_S[t] + 2.0 * MODEL_SIZE_MB[t] * (f / INTER_BW_MBPS[t] + (1.0 - f) / INTRA_BW_MBPS[t])


def comm_speed_factor(type_idx, fraction):
    """Speed multiplier t(0) / t(f) <= 1: 1 when no traffic crosses servers."""
    return step_time_s(type_idx, 0.0) / step_time_s(type_idx, fraction)


def job_cross_fractions(worker_servers, ps_servers) -> np.ndarray:
    """cross_fraction for every job of an allocation (tuples of server lists)."""
    return np.array([cross_fraction(w, p) for w, p in zip(worker_servers, ps_servers)], float)
