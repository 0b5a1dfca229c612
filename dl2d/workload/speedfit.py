"""A job's speed curve fitted from what was observed of it, and the speed-model file a site's measurements
become.

The curve: seconds per epoch on ``n`` units (workers, or GPUs) ``T(n) = a / n + b + c n`` (compute shared by
the units, a fixed per-step cost, a synchronisation cost growing with the units; ``a, b, c >= 0``, Optimus's
form without parameter servers), fitted by non-negative least squares to the mean seconds per epoch observed at
each size, leaning on a prior curve scaled to the observations (:func:`fit_speed_params`). The fitted Optimus
(dl2d.policy.baselines.optimus) fits one per job, in workers; ``dl2ctl calibrate`` one per job class, in GPUs.

:func:`anchored_curve` keeps what was measured where it was measured and the fitted form between.

The speed-model file (:func:`speed_model_doc`, :func:`load_speed_model`): JSON, ``format`` ``dl2d-speed-model``,
``version`` 1, and per class its fitted ``a``, ``b``, ``c``, ``seconds_per_epoch`` on 1..``max_gpus`` GPUs, and
what it was fitted from (the slots observed at each GPU count, or ``"prior"`` where too few were).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from dl2d.core.files import InputFileError, read_bounded

#: Weight of the prior in a fit, in samples (spread over every size): one observed slot counts as much.
PRIOR_WEIGHT = 1.0
SPEED_MODEL_FORMAT = "dl2d-speed-model"
SPEED_MODEL_VERSION = 1
#: Bounds of a speed-model file: a site's classes and cluster, generously; beyond them it is not one.
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_CLASSES = 10_000
MAX_GPUS = 4096
MAX_SECONDS_PER_EPOCH = 1e9
#: A class's recorded mix: jobs seen (a site's history) and their median epochs (the trace's bound on epochs)
MAX_JOBS = 10_000_000
MAX_EPOCHS = 1e6
#: A spread placement's slowdown (seconds per epoch over packed, less 1): from 10x faster to 100x slower
MIN_SLOWDOWN, MAX_SLOWDOWN = -0.9, 100.0
CLASS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/@+-]{0,127}\Z")


def _features(n: np.ndarray) -> np.ndarray:
    n = np.asarray(n, float)
    return np.stack([1.0 / n, np.ones_like(n), n], axis=-1)


def fit_speed_params(sizes, seconds_per_epoch, counts, prior_seconds: np.ndarray,
                     prior_weight: float = PRIOR_WEIGHT) -> tuple[np.ndarray, np.ndarray]:
    """``(theta, t)``: ``theta = (a, b, c)`` and ``t`` [max + 1], the believed seconds per epoch on 0..max units
    (index 0 unused: inf).

    ``sizes`` / ``seconds_per_epoch`` / ``counts``: the mean seconds per epoch observed at each size and how many
    slots it was observed; ``prior_seconds`` [max + 1]: the prior's seconds per epoch (index 0 unused). The
    prior is scaled to the observations (their count-weighted geometric mean ratio), then ``T`` is fitted to the
    observations and, with ``prior_weight`` samples' weight spread over every size, to the scaled prior, each
    row relative to its target (so a size's error counts in percent). A degenerate fit (all zero) gives the
    scaled prior."""
    from scipy.optimize import nnls  # noqa: PLC0415 (half a second to import: only where a curve is fitted)

    W = len(prior_seconds) - 1
    sizes = np.asarray(sizes, float)
    t_obs = np.asarray(seconds_per_epoch, float)
    n_obs = np.asarray(counts, float)
    k = np.arange(1, W + 1)
    prior = np.asarray(prior_seconds, float)[1:]
    if len(sizes):
        ratio = t_obs / prior[sizes.astype(int) - 1]
        prior = prior * math.exp(float(np.sum(n_obs * np.log(ratio)) / np.sum(n_obs)))
    rows = [_features(k) / prior[:, None] * math.sqrt(prior_weight / W)]
    target = [np.full(W, math.sqrt(prior_weight / W))]
    if len(sizes):
        rows.append(_features(sizes) / t_obs[:, None] * np.sqrt(n_obs)[:, None])
        target.append(np.sqrt(n_obs))
    theta, _ = nnls(np.concatenate(rows), np.concatenate(target))
    t = _features(k) @ theta
    t = np.where(t > 0, t, prior)
    return theta, np.concatenate([[np.inf], t])


def fit_speed_curve(sizes, seconds_per_epoch, counts, prior_seconds: np.ndarray,
                    prior_weight: float = PRIOR_WEIGHT) -> np.ndarray:
    """[max + 1] believed epochs per second on 0..max units (0 at 0): :func:`fit_speed_params`'s curve."""
    _, t = fit_speed_params(sizes, seconds_per_epoch, counts, prior_seconds, prior_weight)
    return np.concatenate([[0.0], 1.0 / t[1:]])


def anchored_curve(t_fit: np.ndarray, observed: Mapping[int, float]) -> np.ndarray:
    """[max + 1] seconds per epoch that are the ``observed`` means where a size was observed, and the fitted
    form ``t_fit`` elsewhere, scaled by its ratio to the observations: interpolated linearly between the two
    nearest observed sizes, the nearest one's beyond them. The smooth form cannot bend where a job starts to
    cross nodes (a measured curve can be slower on 8 GPUs than on 4); the observations can."""
    t = np.array(t_fit, float, copy=True)
    sizes = sorted(g for g in observed if 1 <= g < len(t))
    if not sizes:
        return t
    ratios = np.array([observed[g] / t_fit[g] for g in sizes])
    g = np.arange(1, len(t))
    t[1:] = t_fit[1:] * np.interp(g, sizes, ratios)  # constant beyond the ends
    for s in sizes:
        t[s] = observed[s]
    return t


# ------------------------------------------------------------------------------------------ the file

@dataclass(frozen=True)
class ClassSpeed:
    """One job class of a speed-model file: seconds per epoch on 1..max GPUs (index 0: inf)."""

    name: str
    seconds_per_epoch: np.ndarray
    fitted: bool  # False: too few observations, the stated prior (scaled to any there were)
    observed: Mapping[int, tuple[int, float]]  # GPUs -> (slots, mean seconds per epoch)
    jobs: int | None = None  # how many jobs of the class the daemon saw (the site's mix); None: not recorded
    epochs: float | None = None  # their median total epochs; None: not recorded
    #: seconds per epoch spread over more nodes than needed, over packed, less 1; None: never seen spread
    spread_slowdown: float | None = None

    def epochs_per_s(self, gpus: int) -> float:
        g = min(max(int(gpus), 0), len(self.seconds_per_epoch) - 1)
        return 0.0 if g == 0 else 1.0 / float(self.seconds_per_epoch[g])


@dataclass(frozen=True)
class SiteSpeeds:
    """A speed-model file's curves as the simulator uses them: seconds per epoch by class (model name) on
    1..max GPUs, hashable (tuples), so a simulator config holding it stays a value."""

    curves: tuple[tuple[str, tuple[float, ...]], ...]
    source: str = ""
    #: (class, jobs, median epochs) of the classes whose file records the site's job mix
    mix: tuple[tuple[str, int, float], ...] = ()
    #: (class, slowdown) of the classes seen spread over more nodes than they needed
    spread: tuple[tuple[str, float], ...] = ()

    @staticmethod
    def of(classes: Mapping[str, ClassSpeed], source: str = "") -> "SiteSpeeds":
        return SiteSpeeds(tuple(sorted((n, tuple(float(x) for x in c.seconds_per_epoch[1:]))
                                       for n, c in classes.items())), source,
                          tuple(sorted((n, int(c.jobs), float(c.epochs)) for n, c in classes.items()
                                       if c.jobs is not None and c.epochs is not None)),
                          tuple(sorted((n, float(c.spread_slowdown)) for n, c in classes.items()
                                       if c.spread_slowdown is not None)))

    def spread_slowdown(self, name: str) -> float:
        """A class's slowdown when spread over more nodes than it needs (0: none recorded)."""
        return dict(self.spread).get(name, 0.0)

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.curves)

    def epochs_per_s(self, name: str, gpus: int) -> float | None:
        """Epochs per second of a job of class ``name`` on ``gpus`` GPUs (beyond the curve: its last point);
        None when the file has no such class."""
        for n, curve in self.curves:
            if n == name:
                g = min(max(int(gpus), 0), len(curve))
                return 0.0 if g == 0 else 1.0 / curve[g - 1]
        return None


class SpeedModelError(ValueError):
    """A speed-model file that is not one: the message names the file and what is wrong."""


def speed_model_doc(classes: Mapping[str, tuple[np.ndarray, np.ndarray, bool, Mapping[int, tuple[int, float]]]],
                    source: str, mix: Mapping[str, tuple[int, float]] | None = None,
                    spread: Mapping[str, tuple[float, Mapping[int, tuple[int, float]]]] | None = None
                    ) -> dict[str, Any]:
    """The file's JSON: per class ``(theta, seconds per epoch [max + 1], fitted, observed)``; where ``mix`` has
    the class, its ``jobs`` (how many came) and ``epochs`` (their median total epochs); where ``spread`` has it,
    its ``spread`` slowdown and what was observed spread over more nodes than it needed."""
    out: dict[str, Any] = {"format": SPEED_MODEL_FORMAT, "version": SPEED_MODEL_VERSION, "source": source,
                           "curve": "seconds per epoch on g GPUs: T(g) = a / g + b + c g", "classes": {}}
    for name, (theta, t, fitted, observed) in sorted(classes.items()):
        out["classes"][name] = {
            "a": float(theta[0]), "b": float(theta[1]), "c": float(theta[2]), "fitted": bool(fitted),
            "seconds_per_epoch": [round(float(x), 6) for x in t[1:]],
            "observed": {str(g): {"slots": int(n), "seconds_per_epoch": round(float(s), 6)}
                         for g, (n, s) in sorted(observed.items())},
        }
        if mix and name in mix:
            out["classes"][name].update(jobs=int(mix[name][0]), epochs=round(float(mix[name][1]), 6))
        if spread and name in spread:
            slowdown, seen = spread[name]
            out["classes"][name]["spread"] = {
                "slowdown": round(float(slowdown), 6),
                "observed": {str(g): {"slots": int(n), "seconds_per_epoch": round(float(x), 6)}
                             for g, (n, x) in sorted(seen.items())}}
    return out


def parse_speed_model(text: str, source: str = "speed model") -> dict[str, ClassSpeed]:
    """The classes of a speed-model file's text; SpeedModelError names what is wrong."""
    def bad(what: str) -> SpeedModelError:
        return SpeedModelError(f"{source}: {what}")
    if len(text) > MAX_FILE_BYTES:
        raise bad(f"larger than {MAX_FILE_BYTES} bytes")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise bad(f"not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != SPEED_MODEL_FORMAT:
        raise bad(f'not a speed model: "format" must be "{SPEED_MODEL_FORMAT}"')
    if doc.get("version") != SPEED_MODEL_VERSION:
        raise bad(f"version {doc.get('version')!r} is not one this dl2d reads ({SPEED_MODEL_VERSION})")
    classes = doc.get("classes")
    if not isinstance(classes, dict) or not classes:
        raise bad('"classes" must be a non-empty object')
    if len(classes) > MAX_CLASSES:
        raise bad(f"more than {MAX_CLASSES} classes")
    out = {}
    for name, c in classes.items():
        if not CLASS_NAME.match(name):
            raise bad(f"class name {name!r}: 1-128 of letters, digits, . _ / @ + -")
        curve = c.get("seconds_per_epoch") if isinstance(c, dict) else None
        if not isinstance(curve, list) or not 1 <= len(curve) <= MAX_GPUS:
            raise bad(f"class {name}: seconds_per_epoch must be a list of 1-{MAX_GPUS} numbers")
        for g, x in enumerate(curve, 1):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x <= MAX_SECONDS_PER_EPOCH:
                raise bad(f"class {name}: seconds_per_epoch on {g} GPUs must be a number in (0, "
                          f"{MAX_SECONDS_PER_EPOCH:g}], got {x!r}")
        observed = {}
        for g, o in (c.get("observed") or {}).items():
            try:
                observed[int(g)] = (int(o["slots"]), float(o["seconds_per_epoch"]))
            except (TypeError, ValueError, KeyError):
                raise bad(f"class {name}: observed[{g!r}] must be {{slots, seconds_per_epoch}}") from None
        jobs, epochs = c.get("jobs"), c.get("epochs")
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS):
            raise bad(f"class {name}: jobs must be an integer in [1, {MAX_JOBS}], got {jobs!r}")
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, (int, float))
                                   or not 0 < epochs <= MAX_EPOCHS):
            raise bad(f"class {name}: epochs must be a number in (0, {MAX_EPOCHS:g}], got {epochs!r}")
        spread = c.get("spread")
        slowdown = None
        if spread is not None:
            slowdown = spread.get("slowdown") if isinstance(spread, dict) else None
            if isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)) or \
                    not MIN_SLOWDOWN <= slowdown <= MAX_SLOWDOWN:
                raise bad(f"class {name}: spread.slowdown must be a number in [{MIN_SLOWDOWN:g}, {MAX_SLOWDOWN:g}], "
                          f"got {slowdown!r}")
        out[name] = ClassSpeed(name, np.array([np.inf] + [float(x) for x in curve]), bool(c.get("fitted")),
                               observed, jobs, None if epochs is None else float(epochs),
                               None if slowdown is None else float(slowdown))
    return out


def load_speed_model(path: str | Path) -> dict[str, ClassSpeed]:
    """:func:`parse_speed_model` of a file; SpeedModelError for one that cannot be read, is no regular file (a
    FIFO would hang the read, /dev/zero never ends and says it is empty) or is larger than MAX_FILE_BYTES
    (dl2d.core.files.read_bounded)."""
    p = Path(path)
    try:
        text = read_bounded(p, MAX_FILE_BYTES).decode("utf-8")
    except InputFileError as e:
        if e.too_large:
            raise SpeedModelError(f"{p}: larger than {MAX_FILE_BYTES} bytes") from None
        raise SpeedModelError(f"{p}: cannot read it ({e.reason})") from None
    except UnicodeDecodeError as e:
        raise SpeedModelError(f"{p}: cannot read it (not UTF-8 text: byte {e.start})") from None
    return parse_speed_model(text, str(p))
