"""Jobs described by what they are, not by one of a few type indices: the DL2 policy's "speed" encoding.

A job's model index says nothing about a model the policy never saw; its speed estimate does. Per job, from
the view (:func:`speed_features`, pure NumPy):

* its parallel efficiency at 2, 4, 8 and 16 workers, c(k) / (k c(1)), where c(k) is its estimated speed
  (``SlotView.est_speed``) with k workers (and k PS for a PS job, up to the PS limit): how well it scales;
* its remaining work, the remaining epochs over its one-worker speed, as log1p(hours) / 5;
* whether it is an all-reduce job (no PS).

With ``PolicyConfig.job_encoding = "speed"`` these replace the one-hot model type (DL2's own encoding, kept as
"type" for the paper's reproduction).
"""
from __future__ import annotations

import numpy as np

SIZES = (2, 4, 8, 16)
#: columns of :func:`speed_features`
NUM_SPEED_FEATURES = len(SIZES) + 2


def speed_features(est_speed, remaining_epochs, allreduce) -> np.ndarray:
    """[n, NUM_SPEED_FEATURES] float32 (module docstring); est_speed [n, P + 1, W + 1] epochs per second."""
    est = np.asarray(est_speed, float)
    n, p_max, w_max = len(est), est.shape[1] - 1, est.shape[2] - 1
    ar = np.asarray(allreduce, bool)
    out = np.zeros((n, NUM_SPEED_FEATURES), np.float32)
    if n == 0 or w_max < 1:
        return out
    rows = np.arange(n)

    def speed(k: int) -> np.ndarray:
        k = min(k, w_max)
        return np.where(ar, est[rows, 0, k], est[rows, min(k, p_max), k])

    one = speed(1)
    ok = one > 0
    safe = np.where(ok, one, 1.0)
    for i, k in enumerate(SIZES):
        out[:, i] = np.where(ok, speed(k) / (min(k, w_max) * safe), 0.0)
    hours = np.asarray(remaining_epochs, float) / safe / 3600.0
    out[:, len(SIZES)] = np.where(ok, np.log1p(np.maximum(hours, 0.0)) / 5.0, 0.0)
    out[:, len(SIZES) + 1] = ar
    return out
