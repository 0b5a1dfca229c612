"""Training speed of a job as a function of its (PS, workers), as dense lookup tables.

A speed table has shape [types, P+1, W+1]; entry [t, p, w] is the job's training speed in steps per second
summed over its workers (the quantity the DL2 authors interpolate), zero when p or w is zero. Tables make the
simulator's speed lookup one fancy-index, in NumPy or in JAX alike.

Two models fill the table:
- `measured_table()` (the default): the DL2 authors' testbed measurements in `data/dl2-testbed-speeds.txt`,
  interpolated with a linear radial-basis function inside the measured region and clamped to the nearest
  measurement outside it. Measurements of exactly 0 (failed runs in the data) are dropped.
- `parametric_table()`: an Optimus-style model, step time = a/w + b + c*w/p + d*w + e*p with non-negative
  coefficients fitted to the same data by NNLS (compute shrinks with more workers, PS communication grows
  with workers per PS, plus per-worker and per-PS overheads). It is smooth and monotone where the real data
  is noisy: this is what the Optimus baseline believes.
"""
from __future__ import annotations

import ast
import functools
from collections import defaultdict
from importlib import resources

import numpy as np

from dl2d.workload.jobtypes import BATCHES_PER_EPOCH, TYPE_NAMES

TABLE_MAX = 32  # largest PS / worker count a table covers; larger counts are clamped to it


def parse_speed_lines(lines) -> dict[str, list[tuple[int, int, float]]]:
    """Parse the testbed file: one tuple literal per line -> {model: [(ps, workers, total speed), ...]}.

    Uses `ast.literal_eval`, never `eval`. Raises ValueError naming the line on a malformed record.
    """
    out: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            model, _mode, _batch, num_ps, num_workers, speeds, _ps_cpu, _w_cpu = ast.literal_eval(line)
            total = float(sum(speeds))
        except (ValueError, SyntaxError, TypeError) as e:
            raise ValueError(f"speed data line {n}: not a valid record ({e})") from None
        if len(speeds) != num_workers:
            raise ValueError(f"speed data line {n}: {num_workers} workers but {len(speeds)} speeds")
        out[model].append((int(num_ps), int(num_workers), total))
    return dict(out)


@functools.cache
def measurements() -> dict[str, list[tuple[int, int, float]]]:
    text = resources.files("dl2d.workload").joinpath("data/dl2-testbed-speeds.txt").read_text()
    return parse_speed_lines(text.splitlines())


def _grid(max_n: int) -> np.ndarray:
    p, w = np.meshgrid(np.arange(1, max_n + 1), np.arange(1, max_n + 1), indexing="ij")
    return np.stack([p.ravel(), w.ravel()], axis=1).astype(float)


def interpolate_measured(points: list[tuple[int, int, float]], max_n: int = TABLE_MAX) -> np.ndarray:
    """[max_n+1, max_n+1] speeds from scattered measurements: linear RBF inside the hull, nearest outside."""
    from scipy.interpolate import RBFInterpolator  # noqa: PLC0415 (scipy's imports cost every CLI call a second)
    from scipy.spatial import Delaunay, cKDTree  # noqa: PLC0415

    data = np.array([(p, w, s) for p, w, s in points if s > 0], dtype=float)
    xy, z = data[:, :2], data[:, 2]
    query = _grid(max_n)
    inside = Delaunay(xy).find_simplex(query) >= 0
    values = np.empty(len(query))
    values[inside] = RBFInterpolator(xy, z, kernel="linear")(query[inside])
    values[~inside] = z[cKDTree(xy).query(query[~inside])[1]]
    values = np.maximum(values, 0.05 * z.min())  # RBF can dip below 0 between noisy points
    table = np.zeros((max_n + 1, max_n + 1))
    table[1:, 1:] = values.reshape(max_n, max_n)
    return table


@functools.cache
def measured_table(max_n: int = TABLE_MAX) -> np.ndarray:
    m = measurements()
    return np.stack([interpolate_measured(m[name], max_n) for name in TYPE_NAMES])


def parametric_features(p, w) -> np.ndarray:
    """Features of the Optimus-style step time: [1/w, 1, w/p, w, p]."""
    p, w = np.asarray(p, float), np.asarray(w, float)
    return np.stack([1.0 / w, np.ones_like(w), w / p, w, p], axis=-1)


def fit_parametric(points: list[tuple[int, int, float]]) -> np.ndarray:
    """Non-negative coefficients of step time = w / speed, fitted by NNLS on relative error."""
    from scipy.optimize import nnls  # noqa: PLC0415

    data = np.array([(p, w, s) for p, w, s in points if s > 0], dtype=float)
    p, w, s = data.T
    step = w / s
    theta, _ = nnls(parametric_features(p, w) / step[:, None], np.ones_like(step))
    return theta


def parametric_speed(theta: np.ndarray, p, w) -> np.ndarray:
    """Total speed (steps/s over all workers) of the fitted model; 0 where p or w is 0."""
    p, w = np.asarray(p, float), np.asarray(w, float)
    ok = (p > 0) & (w > 0)
    step = parametric_features(np.where(ok, p, 1), np.where(ok, w, 1)) @ theta
    return np.where(ok, w / np.maximum(step, 1e-9), 0.0)


@functools.cache
def parametric_table(max_n: int = TABLE_MAX) -> np.ndarray:
    m = measurements()
    p, w = np.meshgrid(np.arange(max_n + 1), np.arange(max_n + 1), indexing="ij")
    return np.stack([parametric_speed(fit_parametric(m[name]), p, w) for name in TYPE_NAMES])


SPEED_MODELS = {"measured": measured_table, "parametric": parametric_table}


def speed_table(name: str = "measured") -> np.ndarray:
    if name not in SPEED_MODELS:
        raise ValueError(f"unknown speed model {name!r}; choose one of {', '.join(SPEED_MODELS)}")
    return SPEED_MODELS[name]()


def lookup(table: np.ndarray, types, ps, workers) -> np.ndarray:
    """Vectorised table lookup, counts clamped to the table. (In JAX: the same with `jnp.clip`.)"""
    n = table.shape[1] - 1
    return table[types, np.clip(ps, 0, n), np.clip(workers, 0, n)]


def epochs_trained(table: np.ndarray, types, ps, workers, factor=1.0, seconds=1.0) -> np.ndarray:
    """Epochs jobs of `types` train in `seconds` at (ps, workers) on `table`, their speed scaled by `factor`:
    the one speed formula (the simulator and the simulated backend train jobs with it, the daemon compares
    measured speeds with its epochs per second). Element-wise; the operation order is fixed (results are
    compared bit for bit across refactorings)."""
    types = np.asarray(types, int)
    return lookup(table, types, ps, workers) * factor * seconds / BATCHES_PER_EPOCH[types]
