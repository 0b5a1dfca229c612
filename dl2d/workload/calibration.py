"""A site's speed model from what its daemon measured (``dl2ctl calibrate``): per job class, seconds per epoch
over GPUs, fitted to the speeds stored per slot (``job_slot_stats``). Pure: rows in, classes out.

* A **class** is a job's ``label`` (its spec's, ``dl2ctl submit --label``) or else its model (job type): jobs
  of one class should train alike (same model, same total batch); give jobs of one model at different batches
  different labels.
* A **sample** is one slot a job trained through at an unchanged size: the slot before it was the job's too, at
  the same workers, and it trained in it; the job did not end in it or in the next. A slot with a start or a
  resize holds the restart's lost time, which is no speed, and so does the slot a start that outlasts a slot
  (a JAX job's processes importing and compiling) ends in; a slot a job ended in, an unknown fraction of it,
  and the one before, its last steps, saving and exiting.
* Per class the mean seconds per epoch at each GPU count (workers x GPUs per worker) is fitted with
  ``T(g) = a / g + b + c g`` (dl2d.workload.speedfit), leaning on the stated prior (dl2d.workload.prior: the
  measured models' median speed-up, and the jobs' one-GPU epoch-time hint or the median one) scaled to what
  was seen; the curve written is the observed mean at every GPU count observed and the fitted form, scaled to
  the nearest observations, between and beyond them (``anchored_curve``: the smooth form alone cannot bend
  where jobs start to cross nodes, 30 % off on 8 GPUs of 4-GPU nodes for cifar10 and deepspeech2). A class with fewer than ``min_slots`` samples is **not fitted**: it gets that prior, scaled to the
  samples it has, and the file says so (``"fitted": false``).
* Packed vs spread: the daemon stores how many nodes a job spanned in each slot (``job_slot_stats.nodes``).
  The curve is fitted to the packed samples (the fewest nodes that hold the job's GPUs, or the node count
  unknown); samples spread over more nodes give the class's *spread slowdown*, one number: their mean seconds
  per epoch over the packed curve's, less 1 (:func:`spread_slowdown`). The simulator applies it to a job of
  that class placed over more nodes than it needs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from dl2d.workload.catalog import packed
from dl2d.workload.prior import default_epoch_seconds, prior_speedup
from dl2d.workload.speedfit import anchored_curve, fit_speed_params

#: Samples (slots) a class needs before its own curve is fitted; fewer: the scaled prior.
MIN_SLOTS = 3
#: The prior's weight when a class is not fitted: its observations then only scale it.
PRIOR_ONLY_WEIGHT = 1e6


@dataclass
class ClassSamples:
    """What was seen of one class: GPUs -> seconds per epoch of each sample; the jobs; their hints."""

    name: str
    seconds: dict[int, list[float]] = field(default_factory=dict)  # packed, or placement unknown
    spread: dict[int, list[float]] = field(default_factory=dict)  # over more nodes than the fewest that hold it
    jobs: set = field(default_factory=set)
    total_epochs: dict[int, float] = field(default_factory=dict)  # job -> its total epochs, where valid
    requested_gpus: list[int] = field(default_factory=list)
    epoch_seconds_hints: list[float] = field(default_factory=list)

    @property
    def slots(self) -> int:
        return sum(len(v) for v in self.seconds.values())


def job_class(job_type: str, spec: Mapping[str, Any]) -> str:
    """A job's class: its spec's label, else its model (lower case)."""
    label = spec.get("label")
    return str(label) if label else str(job_type).lower()


def _gpus_per_worker(spec: Mapping[str, Any]) -> int:
    g = (spec.get("worker") or {}).get("gpus")
    return max(int(math.ceil(float(g))), 1) if isinstance(g, (int, float)) and not isinstance(g, bool) and g > 0 \
        else 1


def _same_run(prev: Mapping[str, Any] | None, r: Mapping[str, Any]) -> bool:
    """Whether slot row ``r`` follows ``prev`` at once with the job at the same size on as many nodes."""
    return (prev is not None and int(prev["number"]) == int(r["number"]) - 1
            and int(prev["workers"]) == int(r["workers"]) and prev.get("nodes") == r.get("nodes"))


def gather(rows: Iterable[Mapping[str, Any]], per_node: int | None = None) -> dict[str, ClassSamples]:
    """The samples of every all-reduce class from ``job_slot_stats`` rows joined with their job (``job_id``,
    ``number``: the slot's, ``workers``, ``epochs_per_s``, ``ended``, ``job_type``, ``spec``, ``nodes``,
    ``total_epochs``), in any order. With ``per_node`` (GPUs of a node), a sample whose job spanned more nodes than the fewest that hold
    its GPUs is a *spread* one; a slot in which the job's node count changed at the same size (it moved: a
    restart) is no sample."""
    by_job: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_job.setdefault(int(r["job_id"]), []).append(r)
    classes: dict[str, ClassSamples] = {}
    for job_id, rs in by_job.items():
        rs.sort(key=lambda r: int(r["number"]))
        spec = rs[0]["spec"] or {}
        if spec.get("kind") != "allreduce":
            continue
        name = job_class(rs[0]["job_type"], spec)
        c = classes.setdefault(name, ClassSamples(name))
        g = _gpus_per_worker(spec)
        if job_id not in c.jobs:
            c.jobs.add(job_id)
            c.requested_gpus.append(int(spec.get("workers") or 1) * g)
            if isinstance(spec.get("epoch_seconds"), (int, float)) and spec["epoch_seconds"] > 0:
                c.epoch_seconds_hints.append(float(spec["epoch_seconds"]))
            e = rs[0].get("total_epochs")
            if isinstance(e, (int, float)) and not isinstance(e, bool) and e > 0 and math.isfinite(e):
                c.total_epochs[job_id] = float(e)
        for i, r in enumerate(rs):
            speed, w = float(r["epochs_per_s"] or 0.0), int(r["workers"])
            prev, after = (rs[i - 1] if i else None), (rs[i + 1] if i + 1 < len(rs) else None)
            if not (_same_run(prev, r) and float(prev["epochs_per_s"] or 0.0) > 0):
                continue  # a start or resize, or the slot the job's (re)start ended in: part of it was no training
            if after is not None and _same_run(r, after) and after["ended"]:
                continue  # the job ended in the next slot: its last steps, saving and exiting, may fall in this one
            if w > 0 and speed > 0 and math.isfinite(speed) and not r["ended"]:
                nodes = r.get("nodes")
                spread = per_node is not None and nodes is not None and int(nodes) > len(packed(w * g, per_node))
                (c.spread if spread else c.seconds).setdefault(w * g, []).append(1.0 / speed)
    return classes


def spread_slowdown(c: ClassSamples, curve: np.ndarray) -> tuple[float, dict[int, tuple[int, float]]] | None:
    """How much slower a class trains spread over more nodes than packed: the mean over its spread samples of
    their seconds per epoch over the packed ``curve``'s at their GPU count, less 1 (0.6: 60 % longer); and what
    was observed spread (GPUs -> (slots, mean seconds)). None when it was never seen spread."""
    sizes = sorted(g for g in c.spread if g < len(curve))
    if not sizes:
        return None
    ratios = [x / curve[g] for g in sizes for x in c.spread[g]]
    observed = {g: (len(c.spread[g]), float(np.mean(c.spread[g]))) for g in sizes}
    return float(np.mean(ratios)) - 1.0, observed


def class_mix(samples: Mapping[str, ClassSamples]) -> dict[str, tuple[int, float]]:
    """Per all-reduce class of :func:`gather`'s, (how many jobs, the median of their ``total_epochs``): the
    site's own job mix, so that training on its twin draws jobs of its classes as often and as long as they
    came."""
    return {name: (len(c.total_epochs), float(np.median(list(c.total_epochs.values()))))
            for name, c in samples.items() if c.total_epochs}


def class_prior(c: ClassSamples, per_node: int, max_gpus: int) -> np.ndarray:
    """[max_gpus + 1] the stated prior's seconds per epoch of a class on 0..max_gpus GPUs (index 0 unused)."""
    requested = int(np.median(c.requested_gpus)) if c.requested_gpus else 1
    speedup = prior_speedup(max(requested, 1), 1, per_node, max_gpus)
    one_gpu = float(np.median(c.epoch_seconds_hints)) if c.epoch_seconds_hints else default_epoch_seconds()
    with np.errstate(divide="ignore"):
        return one_gpu / speedup


def fit_class(c: ClassSamples, per_node: int, max_gpus: int, min_slots: int = MIN_SLOTS):
    """``(theta, seconds per epoch [max_gpus + 1], fitted, observed)`` of one class (module doc)."""
    sizes = sorted(g for g in c.seconds if g <= max_gpus)
    means = [float(np.mean(c.seconds[g])) for g in sizes]
    counts = [len(c.seconds[g]) for g in sizes]
    fitted = sum(counts) >= min_slots
    theta, t = fit_speed_params(sizes, means, counts, class_prior(c, per_node, max_gpus),
                                1.0 if fitted else PRIOR_ONLY_WEIGHT)
    if fitted:
        t = anchored_curve(t, dict(zip(sizes, means)))
    return theta, t, fitted, {g: (n, m) for g, n, m in zip(sizes, counts, means)}


def _check(per_node: int, max_gpus: int, min_slots: int) -> None:
    if per_node < 1 or max_gpus < 1 or min_slots < 1:
        raise ValueError("per_node, max_gpus and min_slots must be at least 1")


def fit_classes(samples: Mapping[str, ClassSamples], per_node: int, max_gpus: int, min_slots: int = MIN_SLOTS):
    """Every class's :func:`fit_class` (its packed samples); {} when there is none."""
    _check(per_node, max_gpus, min_slots)
    return {name: fit_class(c, per_node, max_gpus, min_slots) for name, c in samples.items()}


def calibrate(rows: Iterable[Mapping[str, Any]], per_node: int, max_gpus: int, min_slots: int = MIN_SLOTS):
    """Every all-reduce class's :func:`fit_class` from the stored rows; {} when there is none."""
    _check(per_node, max_gpus, min_slots)  # before gather, which divides by per_node
    return fit_classes(gather(rows, per_node), per_node, max_gpus, min_slots)


def calibrate_spread(samples: Mapping[str, ClassSamples], classes: Mapping[str, tuple]) -> dict:
    """Per class of :func:`gather`'s seen spread, :func:`spread_slowdown` against its calibrated (packed)
    curve."""
    out = {}
    for name, c in samples.items():
        found = spread_slowdown(c, classes[name][1]) if name in classes else None
        if found is not None:
            out[name] = found
    return out
