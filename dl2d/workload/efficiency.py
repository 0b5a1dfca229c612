"""Statistical efficiency: how much training progress one iteration at a total batch makes, from the gradient
statistics the Pollux artifact measured (``data/pollux/<model>/validation-<B>.csv``: per epoch of a run at total
batch B, the cumulative ``progress``, the gradient's squared norm ``grad_sqr`` and its variance ``grad_var``).

Progress is counted in iterations at the model's initial (smallest measured) batch M0 (dl2d.workload.batching).
One iteration at total batch M = s x M0 makes ``gain = (grad_var + grad_sqr) / (grad_var / s + grad_sqr)`` of
them (Pollux, OSDI'21, section 3.1: the gradient noise decides how much a larger batch is worth), with the
statistics of the epoch the job is in, interpolated linearly in the batch between measured runs. A job is done
when its progress reaches the progress the model's runs all reach by their last epoch, and epoch e begins at the
progress every run reaches by epoch e (the least of them), as in the artifact's simulator.

:func:`iterations_to_finish` is what a job keeping one total batch needs under this rule: the sum over its epochs
of the epoch's progress divided by the epoch's gain.
"""
from __future__ import annotations

import csv
import functools
import io
import math
from dataclasses import dataclass
from importlib import resources

import numpy as np

from dl2d.workload.throughput import MODELS

_COLUMNS = ("progress", "grad_sqr", "grad_var", "iteration")


@dataclass(frozen=True)
class GradientRuns:
    """One model's measured runs: ``batches`` [R] ascending, and per run and epoch [R, E] the cumulative progress at
    the epoch's end, the gradient statistics during it and the cumulative iterations at its end."""

    batches: np.ndarray
    progress: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray
    iterations: np.ndarray

    @property
    def epochs(self) -> int:
        return self.progress.shape[1]

    @property
    def init(self) -> float:
        return float(self.batches[0])

    @functools.cached_property
    def epoch_starts(self) -> np.ndarray:
        """[E + 1] the progress at which each epoch begins (the least any run reached by it), and the target last."""
        return np.concatenate([[0.0], self.progress.min(axis=0)])


def parse_runs(files: dict[int, str], source: str) -> GradientRuns:
    """The runs of ``files`` ({total batch: validation CSV text}); ValueError naming the file and line of a bad
    field, or runs of different lengths."""
    rows = {}
    for batch, text in sorted(files.items()):
        reader = csv.DictReader(io.StringIO(text))
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{source} validation-{batch}.csv: missing column(s) {', '.join(missing)}")
        run = []
        for n, row in enumerate(reader, 2):
            values = []
            for key in _COLUMNS:
                try:
                    v = float(row[key])
                except (TypeError, ValueError):
                    raise ValueError(f"{source} validation-{batch}.csv line {n}: {key} is not a number") from None
                if not math.isfinite(v) or v < 0 or (key == "progress" and v <= 0):
                    raise ValueError(f"{source} validation-{batch}.csv line {n}: {key} out of range: {row[key]!r}")
                values.append(v)
            run.append(values)
        if not run:
            raise ValueError(f"{source} validation-{batch}.csv: no epochs")
        rows[batch] = np.array(run)
    if len({len(r) for r in rows.values()}) != 1:
        raise ValueError(f"{source}: runs of different epochs: { {b: len(r) for b, r in rows.items()} }")
    data = np.stack([rows[b] for b in sorted(rows)])
    return GradientRuns(np.array(sorted(rows), float), data[..., 0], data[..., 1], data[..., 2], data[..., 3])


@functools.cache
def runs(model: str) -> GradientRuns:
    """The packaged runs of ``model``."""
    if model not in MODELS:
        raise ValueError(f"no gradient statistics for model {model!r}; measured: {', '.join(MODELS)}")
    base = resources.files("dl2d.workload").joinpath("data/pollux", model)
    files = {int(f.name[len("validation-"):-len(".csv")]): f.read_text() for f in base.iterdir()
             if f.name.startswith("validation-") and f.name.endswith(".csv")}
    return parse_runs(files, f"pollux/{model}")


def grad_stats(r: GradientRuns, batch: float, epoch: int) -> tuple[float, float]:
    """(grad_sqr, grad_var) during ``epoch`` at total batch ``batch``: linear in the batch between the measured
    runs, the nearest run's outside them."""
    e = min(max(int(epoch), 0), r.epochs - 1)
    return (float(np.interp(batch, r.batches, r.grad_sqr[:, e])), float(np.interp(batch, r.batches, r.grad_var[:, e])))


def measured_iterations(r: GradientRuns, batch: float, epoch: int) -> float:
    """The cumulative iterations of the measured runs at the end of epoch ``epoch`` (0-based), linear in the batch
    between runs (what the Pollux artifact's Optimus+Oracle knows of a job's remaining work)."""
    e = min(max(int(epoch), 0), r.epochs - 1)
    return float(np.interp(batch, r.batches, r.iterations[:, e]))


def gain_of(stats, batch, init):
    """Progress (iterations at batch ``init``) of one iteration at ``batch`` with gradient statistics ``stats`` =
    (grad_sqr, grad_var): ``(var + sqr) / (var / s + sqr)``, s = batch / init; 1 where that is not defined.
    Element-wise over arrays."""
    sqr, var = stats
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = var / (batch / init) + sqr
        return np.where(denom > 0, (var + sqr) / denom, 1.0)[()]


def gain(r: GradientRuns, batch: float, epoch: int) -> float:
    """Progress (iterations at the initial batch) one iteration at total batch ``batch`` makes during ``epoch``."""
    return gain_of(grad_stats(r, batch, epoch), batch, r.init)


@functools.lru_cache(maxsize=65536)
def iterations_to_finish(model: str, batch: float) -> float:
    """Iterations a job of ``model`` keeping total batch ``batch`` needs to reach its model's target progress."""
    if not math.isfinite(batch) or batch <= 0:
        raise ValueError(f"the total batch must be > 0, got {batch!r}")
    r = runs(model)
    widths = np.diff(r.epoch_starts)
    return float(sum(w / gain(r, batch, e) for e, w in enumerate(widths)))
