"""Job traces: seeded generation, and saving/loading as JSON or CSV.

A trace is the list of jobs of one experiment, with what the scheduler is told (arrival slot, type, the
user's epoch estimate) and what it is not (the true epochs to convergence and the job's persistent speed
factor from interference). Loading checks every field and names the offending line or job.

A trace file is input from users (``dl2ctl sim --trace``), so :func:`load` bounds it before building anything
from it: the file's size, the number of JSON objects and lists, the number of jobs, then every field's type
and range (the ``MAX_*`` / ``MIN_*`` constants below, docs/simulator.md). Every rejection is a TraceError.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from dl2d.core.files import InputFileError, read_bounded
from dl2d.workload.catalog import IS_ALLREDUCE, MODEL_NAMES, UNSEEN, model_index
from dl2d.workload.jobtypes import JOB_TYPES, MAX_EPOCHS, TYPE_NAMES, type_index

FORMAT = "dl2d-trace"
VERSION = 1
SLOTS_PER_DAY = 72  # 20-minute slots
CSV_FIELDS = ("id", "arrival_slot", "type", "est_epochs", "true_epochs", "speed_factor")
#: optional columns (all-reduce jobs need a batch size; every job may say how many workers it asked for, when
#: within the slot before its arrival slot it was submitted, and, 1 or 0, whether it lets the scheduler choose its
#: total batch)
OPTIONAL_FIELDS = ("batch_size", "requested_workers", "submitted_slot", "adaptive_batch")

# Bounds of a trace file, checked while it is read, before anything is built from it. They are far
# beyond any real experiment; what lies past them is a mistake (or an attack) that would otherwise run for days,
# exhaust memory or end in a simulation that can never finish.
#: A 50 000-job trace as `save` writes it is 8-11 MB of JSON (about 200 bytes a job) or 3 MB of CSV; 16 MiB
#: leaves room for other formatting and bounds what parsing may allocate (JSON scalars cost ~10x their text).
MAX_TRACE_BYTES = 16 * 1024 * 1024
#: 40x the largest experiment shipped here (`dl2ctl sim --cluster t4-128 --jobs 1280`); the simulator's work
#: per slot grows with the queue, so a 200 000-job trace would run for days.
MAX_TRACE_JOBS = 50_000
#: '{' and '[' in a JSON trace, counted before parsing: one object per job, the rest for the document and its
#: config. Without it 16 MiB of "[{},{},...]" would become 5 million objects (400 MB). Brackets inside
#: strings count too, which only errs on the safe side.
MAX_JSON_CONTAINERS = MAX_TRACE_JOBS + 1_000
#: The simulator gives up 50 000 slots after the first arrival (engine.SimConfig.max_slots); arrivals later
#: than 40 000 leave the last jobs too little time. 40 000 slots are 28 days of 60 s slots, 1.5 years of 20 min.
MAX_ARRIVAL_SLOT = 40_000
#: Epochs (estimated and true): the catalog's models converge in 2-100 epochs, DL2's types in up to 300 x 1.1
#: (x 2 with the largest estimate error); 10 000 is 15x that. The floor is the generator's (0.01 true epochs):
#: the reward divides by the estimate, so a denormal one would make it infinite.
MIN_EPOCHS = 0.01
MAX_TRACE_EPOCHS = 10_000.0
#: The hidden interference factor multiplies a job's speed; the generator's (log-normal, sigma 0.27, DL2's
#: measured 27 % JCT variation) stays within [0.3, 3]. Two orders of magnitude either way is generous; a factor
#: of 1e-300 is a job that never finishes.
MIN_SPEED_FACTOR = 0.01
MAX_SPEED_FACTOR = 100.0
#: Total batch of an all-reduce job: 32x the largest measured one (NCF's 32 768, dl2d/workload/data/pollux).
MAX_BATCH_SIZE = 2 ** 20
#: Workers a job asks for: twice the GPUs of the largest cluster preset (t4-512: 2048 GPUs); the simulator
#: gives a job at most its world's max_workers (64 today, 16 in DL2's world) anyway.
MAX_REQUESTED_WORKERS = 4096
#: A model name is a few characters; a longer "type" is shown cut in the error, not looked up.
MAX_TYPE_CHARS = 133  # "site:" and a class name of at most 128 (dl2d.workload.speedfit.CLASS_NAME)
#: (low, high, low bound open, integer) of every numeric field of a job record.
FIELD_BOUNDS: dict[str, tuple[float, float, bool, bool]] = {
    "arrival_slot": (0, MAX_ARRIVAL_SLOT, False, True),
    "submitted_slot": (0, MAX_ARRIVAL_SLOT, False, False),
    "est_epochs": (MIN_EPOCHS, MAX_TRACE_EPOCHS, False, False),
    "true_epochs": (MIN_EPOCHS, MAX_TRACE_EPOCHS, False, False),
    "speed_factor": (MIN_SPEED_FACTOR, MAX_SPEED_FACTOR, False, False),
    "batch_size": (0, MAX_BATCH_SIZE, False, False),  # > 0 for an all-reduce job; a PS job's may be 0 (unused)
    "requested_workers": (1, MAX_REQUESTED_WORKERS, False, True),
    "adaptive_batch": (0, 1, False, True),
}


#: A trace file's ``type`` of a job of a site's own class (dl2d.workload.speedfit): ``site:my-llm``.
SITE_PREFIX = "site:"


class TraceError(ValueError):
    """A trace file or trace config that cannot be used; the message says where and why."""


@dataclass(frozen=True)
class TraceConfig:
    num_jobs: int = 200
    max_arrivals_per_slot: int = 10
    arrival_pattern: str = "daily"  # daily | uniform | poisson
    epochs_model: str = "dl2"  # dl2: per-type epochs x U(0.9, 1.1); weibull: Weibull(k=2) x MAX/3
    epoch_estimate_error: float = 0.0  # true = estimate x (1 + e U(-1, 1)), DL2 Fig. 16
    interference_sigma: float = 0.27  # per-job log-normal speed factor (DL2: 27.3% JCT variation)
    job_types: tuple[str, ...] = TYPE_NAMES

    def __post_init__(self):
        if self.num_jobs < 1:
            raise TraceError("num_jobs must be at least 1")
        if self.max_arrivals_per_slot < 1:
            raise TraceError("max_arrivals_per_slot must be at least 1")
        if self.arrival_pattern not in ("daily", "uniform", "poisson"):
            raise TraceError(f"arrival_pattern must be daily, uniform or poisson, not {self.arrival_pattern!r}")
        if self.epochs_model not in ("dl2", "weibull"):
            raise TraceError(f"epochs_model must be dl2 or weibull, not {self.epochs_model!r}")
        if not 0 <= self.epoch_estimate_error < 1:
            raise TraceError("epoch_estimate_error must be in [0, 1)")
        if self.interference_sigma < 0:
            raise TraceError("interference_sigma must be >= 0")
        for t in self.job_types:
            try:
                type_index(t)
            except ValueError as e:
                raise TraceError(str(e)) from None


@dataclass(frozen=True)
class Trace:
    """Jobs sorted by arrival, as parallel arrays (job i is row i).

    A job is submitted at ``submitted`` (in slots, fractional) and first seen by the scheduler at the next slot
    boundary, ``arrival_slot`` = ceil(submitted), as a daemon deciding at slot boundaries sees it; its JCT counts
    from its submission. A trace of whole-slot arrivals (the DL2 world's) has ``submitted`` = ``arrival_slot``.
    ``type_idx`` indexes dl2d.workload.catalog.MODEL_NAMES: a DL2 type (a PS job) or an all-reduce model,
    whose jobs keep their total ``batch_size`` whatever their size (0 for PS jobs: their speed table has it)."""

    arrival_slot: np.ndarray  # int
    type_idx: np.ndarray  # int, into catalog.MODEL_NAMES
    est_epochs: np.ndarray  # what the user told the scheduler
    true_epochs: np.ndarray  # what the job really needs (hidden)
    speed_factor: np.ndarray  # persistent interference factor (hidden), mean 1
    config: dict = field(default_factory=dict)
    batch_size: np.ndarray | None = None  # total batch of all-reduce jobs (0 for PS jobs); None: all 0
    requested: np.ndarray | None = None  # workers each job asked for; None: 1 each
    #: a site's own job class per job ("" for none): an all-reduce job of a class the catalog does not hold
    #: (type_idx = catalog.UNSEEN), whose speed only a site's speed model gives; None: no such job
    site_class: np.ndarray | None = None
    submitted: np.ndarray | None = None  # float, in slots, within (arrival_slot - 1, arrival_slot]; None: arrival_slot
    #: True where an all-reduce job of a catalog model lets the scheduler choose its total batch (within its model's
    #: limits, dl2d.workload.batching; its work stays what it was submitted with); None: no job does
    adaptive: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival_slot)

    @property
    def allreduce(self) -> np.ndarray:
        return IS_ALLREDUCE[self.type_idx]

    def speed_names(self) -> list[str]:
        """Each job's model, or its site class: the name its speed is looked up by (computed once: the engine
        asks every slot)."""
        cache = self.__dict__.setdefault("_cache", {})
        if "speed_names" not in cache:
            cache["speed_names"] = [c or MODEL_NAMES[t] for t, c in zip(self.type_idx, self.site_class)]
        return cache["speed_names"]

    def check_site(self, site) -> None:
        """TraceError unless a site's speed model (dl2d.workload.speedfit.SiteSpeeds, or None) holds the
        class of every job that has one: nothing else knows how fast such a job trains."""
        names = set(site.names()) if site is not None else set()
        for j, c in enumerate(self.site_class):
            if c and c not in names:
                raise TraceError(f"job {j + 1}: class {c!r} has no curve in the speed model"
                                 + ("" if site is not None else " (no --speed-model given)"))

    def __post_init__(self):
        n = len(self.arrival_slot)
        if self.batch_size is None:
            object.__setattr__(self, "batch_size", np.zeros(n))
        if self.requested is None:
            object.__setattr__(self, "requested", np.ones(n, int))
        if self.site_class is None:
            object.__setattr__(self, "site_class", np.full(n, "", dtype=object))
        if self.submitted is None:
            object.__setattr__(self, "submitted", np.asarray(self.arrival_slot, float))
        if self.adaptive is None:
            object.__setattr__(self, "adaptive", np.zeros(n, bool))
        for name in ("type_idx", "est_epochs", "true_epochs", "speed_factor", "batch_size", "requested",
                     "site_class", "submitted", "adaptive"):
            if len(getattr(self, name)) != n:
                raise TraceError(f"trace column {name} has {len(getattr(self, name))} rows, expected {n}")
        if n and (np.any(self.type_idx < 0) or np.any(self.type_idx > UNSEEN)):
            raise TraceError("trace column type_idx has a model index outside the catalog")
        labelled = np.array([bool(c) for c in self.site_class], bool)
        wrong = np.flatnonzero(labelled != (np.asarray(self.type_idx) == UNSEEN))
        if len(wrong):
            raise TraceError(f"job {int(wrong[0]) + 1}: a job has a site class exactly when it is of no catalog model")
        bad = np.flatnonzero(self.allreduce & ~labelled & ~(np.asarray(self.batch_size) > 0))
        if len(bad):
            raise TraceError(f"job {int(bad[0]) + 1}: an all-reduce job ({MODEL_NAMES[self.type_idx[bad[0]]]}) "
                             "needs a batch_size > 0")
        odd = np.flatnonzero(np.asarray(self.adaptive, bool) & ~(self.allreduce & ~labelled))
        if len(odd):
            raise TraceError(f"job {int(odd[0]) + 1}: only an all-reduce job of a catalog model may adapt its batch "
                             "(adaptive_batch)")
        if n and np.any(np.asarray(self.requested) < 1):
            raise TraceError("every job asks for at least one worker (requested_workers >= 1)")
        if n and np.any(np.diff(self.arrival_slot) < 0):
            raise TraceError("jobs must be sorted by arrival_slot")
        early = np.flatnonzero((np.asarray(self.submitted) > self.arrival_slot)
                               | (np.asarray(self.submitted) <= np.asarray(self.arrival_slot) - 1))
        if len(early):
            raise TraceError(f"job {int(early[0]) + 1}: submitted at slot {float(self.submitted[early[0]]):g} but "
                             f"arriving at {int(self.arrival_slot[early[0]])}: a job arrives at the first slot "
                             "boundary at or after its submission (arrival_slot = ceil(submitted_slot))")


def daily_rate(slot: np.ndarray) -> np.ndarray:
    """Relative arrival rate over a day (DL2 Fig. 8a shape): quiet at night, busy in working hours."""
    hour = (np.asarray(slot) % SLOTS_PER_DAY) * 24.0 / SLOTS_PER_DAY
    day = 0.5 - 0.5 * np.cos(2 * np.pi * (hour - 3.0) / 24.0)  # 0 at 3 am, 1 at 3 pm
    return 0.25 + 0.75 * day**1.5


def arrivals_per_slot(cfg: TraceConfig, rng: np.random.Generator, horizon: int) -> np.ndarray:
    m = cfg.max_arrivals_per_slot
    if cfg.arrival_pattern == "uniform":
        counts = np.full(horizon, m)
    elif cfg.arrival_pattern == "poisson":
        counts = rng.poisson(m, horizon)
    else:
        offset = rng.integers(SLOTS_PER_DAY)
        counts = rng.poisson(m * daily_rate(np.arange(horizon) + offset))
    return np.minimum(counts, m)


def generate(cfg: TraceConfig = TraceConfig(), seed: int = 0) -> Trace:
    """A reproducible trace: the same (config, seed) always gives the same jobs."""
    rng = np.random.default_rng(seed)
    counts = arrivals_per_slot(cfg, rng, horizon=cfg.num_jobs * SLOTS_PER_DAY)
    slots = np.repeat(np.arange(len(counts)), counts)[: cfg.num_jobs]
    if len(slots) < cfg.num_jobs:  # only with absurdly sparse patterns
        raise TraceError("arrival pattern produced too few jobs")
    allowed = np.array([type_index(t) for t in cfg.job_types])
    types = rng.choice(allowed, size=cfg.num_jobs)
    if cfg.epochs_model == "dl2":
        frac = np.array([JOB_TYPES[t].epochs_fraction for t in types])
        est = frac * MAX_EPOCHS * rng.uniform(0.9, 1.1, cfg.num_jobs)
    else:
        est = np.clip(rng.weibull(2.0, cfg.num_jobs) * MAX_EPOCHS / 3, 1.0, MAX_EPOCHS)
    est = np.round(np.maximum(est, 1.0), 2)
    true = est * (1 + cfg.epoch_estimate_error * rng.uniform(-1, 1, cfg.num_jobs))
    s = cfg.interference_sigma
    factor = np.exp(rng.normal(-s * s / 2, s, cfg.num_jobs)) if s > 0 else np.ones(cfg.num_jobs)
    return Trace(slots.astype(int), types.astype(int), est, np.maximum(true, 0.01), factor,
                 config={**asdict(cfg), "seed": seed, "job_types": list(cfg.job_types)})


def from_workload(jobs, slot_seconds: float, seed: int = 0, interference_sigma: float = 0.27,
                  epoch_estimate_error: float = 0.0, config: dict | None = None, site_mix=(),
                  adaptive: bool = False) -> Trace:
    """A trace of all-reduce jobs from a workload (dl2d.workload.workloads / .philly: arrival second, model, GPUs
    asked for, total batch). Each job needs its model's epochs to converge (dl2d.workload.catalog), told to the
    scheduler with ``epoch_estimate_error`` as in :class:`TraceConfig`, asks for one worker per GPU and gets a
    hidden interference factor as DL2's jobs do; it arrives at the first slot boundary at or after its second
    (a scheduler deciding at slot boundaries sees it no sooner) and its JCT counts from that second. ``site_mix``: a
    site's own job mix replaces the workload's models (:func:`_site_classes`). ``adaptive``: every job of a catalog
    model lets the scheduler choose its total batch."""
    from dl2d.workload.catalog import epochs_to_converge  # noqa: PLC0415 (scipy fit on first use only)

    if not slot_seconds > 0:
        raise TraceError("slot_seconds must be > 0")
    if not 0 <= epoch_estimate_error < 1 or interference_sigma < 0:
        raise TraceError("epoch_estimate_error must be in [0, 1) and interference_sigma >= 0")
    jobs = sorted(jobs, key=lambda j: j.arrival_s)
    if not jobs:
        raise TraceError("a workload with no jobs")
    n = len(jobs)
    rng = np.random.default_rng(seed)
    types = np.array([model_index(j.model) for j in jobs])
    classes = np.full(n, "", dtype=object)
    batch = np.array([float(j.batch_size) for j in jobs])
    est = np.array([float(epochs_to_converge(j.model)) for j in jobs])
    if site_mix:
        types, classes, batch, est = _site_classes(jobs, site_mix, seed)
    true = est * (1 + epoch_estimate_error * rng.uniform(-1, 1, n))
    s = interference_sigma
    factor = np.exp(rng.normal(-s * s / 2, s, n)) if s > 0 else np.ones(n)
    submitted = np.array([j.arrival_s / slot_seconds for j in jobs], float)
    return Trace(np.ceil(submitted).astype(int), types, est, np.maximum(true, 0.01),
                 factor, config={**(config or {}), "seed": seed, "slot_seconds": slot_seconds,
                                 "interference_sigma": interference_sigma,
                                 "epoch_estimate_error": epoch_estimate_error},
                 batch_size=batch, requested=np.array([int(j.gpus) for j in jobs]), site_class=classes,
                 submitted=submitted, adaptive=np.array([adaptive and not c for c in classes], bool))


def _site_classes(jobs, mix, seed: int):
    """A site's own job mix on a workload's jobs (their arrivals and GPUs kept): each job's class drawn from
    ``mix`` ((class, jobs seen, median epochs), dl2d.workload.speedfit.SiteSpeeds.mix) in proportion to the jobs
    seen, with that class's median epochs as its work. A class that is a catalog model becomes that model (its
    total batch the Philly workloads' per-GPU batch times its GPUs); any other is a site class (UNSEEN).
    Drawn from their own random stream, so the rest of the trace is the same with or without a mix."""
    from dl2d.workload.catalog import ALLREDUCE_MODELS
    from dl2d.workload.philly import BATCH_PER_GPU

    rng = np.random.default_rng([seed, 1])
    weights = np.array([m[1] for m in mix], float)
    drawn = rng.choice(len(mix), size=len(jobs), p=weights / weights.sum())
    types, classes, batch, est = [], [], [], []
    for j, k in zip(jobs, drawn):
        name, _, epochs = mix[k]
        known = name in ALLREDUCE_MODELS
        types.append(model_index(name) if known else UNSEEN)
        classes.append("" if known else name)
        batch.append(float(BATCH_PER_GPU[name] * j.gpus) if known else 0.0)
        est.append(float(min(max(epochs, MIN_EPOCHS), MAX_TRACE_EPOCHS)))
    return np.array(types), np.array(classes, dtype=object), np.array(batch), np.array(est)


# ---------------------------------------------------------------- files

def to_records(trace: Trace) -> list[dict]:
    """One record per job; the optional fields only where the trace has all-reduce jobs or sized requests, the
    submission only where a job was submitted within a slot."""
    extra = bool(np.any(trace.allreduce) or np.any(trace.requested != 1))
    within = bool(np.any(trace.submitted != trace.arrival_slot))
    adapts = bool(np.any(trace.adaptive))
    return [
        {"id": i, "arrival_slot": int(trace.arrival_slot[i]),
         "type": SITE_PREFIX + trace.site_class[i] if trace.site_class[i] else MODEL_NAMES[trace.type_idx[i]],
         "est_epochs": float(trace.est_epochs[i]), "true_epochs": float(trace.true_epochs[i]),
         "speed_factor": float(trace.speed_factor[i]),
         **({"batch_size": float(trace.batch_size[i]), "requested_workers": int(trace.requested[i])}
            if extra else {}),
         **({"submitted_slot": float(trace.submitted[i])} if within else {}),
         **({"adaptive_batch": int(bool(trace.adaptive[i]))} if adapts else {})}
        for i in range(len(trace))
    ]


def _show(v) -> str:
    """A field's value for an error message, cut short: a field may hold a megabyte of text, a thousand-digit
    integer or a deeply nested list."""
    if isinstance(v, (list, dict)):
        return f"a JSON {'list' if isinstance(v, list) else 'object'}"
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"an integer of {int(v.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(v, str) and len(v) > 40:
        return repr(v[:37]) + "..."
    return repr(v)


def _num(x: float) -> str:
    """A bound as written: 1048576, 0.01 (not 1.04858e+06)."""
    return str(int(x)) if x == int(x) else f"{x:g}"


def _number(rec: dict, key: str, where: str, *, lo_open: bool = False) -> float:
    """Field ``key`` of a job record as a finite number within FIELD_BOUNDS[key]; TraceError naming the field
    otherwise. JSON numbers and numeric strings (CSV) are accepted; booleans, containers and huge integers not."""
    lo, hi, open_, integer = FIELD_BOUNDS[key]
    lo_open = lo_open or open_
    if key not in rec or rec[key] in (None, ""):
        raise TraceError(f"{where}: missing field {key!r}")
    raw = rec[key]
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):  # JSON true/false would pass as 1/0
        raise TraceError(f"{where}: field {key!r} is not a number: {_show(raw)}")
    bounds = f"{'>' if lo_open else '>='} {_num(lo)} and <= {_num(hi)}"
    if isinstance(raw, int) and abs(raw) > 2 ** 63:  # float() would overflow, or round it
        raise TraceError(f"{where}: field {key!r} must be {bounds}, got {_show(raw)}")
    try:
        v = float(raw)
    except ValueError:
        raise TraceError(f"{where}: field {key!r} is not a number: {_show(raw)}") from None
    if not math.isfinite(v):
        raise TraceError(f"{where}: field {key!r} must be finite, got {_show(raw)}")
    if integer and v != int(v):
        raise TraceError(f"{where}: field {key!r} must be an integer, got {_show(raw)}")
    if (v <= lo if lo_open else v < lo) or v > hi:
        raise TraceError(f"{where}: field {key!r} must be {bounds}, got {_show(raw)}")
    return v


def _model(rec: dict, where: str) -> tuple[int, str]:
    """(model index, site class or ""): ``type`` is a catalog model, or ``site:CLASS``, a site's own class."""
    name = rec.get("type")
    if name in (None, ""):
        raise TraceError(f"{where}: missing field 'type'")
    if not isinstance(name, str):
        raise TraceError(f"{where}: field 'type' must be a model name, got {_show(name)}")
    if len(name) > MAX_TYPE_CHARS:
        raise TraceError(f"{where}: unknown model {_show(name)}")
    if name.startswith(SITE_PREFIX):
        from dl2d.workload.speedfit import CLASS_NAME

        cls = name[len(SITE_PREFIX):]
        if not CLASS_NAME.match(cls):
            raise TraceError(f"{where}: site class {_show(cls)}: 1-128 of letters, digits, . _ / @ + -")
        return UNSEEN, cls
    try:
        return model_index(name), ""
    except ValueError as e:
        raise TraceError(f"{where}: {e} (or site:CLASS, a class of the speed model)") from None


def _row(rec, where: str) -> tuple:
    """One job record checked field by field: (arrival, model index, est, true, factor, batch, requested, site
    class)."""
    if not isinstance(rec, dict):
        raise TraceError(f"{where}: expected an object with fields {', '.join(CSV_FIELDS)}")
    t, cls = _model(rec, where)
    if IS_ALLREDUCE[t] and not cls:
        batch = _number(rec, "batch_size", where, lo_open=True)
    else:
        batch = 0.0 if rec.get("batch_size") in (None, "") else _number(rec, "batch_size", where)
    requested = 1 if rec.get("requested_workers") in (None, "") else int(_number(rec, "requested_workers", where))
    arrival = int(_number(rec, "arrival_slot", where))
    submitted = float(arrival)
    if rec.get("submitted_slot") not in (None, ""):
        submitted = _number(rec, "submitted_slot", where)
        if not arrival - 1 < submitted <= arrival:
            raise TraceError(f"{where}: field 'submitted_slot' ({submitted:g}) must lie within the slot before "
                             f"arrival_slot ({arrival}): a job arrives at the first slot boundary at or after its "
                             "submission")
    adaptive = False if rec.get("adaptive_batch") in (None, "") else bool(_number(rec, "adaptive_batch", where))
    if adaptive and (not IS_ALLREDUCE[t] or cls):
        raise TraceError(f"{where}: field 'adaptive_batch': only an all-reduce job of a catalog model may adapt its "
                         "batch")
    return (arrival, t, _number(rec, "est_epochs", where), _number(rec, "true_epochs", where),
            _number(rec, "speed_factor", where), batch, requested, cls, submitted, adaptive)


def from_records(records: list[dict], config: dict | None = None, source: str = "trace",
                 lines: list[int] | None = None) -> Trace:
    """A trace from job records (dicts of CSV_FIELDS + OPTIONAL_FIELDS); every field is checked against its
    bounds and an error names the job (and its file line, where ``lines`` gives them) and the field."""
    if not records:
        raise TraceError(f"{source}: no jobs")
    if len(records) > MAX_TRACE_JOBS:
        raise TraceError(f"{source}: {len(records)} jobs; a trace has at most {MAX_TRACE_JOBS}")
    rows = []
    for n, rec in enumerate(records):
        where = f"{source}: line {lines[n]}, job {n + 1}" if lines else f"{source}: job {n + 1}"
        rows.append(_row(rec, where))
    rows.sort(key=lambda r: (r[0], r[8]))  # by arrival, then submission; stable: ties keep file order
    cols = list(zip(*rows))
    return Trace(np.array(cols[0], int), np.array(cols[1], int), np.array(cols[2]), np.array(cols[3]),
                 np.array(cols[4]), config=dict(config or {}), batch_size=np.array(cols[5], float),
                 requested=np.array(cols[6], int), site_class=np.array(cols[7], dtype=object),
                 submitted=np.array(cols[8], float), adaptive=np.array(cols[9], bool))


def save(trace: Trace, path: str | Path) -> None:
    """Write a trace as .json (with its generating config) or .csv (jobs only), by file extension."""
    path = Path(path)
    records = to_records(trace)
    if path.suffix == ".csv":
        buf = io.StringIO()
        fields = CSV_FIELDS + tuple(f for f in OPTIONAL_FIELDS if records and f in records[0])
        w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows(records)
        text = buf.getvalue()
    elif path.suffix == ".json":
        text = json.dumps({"format": FORMAT, "version": VERSION, "config": trace.config, "jobs": records}, indent=1)
    else:
        raise TraceError(f"{path}: trace files must end in .json or .csv")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _read_text(path: Path) -> str:
    """The file's text, read no further than MAX_TRACE_BYTES (dl2d.core.files.read_bounded: a regular file
    only, so a FIFO cannot hang the read nor a device feed it forever)."""
    try:
        raw = read_bounded(path, MAX_TRACE_BYTES)
    except InputFileError as e:
        if e.too_large:
            raise TraceError(f"{path}: larger than {MAX_TRACE_BYTES} bytes ({MAX_TRACE_BYTES // 2 ** 20} MiB), the "
                             "most a trace file may have") from None
        raise TraceError(f"{path}: cannot read trace ({e.reason})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise TraceError(f"{path}: not a text file (line {line}: byte {e.start} is not UTF-8)") from None


def _csv_records(path: Path, text: str) -> tuple[list[dict], list[int]]:
    """The rows of a CSV trace and their line numbers, stopping at MAX_TRACE_JOBS + 1 rows."""
    reader = csv.DictReader(io.StringIO(text))
    records, lines = [], []
    try:
        missing = [f for f in CSV_FIELDS[1:] if f not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: CSV header lacks column(s) {', '.join(missing)}")
        for rec in reader:
            if len(records) == MAX_TRACE_JOBS:
                raise TraceError(f"{path}: line {reader.line_num}: more than {MAX_TRACE_JOBS} jobs, the most a "
                                 "trace may have")
            records.append(rec)
            lines.append(reader.line_num)
    except csv.Error as e:  # a field over csv.field_size_limit(), a NUL byte, ...
        # (the DictReader's own line_num is that of the last good row; its csv.reader's is the bad line's)
        raise TraceError(f"{path}: line {reader.reader.line_num}: not valid CSV ({e})") from None
    return records, lines


def _json_doc(path: Path, text: str) -> dict:
    """The parsed document of a JSON trace, its shape checked; the number of containers is bounded first."""
    containers = text.count("{") + text.count("[")
    if containers > MAX_JSON_CONTAINERS:
        raise TraceError(f"{path}: {containers} JSON objects and lists; a trace has at most {MAX_TRACE_JOBS} jobs "
                         f"(one object each) and a small config ({MAX_JSON_CONTAINERS} in all)")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise TraceError(f"{path}: not valid JSON (nested too deeply)") from None
    except ValueError as e:  # an integer of thousands of digits (Python's int conversion limit)
        raise TraceError(f"{path}: not valid JSON ({str(e).split(':')[0]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceError(f"{path}: not a {FORMAT} file (missing \"format\": \"{FORMAT}\")")
    if doc.get("version") != VERSION:
        raise TraceError(f"{path}: trace format version {_show(doc.get('version'))} is not supported "
                         f"(want {VERSION})")
    if not isinstance(doc.get("jobs"), list):
        raise TraceError(f"{path}: \"jobs\" must be a list")
    if len(doc["jobs"]) > MAX_TRACE_JOBS:
        raise TraceError(f"{path}: {len(doc['jobs'])} jobs; a trace has at most {MAX_TRACE_JOBS}")
    if not isinstance(doc.get("config"), (dict, type(None))):
        raise TraceError(f"{path}: \"config\" must be an object (the generating settings) or absent")
    return doc


def load(path: str | Path) -> Trace:
    """A trace file (.json or .csv), bounded and checked as it is read (module doc); TraceError otherwise."""
    path = Path(path)
    if path.suffix not in (".csv", ".json"):
        raise TraceError(f"{path}: trace files must end in .json or .csv")
    text = _read_text(path)
    if path.suffix == ".csv":
        records, lines = _csv_records(path, text)
        return from_records(records, source=str(path), lines=lines)
    doc = _json_doc(path, text)
    return from_records(doc["jobs"], doc.get("config"), source=str(path))
