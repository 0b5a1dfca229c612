"""What a scheduler may assume of an all-reduce job it knows nothing about: the measured models' median.

Two numbers, each a median over the six measured models (dl2d.workload.catalog), so that no one model's
curve stands in for a job that is not it:

* :func:`prior_speedup`: the speed-up of w workers of g GPUs, packed on the cluster's nodes, over one GPU, each
  model keeping the total batch its jobs use for the GPUs this job asked for (``BATCH_PER_GPU[model] x asked
  GPUs``, the Philly-derived workloads' batches, dl2d.workload.philly): a job keeps its user's batch, so the
  speed-up saturates as the measured ones do (on 4-GPU nodes, asking for 8: 1, 1.83, 3.5, 2.67, 3.43 on 1, 2,
  4, 8, 16 GPUs; crossing a node costs what it costs the measured models);
* :func:`default_epoch_seconds`: one-GPU seconds per epoch at the one-GPU batch (459 s: between deepspeech2's
  243 s and yolov3's 675 s).

The daemon plans a model it never measured with them (dl2d.daemon.jobmodel), and Optimus, which fits each job's
speed from what it observes (dl2d.policy.baselines.optimus), starts from them before it has seen a job run.
"""
from __future__ import annotations

import functools

import numpy as np

from dl2d.workload import catalog
from dl2d.workload.philly import BATCH_PER_GPU


@functools.cache
def default_epoch_seconds() -> float:
    """One-GPU seconds per epoch of a job of unknown model without a hint (module docstring)."""
    return float(np.median([1.0 / catalog.allreduce_epoch_rate(m, float(BATCH_PER_GPU[m]), (1,))
                            for m in catalog.ALLREDUCE_MODELS]))


@functools.lru_cache(maxsize=1024)
def prior_speedup(requested_gpus: int, gpus_per_worker: int, per_node: int, max_workers: int) -> np.ndarray:
    """[max_workers + 1] S(w x g): the median measured speed-up of w workers of g GPUs, packed, over one GPU, at
    the total batch of a job asking for ``requested_gpus`` (module docstring); 0 at w = 0."""
    out = np.zeros(max_workers + 1)
    for w in range(1, max_workers + 1):
        ratios = []
        for m in catalog.ALLREDUCE_MODELS:
            batch = float(BATCH_PER_GPU[m] * max(requested_gpus, 1))
            ratios.append(catalog.allreduce_epoch_rate(m, batch, catalog.packed(w * gpus_per_worker, per_node))
                          / catalog.allreduce_epoch_rate(m, batch, (1,)))
        out[w] = float(np.median(ratios))
    out.setflags(write=False)
    return out
