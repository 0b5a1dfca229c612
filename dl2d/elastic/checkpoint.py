"""Atomic checkpoints (write to a temporary file, fsync, rename).

``<dir>/checkpoint.npz`` holds ``params`` and ``momentum`` (float32, flat) and
``meta`` (UTF-8 JSON bytes as uint8): ``job_id``, ``version`` (global step =
data-order position), ``epoch``, ``step_in_epoch``, ``data_position``,
``config`` (the TrainConfig), ``workers``, ``ps``, ``time``.  A reader never
sees a partial file: ``os.replace`` is atomic on POSIX file systems.
"""

from __future__ import annotations

import json
import os

import numpy as np

from dl2d.core.files import atomic_open

CHECKPOINT_NAME = "checkpoint.npz"


def _atomic_npz(path: str, **arrays) -> None:
    with atomic_open(path, "wb") as f:
        np.savez(f, **arrays)


def save_checkpoint(directory: str, meta: dict, params: np.ndarray, momentum: np.ndarray) -> str:
    if np.isnan(params).any() or np.isnan(momentum).any():
        raise ValueError("refusing to save a checkpoint with missing parameters")
    path = os.path.join(directory, CHECKPOINT_NAME)
    _atomic_npz(path, params=np.asarray(params, np.float32), momentum=np.asarray(momentum, np.float32),
                meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    return path


def load_checkpoint(directory: str) -> tuple[dict, np.ndarray, np.ndarray] | None:
    path = os.path.join(directory, CHECKPOINT_NAME)
    if not os.path.exists(path):
        return None
    with np.load(path) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        return meta, z["params"].copy(), z["momentum"].copy()


def save_model(path: str, params: np.ndarray) -> None:
    _atomic_npz(path, params=np.asarray(params, np.float32))
