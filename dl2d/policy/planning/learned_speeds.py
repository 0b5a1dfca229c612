"""A speed table learned from what jobs trained: each job type's epochs per second at each (PS, workers), fitted
from the slots of simulated runs, for a planner to plan on (dl2d.policy.planning.lp_plan, dl2d.policy.planning.lp_lookahead).

Why: the planner and its lookahead come within 2.8-3.7 % of `testbed`'s LP bound on the simulator's measured
table, which no scheduler reads; the fitted Optimus a real scheduler runs believes a parametric fit per job
and plans 8-12 % above it. What a scheduler can do instead is learn the table from experience: every slot a
job runs at a (PS, workers) pair, and the epochs it trains in it are a draw of that pair's speed times the
job's own hidden interference and the slot's noise. Over many runs the table is learned to within the noise,
from observations alone (model-based learning: the model is learned, the decisions are planned on it).

The fit (:func:`fit_table`) is least squares in logs, ``log rate = log table[type, ps, workers] + log
factor[job] + noise``, alternating between the cells and the jobs (each job's factor is shared by all its
slots, so it is fitted out rather than averaged in), the factors of each type's jobs then scaled to a mean of
1, as the traces draw them (a job runs one type: a type's cells and its jobs' factors are known only up to a
common scale). A cell no slot ran at stays 0 (no speed known: the planner never plans it), and ``counts`` says how
many slots each cell's figure rests on.

The observations come from runs on training traces under :class:`Explorer` (each job a random pair in every
slot: every pair gets tried), recorded by :class:`Recorder` from what a scheduler sees of a job: its progress
each slot and when it finished. A run with a resize overhead (``SimConfig.resize_overhead_s`` > 0) would put
restarts into the speeds: :func:`learn` refuses one.

The shipped table (1 600 `testbed` training runs) is 0.5 % from the simulator's on average, and the registered
``lp-lookahead`` on it is 2.78 % above `testbed`'s LP bound on the held-out traces, as the same search on the
simulator's own table (docs/BENCHMARKS.md).
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.core.files import InputFileError, NpzArchive, NpzError, read_bounded
from dl2d.policy.baselines.heuristics import AllocationBuilder
from dl2d.policy.registry import IgnoresFeedback
from dl2d.workload.jobtypes import BATCHES_PER_EPOCH

#: the artefact's format; a file of another is refused
FORMAT = 1
#: the DL2 world's table learned on `testbed` (bench/bench_learned_speeds.py makes it; docs/BENCHMARKS.md)
SHIPPED = Path(__file__).parent / "pretrained" / "speeds-dl2.npz"
#: A table file's bounds, checked before any of it is decompressed: a table of at most MAX_CELLS float64 cells
#: (the shipped one has 8 x 17 x 17 = 2 312; 65 PS and workers for 64 types are 270 400), its meta JSON text.
MAX_CELLS = 1_000_000
MAX_META_BYTES = 1024 * 1024
MAX_FILE_BYTES = 2 * (8 * MAX_CELLS + 4096) + MAX_META_BYTES


class Observations(NamedTuple):
    """One row per (job, slot) a PS job ran at a pair: the job's key (unique over runs), its type, the pair, and
    the speed it trained at in the table's unit (batches per second: epochs x batches per epoch / seconds)."""

    job: np.ndarray
    type_idx: np.ndarray
    ps: np.ndarray
    workers: np.ndarray
    rate: np.ndarray

    @staticmethod
    def concat(parts: list["Observations"]) -> "Observations":
        if not parts:
            return Observations(*(np.zeros(0, int) for _ in range(4)), np.zeros(0))
        return Observations(*(np.concatenate([getattr(p, f) for p in parts]) for f in Observations._fields))


class Recorder:
    """``on_slot`` of a simulator run (dl2d.sim.engine.run): after each slot, records the speed each PS job of
    ``trace`` trained at in it, at the pair it ran: its progress over the slot, or over the part of the slot
    until it finished (what a scheduler sees of a job: its progress, and when it ended). Finishing slots count
    too: without them a job that ends in its first slot would never be seen, and the jobs seen would be the
    slower ones (the fit's premise, factors of mean 1, would not hold for them). ``job_base``: added to the job
    indices, to keep runs apart."""

    def __init__(self, trace, slot_seconds: float, job_base: int = 0):
        self.trace, self.slot_seconds, self.job_base = trace, slot_seconds, job_base
        self.done = np.zeros(len(trace))
        self.finished = np.zeros(len(trace), bool)
        self.parts: list[Observations] = []

    def __call__(self, state) -> None:
        slot = state.slot - 1  # the slot just run
        tr = self.trace
        ran = (~self.finished & (tr.arrival_slot <= slot) & (state.workers > 0) & ~np.asarray(tr.allreduce, bool))
        jobs = np.flatnonzero(ran)
        ends = ~np.isnan(state.finish_time[jobs])
        seconds = np.where(ends, (state.finish_time[jobs] - slot), 1.0) * self.slot_seconds
        trained = state.epochs_done[jobs] - self.done[jobs]
        ok = (trained > 0) & (seconds > 0)
        jobs, trained, seconds = jobs[ok], trained[ok], seconds[ok]
        types = tr.type_idx[jobs]
        self.parts.append(Observations(self.job_base + jobs, types, state.ps[jobs], state.workers[jobs],
                                       trained * BATCHES_PER_EPOCH[types] / seconds))
        self.done = state.epochs_done.copy()
        self.finished = ~np.isnan(state.finish_time)

    def observations(self) -> Observations:
        return Observations.concat(self.parts)


class Explorer(IgnoresFeedback):
    """Every slot, the jobs in a random order, each given a random (PS, workers) pair, uniform over 1..max of
    each, as far as the cluster holds it: a behaviour policy that tries every pair, for :func:`learn`."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.name = "explorer"

    def __call__(self, view: SlotView) -> Allocation:
        b = AllocationBuilder(view)
        for j in self.rng.permutation(len(view)):
            j = int(j)
            workers = int(self.rng.integers(1, view.max_workers + 1))
            ps = 0 if view.allreduce[j] else int(self.rng.integers(1, view.max_ps + 1))  # drawn as before
            b.add_sizes(j, workers, ps)
        return b.allocation()


def fit_table(obs: Observations, num_types: int, size: int, iters: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """(table [num_types, size, size] batches/s at (PS, workers), counts [same]) fitted from ``obs`` (module
    docstring); pairs at or beyond ``size`` are left out. A cell without observations: 0, count 0."""
    keep = (obs.ps < size) & (obs.workers < size) & (obs.rate > 0)
    if not keep.any():
        raise ValueError("no observation to fit a speed table from (every rate 0, or every pair beyond the table)")
    cell = (obs.type_idx[keep] * size + obs.ps[keep]) * size + obs.workers[keep]
    _, job = np.unique(obs.job[keep], return_inverse=True)
    y = np.log(obs.rate[keep])
    n_cells, n_jobs = num_types * size * size, int(job.max()) + 1
    count = np.bincount(cell, minlength=n_cells)
    per_job = np.bincount(job, minlength=n_jobs)
    log_f = np.zeros(n_jobs)
    log_t = np.zeros(n_cells)
    for _ in range(iters):
        log_t = np.bincount(cell, weights=y - log_f[job], minlength=n_cells) / np.maximum(count, 1)
        log_f = np.bincount(job, weights=y - log_t[cell], minlength=n_jobs) / np.maximum(per_job, 1)
    # a job runs one type, so a type's cells and its jobs' factors are known only up to a common scale: set it so
    # that the factors of each type's jobs average 1, as the traces draw them whatever the type
    job_type = np.zeros(n_jobs, int)
    job_type[job] = obs.type_idx[keep]
    per_type = np.bincount(job_type, minlength=num_types)
    scale = np.bincount(job_type, weights=np.exp(log_f), minlength=num_types) / np.maximum(per_type, 1)
    table = np.where(count > 0, np.exp(log_t), 0.0).reshape(num_types, size, size)
    return table * np.where(per_type > 0, scale, 1.0)[:, None, None], count.reshape(num_types, size, size)


def observe(cfg, traces, on_trace: Callable[[int, int, float], None] | None = None) -> Observations:
    """The observations of one :class:`Explorer` run per (seed, trace) of ``traces`` on the simulator ``cfg`` (a
    dl2d.sim.engine.SimConfig), in the order of ``traces``. ``on_trace(seed, rows, seconds)`` after each."""
    from dl2d.sim import engine as E

    if cfg.resize_overhead_s > 0:
        raise ValueError(f"resize_overhead_s is {cfg.resize_overhead_s}: restarts would count as slow speeds; "
                         "learn the table on a simulator without a resize overhead")
    parts = []
    for seed, trace in traces:
        t0 = time.perf_counter()
        rec = Recorder(trace, cfg.slot_seconds, job_base=seed * 1_000_000)
        E.run(trace, Explorer(seed), cfg, seed=seed, on_slot=rec)
        parts.append(rec.observations())
        if on_trace is not None:
            on_trace(seed, len(parts[-1].rate), time.perf_counter() - t0)
    return Observations.concat(parts)


def fit_for(cfg, obs: Observations, iters: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fit_table` of ``obs`` for every job type, as large as the simulator ``cfg``'s sizes."""
    from dl2d.workload.jobtypes import JOB_TYPES

    return fit_table(obs, len(JOB_TYPES), max(cfg.max_ps, cfg.max_workers) + 1, iters)


def learn(cfg, traces, on_trace: Callable[[int, int, float], None] | None = None,
          iters: int = 30) -> tuple[np.ndarray, np.ndarray, Observations]:
    """(table, counts, observations): the table learned from :func:`observe`'s runs (same arguments)."""
    obs = observe(cfg, traces, on_trace)
    return (*fit_for(cfg, obs, iters), obs)


def save(path, table: np.ndarray, counts: np.ndarray, meta: dict) -> None:
    """The table, its counts and ``meta`` (how it was made) in one .npz, with the format and the table's digest."""
    meta = {**meta, "format": FORMAT, "sha256": digest(table)}
    np.savez_compressed(path, table=table.astype(np.float32), counts=counts.astype(np.int32),
                        meta=np.array(json.dumps(meta, sort_keys=True)))


def load(path=SHIPPED) -> tuple[np.ndarray, np.ndarray, dict]:
    """(table, counts, meta) of a file :func:`save` wrote; a file of another format, or whose table does not
    match its digest, is refused (ValueError naming the file). The file is untrusted input: read bounded
    (dl2d.core.files.read_bounded), each member's declared size and .npy header checked before it is
    decompressed (the table at most MAX_CELLS cells of [types, n, n], the counts of the table's shape), the
    table finite."""
    try:
        z = NpzArchive(read_bounded(path, MAX_FILE_BYTES))
        meta = json.loads(z.text("meta", MAX_META_BYTES))
        table = z.array("table", 8 * MAX_CELLS + 4096)
        counts = z.array("counts", 8 * table.size + 4096, table.shape, "iu")
    except (InputFileError, NpzError) as e:
        raise ValueError(f"{path}: not a learned speed table ({e})") from None
    except (ValueError, RecursionError) as e:  # the meta's JSON
        raise ValueError(f"{path}: not a learned speed table (meta: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format {meta.get('format') if isinstance(meta, dict) else None!r}, this dl2d "
                         f"reads {FORMAT}")
    if meta.get("sha256") != digest(table):
        raise ValueError(f"{path}: the table does not match its recorded digest (damaged or edited)")
    if table.ndim != 3 or table.shape[1] != table.shape[2]:
        raise ValueError(f"{path}: table of shape {table.shape} and counts {counts.shape}: want [types, n, n] both")
    return table.astype(float), counts, meta


def digest(table: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(table, np.float32).tobytes()).hexdigest()
