"""Training speed of all-reduce (data-parallel) jobs on today's GPUs, from measurements.

The data (``data/pollux/``, README there: the Pollux OSDI'21 artifact, 6 models on up to 64 NVIDIA T4 GPUs,
16 nodes of 4) gives a job's seconds per iteration for a *placement* (GPUs used on each node; ``(2, 2)`` = 2 GPUs
on each of 2 nodes) and a *local batch* (samples per GPU per iteration). A job keeps its user's total batch B
(DL2's setting), so on K GPUs its local batch is B / K and its throughput B / step time samples per second.

How a step time is looked up (:class:`ThroughputModel`):

1. a measured (placement, local batch) gives exactly the measured step time (the mean where measured twice);
2. between two measured local batches of the same placement, linear interpolation in the local batch (so
   the lookup is monotone wherever the measurements are);
3. anywhere else, Pollux's own throughput model fitted to all of the model's measurements (:class:`PolluxFit`:
   compute linear in the local batch, gradient synchronisation linear in the GPU count with one cost on a
   single node and another across nodes, the two overlapped with exponent gamma), scaled to meet the
   placement's nearest measurement where the placement was measured at other batches.

Placements are compared by their sorted shape (``(1, 3)`` and ``(3, 1)`` are the same job). Beyond the largest
measured local batch of a model the fit extrapolates linearly in the batch; a real job there would need more
GPU memory or gradient accumulation, which this lookup does not model. How well the fit matches the data
(median relative error 4-7 % per model) is checked in tests/workload/test_throughput.py.
"""
from __future__ import annotations

import csv
import functools
import io
import math
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import Iterable, Sequence

import numpy as np

MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
Placement = tuple[int, ...]


def canonical(placement: Iterable[int]) -> Placement:
    """GPUs per node, largest first, nodes without GPUs dropped; ValueError for no GPU or a bad count."""
    gpus = []
    for g in placement:
        if isinstance(g, bool) or int(g) != g or g < 0:
            raise ValueError(f"a placement counts whole GPUs per node, got {g!r}")
        if g:
            gpus.append(int(g))
    if not gpus:
        raise ValueError("a placement needs at least one GPU")
    return tuple(sorted(gpus, reverse=True))


def placement_on(servers, gpus_per_worker: float) -> Placement | None:
    """GPUs per node of a job whose workers are on ``servers`` (one entry per worker); None without workers."""
    if not len(servers):
        return None
    g = max(int(round(gpus_per_worker)), 1)
    return canonical(n * g for n in Counter(int(s) for s in servers).values())


def even_spread(gpus: int, nodes: int) -> Placement:
    """``gpus`` spread as evenly as possible over ``nodes`` nodes."""
    if gpus < nodes or nodes < 1:
        raise ValueError(f"cannot spread {gpus} GPUs over {nodes} nodes, one at least each")
    base, extra = divmod(gpus, nodes)
    return canonical([base + 1] * extra + [base] * (nodes - extra))


@dataclass(frozen=True)
class Measurements:
    """One model's measured iterations: row i is placement[i] at local_bsz[i] -> step_time[i] seconds, of which
    sync_time[i] synchronising gradients (the rest computing them: what a gradient-accumulation step repeats)."""

    placements: tuple[Placement, ...]
    local_bsz: np.ndarray
    step_time: np.ndarray
    sync_time: np.ndarray

    def __len__(self) -> int:
        return len(self.placements)

    def __add__(self, other: "Measurements") -> "Measurements":
        return Measurements(self.placements + other.placements, np.concatenate([self.local_bsz, other.local_bsz]),
                            np.concatenate([self.step_time, other.step_time]),
                            np.concatenate([self.sync_time, other.sync_time]))


def _rows(text: str, source: str, columns: Sequence[str]):
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in columns if c not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"{source}: missing column(s) {', '.join(missing)}")
    for n, row in enumerate(reader, 2):
        yield n, row


def _positive(row, key: str, source: str, n: int) -> float:
    try:
        v = float(row[key])
    except (TypeError, ValueError):
        raise ValueError(f"{source} line {n}: {key} is not a number: {row[key]!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{source} line {n}: {key} must be a finite number > 0, got {row[key]!r}")
    return v


def _sync(row, step: float, source: str, n: int) -> float:
    """A row's sync_time: within [0, step_time]; 0 where the file has no such column."""
    if row.get("sync_time") in (None, ""):
        return 0.0
    try:
        v = float(row["sync_time"])
    except (TypeError, ValueError):
        raise ValueError(f"{source} line {n}: sync_time is not a number: {row['sync_time']!r}") from None
    if not math.isfinite(v) or not 0 <= v <= step:
        raise ValueError(f"{source} line {n}: sync_time must lie within [0, step_time], got {row['sync_time']!r}")
    return v


def parse_placements(text: str, source: str = "placements.csv") -> Measurements:
    """``placement,local_bsz,step_time,sync_time`` rows (placement: one digit per node)."""
    pl, bsz, st, sy = [], [], [], []
    for n, row in _rows(text, source, ("placement", "local_bsz", "step_time")):
        digits = str(row["placement"]).strip()
        if not digits.isdigit():
            raise ValueError(f"{source} line {n}: placement must be digits (GPUs per node), got {digits!r}")
        try:
            pl.append(canonical(int(d) for d in digits))
        except ValueError as e:
            raise ValueError(f"{source} line {n}: {e}") from None
        bsz.append(_positive(row, "local_bsz", source, n))
        st.append(_positive(row, "step_time", source, n))
        sy.append(_sync(row, st[-1], source, n))
    return Measurements(tuple(pl), np.array(bsz), np.array(st), np.array(sy))


def parse_scalability(text: str, source: str = "scalability.csv") -> Measurements:
    """``num_nodes,num_replicas,local_bsz,step_time,sync_time`` rows (replicas spread evenly over the nodes)."""
    pl, bsz, st, sy = [], [], [], []
    for n, row in _rows(text, source, ("num_nodes", "num_replicas", "local_bsz", "step_time")):
        try:
            pl.append(even_spread(int(row["num_replicas"]), int(row["num_nodes"])))
        except ValueError as e:
            raise ValueError(f"{source} line {n}: {e}") from None
        bsz.append(_positive(row, "local_bsz", source, n))
        st.append(_positive(row, "step_time", source, n))
        sy.append(_sync(row, st[-1], source, n))
    return Measurements(tuple(pl), np.array(bsz), np.array(st), np.array(sy))


def _check_model(model: str) -> None:
    if model not in MODELS:
        raise ValueError(f"no throughput measurements for model {model!r}; measured: {', '.join(MODELS)}")


@functools.cache
def measurements(model: str) -> Measurements:
    """All of a model's packaged measurements (both files)."""
    _check_model(model)
    base = resources.files("dl2d.workload").joinpath("data/pollux", model)
    return (parse_placements(base.joinpath("placements.csv").read_text(), f"pollux/{model}/placements.csv")
            + parse_scalability(base.joinpath("scalability.csv").read_text(), f"pollux/{model}/scalability.csv"))


# ------------------------------------------------------------------------------------------ Pollux's model

@dataclass(frozen=True)
class PolluxFit:
    """Pollux's throughput model (Qiao et al., OSDI'21, section 3.2) for one model:
    T_grad(m) = alpha_grad + beta_grad m; T_sync(K) = 0 for K = 1, alpha_local + beta_local (K - 2) on one
    node, alpha_node + beta_node (K - 2) across nodes; T_iter = (T_grad^gamma + T_sync^gamma)^(1 / gamma)."""

    alpha_grad: float
    beta_grad: float
    alpha_local: float
    beta_local: float
    alpha_node: float
    beta_node: float
    gamma: float

    def step_time(self, gpus, nodes, local_bsz):
        """Seconds per iteration (element-wise over arrays of GPU counts, node counts and local batches)."""
        gpus, nodes, m = (np.asarray(x, float) for x in (gpus, nodes, local_bsz))
        grad = self.alpha_grad + self.beta_grad * m
        sync = np.where(nodes > 1, self.alpha_node + self.beta_node * (gpus - 2),
                        self.alpha_local + self.beta_local * (gpus - 2))
        sync = np.where(gpus > 1, np.maximum(sync, 0.0), 0.0)
        g = self.gamma
        return (grad ** g + sync ** g) ** (1.0 / g)


def fit_pollux(m: Measurements) -> PolluxFit:
    """Least squares on log step time (relative error), every parameter >= 0, gamma in [1, 10]."""
    gpus = np.array([sum(p) for p in m.placements], float)
    nodes = np.array([len(p) for p in m.placements], float)
    one = gpus == 1
    if one.sum() >= 2:
        beta, alpha = np.polyfit(m.local_bsz[one], m.step_time[one], 1)
    else:
        alpha, beta = float(np.min(m.step_time)), 0.0
    x0 = np.array([max(alpha, 1e-3), max(beta, 1e-6), 0.05, 0.01, 0.2, 0.01, 2.0])

    def residual(x):
        return np.log(PolluxFit(*x).step_time(gpus, nodes, m.local_bsz)) - np.log(m.step_time)

    from scipy.optimize import least_squares  # noqa: PLC0415 (half a second to import: only where a fit is made)

    lo = np.array([1e-6, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    hi = np.array([np.inf] * 6 + [10.0])
    res = least_squares(residual, np.clip(x0, lo, hi), bounds=(lo, hi))
    return PolluxFit(*map(float, res.x))


# ------------------------------------------------------------------------------------------ the lookup

OFF_TABLE = ("fit", "interpolate")


class ThroughputModel:
    """Step time and throughput of one model at any placement and batch (rules in the module docstring)."""

    def __init__(self, m: Measurements):
        self.fit = fit_pollux(m)
        by: dict[Placement, dict[float, list[tuple[float, float]]]] = {}
        for p, b, t, y in zip(m.placements, m.local_bsz.tolist(), m.step_time.tolist(), m.sync_time.tolist()):
            by.setdefault(p, {}).setdefault(b, []).append((t, y))
        # per placement: sorted measured local batches, their mean step times and mean sync times
        self.points: dict[Placement, tuple[list[float], list[float], list[float]]] = {
            p: (sorted(v), [float(np.mean([t for t, _ in v[b]])) for b in sorted(v)],
                [float(np.mean([y for _, y in v[b]])) for b in sorted(v)]) for p, v in by.items()}
        self._m = m

    def measured(self, gpus: int) -> tuple[Placement, ...]:
        """The measured placements of ``gpus`` GPUs. Every other placement's step time is the fit's, which reads
        only the GPU count and whether the job spans nodes: what a search for the fastest placement needs."""
        return tuple(p for p in self.points if sum(p) == int(gpus))  # keys are canonical (step_time reads them so)

    def _fitted(self, p: Placement, local_bsz: float) -> float:
        return float(self.fit.step_time(sum(p), len(p), local_bsz))

    def _fitted_sync(self, p: Placement, local_bsz: float) -> float:
        """The fit's step time less its compute time: the part a gradient-accumulation step does not repeat."""
        grad = self.fit.alpha_grad + self.fit.beta_grad * float(local_bsz)
        return max(self._fitted(p, local_bsz) - grad, 0.0)

    def step_time(self, placement: Iterable[int], local_bsz: float) -> float:
        """Seconds per iteration at ``placement`` (GPUs per node) with ``local_bsz`` samples per GPU."""
        return self.times(placement, local_bsz)[0]

    def times(self, placement: Iterable[int], local_bsz: float, off_table: str = "fit") -> tuple[float, float]:
        """(step time, sync time) in seconds at ``placement`` with ``local_bsz`` samples per GPU. A measured
        placement: linear in the local batch between its measurements, the fit through the nearest one outside
        them. Any other placement: Pollux's fit (``off_table`` "fit"), or (``"interpolate"``, as the Pollux
        artifact's simulator does) linear interpolation over (nodes, GPUs, local batch) between all of the
        model's measurements, the fit where the point lies outside them."""
        if not math.isfinite(local_bsz) or local_bsz <= 0:
            raise ValueError(f"the local batch must be > 0, got {local_bsz!r}")
        if off_table not in OFF_TABLE:
            raise ValueError(f"off_table must be one of {', '.join(OFF_TABLE)}, got {off_table!r}")
        p = canonical(placement)
        if p not in self.points:
            if off_table == "interpolate":
                got = self._interpolated(len(p), sum(p), local_bsz)
                if got is not None:
                    return got
            return self._fitted(p, local_bsz), self._fitted_sync(p, local_bsz)
        xs, steps, syncs = self.points[p]
        i = bisect_left(xs, local_bsz)
        if i < len(xs) and xs[i] == local_bsz:
            return steps[i], syncs[i]
        if 0 < i < len(xs):  # between two measurements: linear
            w = (local_bsz - xs[i - 1]) / (xs[i] - xs[i - 1])
            return steps[i - 1] + w * (steps[i] - steps[i - 1]), syncs[i - 1] + w * (syncs[i] - syncs[i - 1])
        edge = 0 if i == 0 else len(xs) - 1  # outside the measured batches: the fit, through the nearest point
        step = self._fitted(p, local_bsz) * steps[edge] / self._fitted(p, xs[edge])
        return step, step * syncs[edge] / steps[edge]

    @functools.cached_property
    def _interpolator(self):
        """Piecewise-linear (step, sync) over (nodes, GPUs, local batch): the mean of the measurements at each
        point (scipy's Delaunay-based LinearNDInterpolator)."""
        from scipy.interpolate import LinearNDInterpolator  # noqa: PLC0415 (only where a placement is off the table)

        m = self._m
        keys: dict[tuple[float, float, float], list[tuple[float, float]]] = {}
        for p, b, t, y in zip(m.placements, m.local_bsz.tolist(), m.step_time.tolist(), m.sync_time.tolist()):
            keys.setdefault((float(len(p)), float(sum(p)), float(b)), []).append((t, y))
        xs = np.array(list(keys))
        ys = np.array([np.mean(v, axis=0) for v in keys.values()])
        return LinearNDInterpolator(xs, ys)

    def _interpolated(self, nodes: int, gpus: int, local_bsz: float) -> tuple[float, float] | None:
        got = self._interpolator([[float(min(nodes, 16)), float(gpus), float(local_bsz)]])[0]
        if not np.all(np.isfinite(got)) or got[0] <= 0:
            return None
        return float(got[0]), float(min(max(got[1], 0.0), got[0]))

    def throughput(self, placement: Iterable[int], total_batch: float) -> float:
        """Samples per second of a job keeping its total batch ``total_batch`` on ``placement``."""
        p = canonical(placement)
        return total_batch / self.step_time(p, total_batch / sum(p))


@functools.cache
def throughput_model(model: str) -> ThroughputModel:
    """The packaged measurements of ``model`` as a lookup (fitted once per process)."""
    return ThroughputModel(measurements(model))
