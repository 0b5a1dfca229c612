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
from dataclasses import dataclass, replace
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


def grad_stats_at(r: GradientRuns, batches, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(grad_sqr, grad_var) during ``epoch`` at each total batch of ``batches`` (an array): linear in the batch
    between the measured runs, the nearest run's outside them."""
    e = min(max(int(epoch), 0), r.epochs - 1)
    return np.interp(batches, r.batches, r.grad_sqr[:, e]), np.interp(batches, r.batches, r.grad_var[:, e])


def grad_stats(r: GradientRuns, batch: float, epoch: int) -> tuple[float, float]:
    """:func:`grad_stats_at` at one batch, as floats."""
    sqr, var = grad_stats_at(r, batch, epoch)
    return float(sqr), float(var)


def grad_stats_by_epoch(r: GradientRuns, batch: float) -> tuple[np.ndarray, np.ndarray]:
    """[E] (grad_sqr, grad_var) of every epoch at total batch ``batch``: :func:`grad_stats` for all epochs at once."""
    b = r.batches
    i = int(np.clip(np.searchsorted(b, batch) - 1, 0, len(b) - 2)) if len(b) > 1 else 0
    f = float(np.clip((batch - b[i]) / (b[i + 1] - b[i]), 0.0, 1.0)) if len(b) > 1 else 0.0
    j = min(i + 1, len(b) - 1)
    return (1 - f) * r.grad_sqr[i] + f * r.grad_sqr[j], (1 - f) * r.grad_var[i] + f * r.grad_var[j]


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


# ------------------------------------------------------------------------------------------------- online fit

#: How many reports the model's measured noise counts for in a job's fit: a job's first report moves its belief
#: a third of the way (in log noise scale) from its model's to its own.
PRIOR_REPORTS = 2.0
#: The most one report may say a job's noise scale differs from its model's (a factor either way): a report of a
#: diverging step or of an estimate near zero moves the fit by this much at most.
MAX_REPORT_RATIO = 1e3


@dataclass(frozen=True)
class NoiseFit:
    """What the scheduler has learned of one job's gradient noise from its own reports: the sum over ``reports``
    of log(reported noise scale / its model's at the same batch and epoch), the noise scale being
    grad_var / grad_sqr at the model's initial batch (the only thing the gain depends on). Its belief is its
    model's measured statistics with the variance scaled by :meth:`ratio`, the mean log ratio shrunk toward 0 by
    :data:`PRIOR_REPORTS`. ``sqr`` / ``var``: the last report, as the job gave it."""

    reports: int = 0
    log_ratio: float = 0.0
    sqr: float = math.nan
    var: float = math.nan
    epochs: float = -1.0  # the job's progress at the last report counted (a report is counted once)

    def ratio(self) -> float:
        return math.exp(self.log_ratio / (self.reports + PRIOR_REPORTS))

    def to_json(self) -> dict:
        return {"reports": self.reports, "log_ratio": self.log_ratio, "epochs": self.epochs,
                **({"sqr": self.sqr, "var": self.var} if self.reports else {})}

    @classmethod
    def from_json(cls, doc) -> "NoiseFit":
        """The fit as stored (None or a damaged document: no reports yet)."""
        try:
            fit = cls(int(doc["reports"]), float(doc["log_ratio"]), float(doc.get("sqr", math.nan)),
                      float(doc.get("var", math.nan)), float(doc.get("epochs", -1.0)))
        except (TypeError, KeyError, ValueError):
            return cls()
        return fit if fit.reports >= 0 and math.isfinite(fit.log_ratio) and math.isfinite(fit.epochs) else cls()


def fit_noise(fit: NoiseFit, reported: tuple[float, float], prior: tuple[float, float],
              epochs: float = -1.0) -> NoiseFit:
    """``fit`` after one more report ``reported`` = (grad_sqr > 0, grad_var >= 0) at the model's initial batch,
    made at the job's progress ``epochs``, against ``prior``, its model's at the same batch and epoch. ValueError
    for a report that is not finite or not positive (it is never applied)."""
    sqr, var = (float(x) for x in reported)
    if not (math.isfinite(sqr) and math.isfinite(var) and sqr > 0 and var >= 0):
        raise ValueError(f"a gradient noise report needs grad_sqr > 0 and grad_var >= 0, finite, got {reported!r}")
    p_sqr, p_var = prior
    if not p_sqr > 0 or not p_var > 0:
        return replace(fit, sqr=sqr, var=var, epochs=float(epochs))  # no model noise to compare with: nothing learnt
    bound = math.log(MAX_REPORT_RATIO)
    r = min(max(math.log(max(var / sqr, 1e-300) / (p_var / p_sqr)), -bound), bound)
    return NoiseFit(fit.reports + 1, fit.log_ratio + r, sqr, var, float(epochs))


def fitted_stats(fit: NoiseFit, prior: tuple[float, float]) -> tuple[float, float]:
    """The statistics the scheduler believes of the job: its model's ``prior`` with the variance scaled by the
    fit's ratio."""
    return float(prior[0]), float(prior[1]) * fit.ratio()


def job_prior(model: str, batch: float, epoch: float) -> tuple[float, float]:
    """(grad_sqr, grad_var) of ``model``'s measured runs at total batch ``batch`` during epoch ``epoch`` (the
    belief of a job before it reports)."""
    return grad_stats(runs(model), batch, int(epoch))


def job_stats(model: str, batch: float, epoch: float, fit: NoiseFit) -> tuple[float, float]:
    """What the scheduler believes of an adaptive job's gradient statistics now: its model's measured ones at its
    batch and epoch, fitted to its own reports."""
    return fitted_stats(fit, job_prior(model, batch, epoch))
