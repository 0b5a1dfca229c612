"""The simulator as a pure JAX environment: `reset` and `step` are pure functions of a pytree state.

Why: training a learned scheduler needs many simulated cluster-slots per second, and the NumPy engine
(`dl2d.sim.engine`) runs one cluster one slot at a time in Python. Here a cluster is an `EnvState` of fixed-size
arrays, so `jax.jit` compiles a slot once, `jax.vmap` runs many clusters (each with its own trace, noise key and
progress) in one call and `jax.lax.scan` runs many slots without returning to Python. The style is gymnax's:
static `EnvParams` (what every cluster of a batch shares) and a dynamic `EnvState` (what one cluster is).

What a slot does is the engine's `step`, array for array (docs/simulator.md, "The JAX environment"):

- the jobs are the trace's rows, padded to `max_jobs` (J) with invalid rows that never arrive; a job is
  active while it has arrived (at the slot boundary at or after its submission) and not finished; its JCT
  counts from its submission;
- the caller gives each job's workers and PS for the slot (counts, as an engine `Allocation` after
  placement: the environment trusts them to fit, it does not place tasks and reports aggregate overflow in
  ``info``); an all-reduce job gets no PS, an inactive job nothing, counts are clipped to the limits;
- a PS job trains at the speed table's (PS, workers) entry (DL2's measured or parametric table), times its
  hidden interference factor and the slot noise 1 + noise * U(-1, 1);
- an all-reduce job's speed depends on its placement (GPUs per server): the measured rate where the
  placement was measured, Pollux's fitted model elsewhere, a site's calibrated curve where one is given
  (slowed by its class's spread slowdown when the job spans more servers than it needs);
  a multi-server job sharing a server with another one is slowed by ``shared_node_slowdown``;
- a job that lets the scheduler choose its batch (the trace's ``adaptive``) trains at the total batch `step`
  gives it (0: it keeps its own), within its model's measured batches: its step time and its iterations per
  epoch follow that batch as the engine's lookup has them (``EnvParams.table_*``, ``runs_*``: the measured
  step times by placement and local batch, the measured runs' iterations, in arrays), dl2d's speed rules;
- a job whose allocation changes (an all-reduce job also when its servers or its batch change) loses
  ``resize_overhead_s`` of training, carried over to the next slots when longer than a slot;
- a job stops at its true epochs, finishing at the fraction of the slot it needed; the reward is DL2's
  eq. 1, the epochs trained this slot over each job's estimate, summed;
- every job that trained through a whole slot has its measured speed recorded as the daemon and the engine
  measure it (``EnvState.speed_factors``; `observe` gives their mean as ``job_speed_factor``).

Placement: with ``EnvParams.placement`` (the default when the trace has all-reduce jobs) `step` takes the
workers per server of every job, ``[J, servers]``, as the engine's placed allocation gives them, and matches
the engine exactly. Without it an all-reduce job is taken as packed on the fewest servers, never sharing a
server with another multi-server job, and moving only when its size changes: an approximation (cheaper, no
``[J, servers]`` arrays) for training where placement is not what is learned. PS jobs never need a
placement (the engine's cross-node traffic and heterogeneous servers, which would, are refused).

Noise: `step` draws its U(-1, 1) from the state's key, one per job slot; ``noise=`` passes the draws in
instead (the match test passes the engine's own draws, so noisy runs agree too).

Only jax, flax.struct and the simulator's own tables: no policy (the layering in pyproject.toml).
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from dl2d.core.contract import SPEED_FACTOR_SLOTS
from dl2d.sim.engine import SimConfig
from dl2d.sim.trace import Trace
from dl2d.workload import catalog, throughput
from dl2d.workload.catalog import IS_ALLREDUCE, MODEL_NAMES, NUM_DL2_TYPES, PS_DEMAND, WORKER_DEMAND
from dl2d.workload.jobtypes import BATCHES_PER_EPOCH
from dl2d.workload.speed import speed_table

NUM_AR_MODELS = len(catalog.ALLREDUCE_MODELS)


# ------------------------------------------------------------------------------------------ params and state

@struct.dataclass
class EnvParams:
    """What every cluster of a batch shares. Shapes and switches are static (part of the compiled program);
    the numbers are leaves, so a batch may also carry different ones (vmap over params)."""

    server_capacity: jnp.ndarray  # [3] GPUs, CPU cores, memory GB of one server
    slot_seconds: jnp.ndarray  # []
    slot_noise: jnp.ndarray  # [] speed factor 1 + noise * U(-1, 1) per job and slot
    resize_overhead_s: jnp.ndarray  # []
    shared_node_slowdown: jnp.ndarray  # []
    speed_table: jnp.ndarray  # [8, P + 1, W + 1] PS jobs: steps per second over all workers (workload.speed)
    batches_per_epoch: jnp.ndarray  # [8]
    measured_placements: jnp.ndarray  # [M, L] int: every measured all-reduce placement, GPUs per node descending
    pollux_fit: jnp.ndarray  # [6, 7] Pollux's fitted throughput model of each all-reduce model
    # what a job's speed at any batch reads (jobs that adapt their batch): per all-reduce model and measured
    # placement its measured local batches, ascending (padded with inf), their mean step times and how many;
    # per model its measured runs' log total batch (padded upwards) and samples to finish, their epochs, and
    # the smallest and largest total batch a job of it may take (dl2d.workload.batching.limits)
    table_local: jnp.ndarray  # [6, M, K]
    table_step: jnp.ndarray  # [6, M, K]
    table_count: jnp.ndarray  # [6, M] int
    runs_log_batch: jnp.ndarray  # [6, R]
    runs_samples: jnp.ndarray  # [6, R]
    runs_epochs: jnp.ndarray  # [6]
    batch_limits: jnp.ndarray  # [6, 2]
    num_servers: int = struct.field(pytree_node=False, default=1)
    max_jobs: int = struct.field(pytree_node=False, default=1)
    max_workers: int = struct.field(pytree_node=False, default=16)
    max_ps: int = struct.field(pytree_node=False, default=16)
    gpus_per_node: int = struct.field(pytree_node=False, default=1)  # for packed placements
    has_allreduce: bool = struct.field(pytree_node=False, default=False)  # compile the all-reduce speed
    placement: bool = struct.field(pytree_node=False, default=False)  # step takes workers per server
    adaptive: bool = struct.field(pytree_node=False, default=False)  # step takes each job's batch


@struct.dataclass
class Jobs:
    """The trace as arrays, padded to J rows (``valid`` False on padding): what the jobs are, hidden parts
    included. The per-job all-reduce arrays hold the speeds that depend only on the job (its model and total
    batch), so a slot computes only what depends on the placement."""

    valid: jnp.ndarray  # [J] bool
    arrival_slot: jnp.ndarray  # [J] int: the first slot the job is seen in
    submitted: jnp.ndarray  # [J] float, in slots: when it was submitted, within the slot before arrival_slot
    type_idx: jnp.ndarray  # [J] int, catalog.MODEL_NAMES
    est_epochs: jnp.ndarray  # [J] what the scheduler is told
    true_epochs: jnp.ndarray  # [J] hidden
    speed_factor: jnp.ndarray  # [J] hidden interference factor
    allreduce: jnp.ndarray  # [J] bool: the job's kind
    worker_demand: jnp.ndarray  # [J, 3]
    ps_demand: jnp.ndarray  # [J, 3]
    gpus_per_worker: jnp.ndarray  # [J] int >= 1
    batch_size: jnp.ndarray  # [J] total batch as submitted (all-reduce)
    iters_per_epoch: jnp.ndarray  # [J] all-reduce: iterations per epoch at its batch (1 for PS jobs)
    adaptive: jnp.ndarray  # [J] bool: the scheduler may change its batch
    measured_rate: jnp.ndarray  # [J, M] epochs/s at each measured placement; NaN where not measured
    site_rate: jnp.ndarray  # [J, G + 1] a site's curve by GPUs (width 1 when no site speeds are given)
    use_site: jnp.ndarray  # [J] bool: the site's curve replaces the measured lookup
    site_spread: jnp.ndarray  # [J] the site's slowdown of the job's class spread over more nodes than it needs
    # [J, W + 1] an all-reduce job's epochs/s packed on the fewest servers at each worker count (what a scheduler
    # believes of it, the view's est_speed row 0, and what its speed is measured against); 0 for a PS job: it
    # depends on the job only, so it is computed once per trace, not every slot (`packed_rates`)
    packed_rate: jnp.ndarray


@struct.dataclass
class EnvState:
    """One cluster: its jobs and how far they got. Every leaf is an array, so a batch of states is the same
    pytree with a leading axis."""

    jobs: Jobs
    slot: jnp.ndarray  # [] int
    epochs_done: jnp.ndarray  # [J]
    finished: jnp.ndarray  # [J] bool
    finish_time: jnp.ndarray  # [J] slot (fractional) of completion; NaN while unfinished
    slots_run: jnp.ndarray  # [J] int: slots spent active
    workers: jnp.ndarray  # [J] int: last slot's allocation
    ps: jnp.ndarray  # [J] int
    restart_debt: jnp.ndarray  # [J] seconds of resize overhead still to lose
    servers: jnp.ndarray  # [J, servers] int: last slot's workers per server ([J, 0] without placement)
    batch: jnp.ndarray  # [J] the total batch each job trains at (its submitted one until it is given another)
    key: jnp.ndarray  # PRNG key of the slot noise
    # [J, SPEED_FACTOR_SLOTS] each job's trained / predicted speed in its last full slots, newest last (NaN:
    # none yet): the engine's SimState.speed_factors
    speed_factors: jnp.ndarray


# ------------------------------------------------------------------------------------------ building

@functools.cache
def measured_placements() -> tuple[throughput.Placement, ...]:
    """Every placement any all-reduce model was measured at (canonical, a fixed order)."""
    found: set[throughput.Placement] = set()
    for m in catalog.ALLREDUCE_MODELS:
        found.update(throughput.throughput_model(m).points)
    return tuple(sorted(found, key=lambda p: (len(p), p)))


@functools.lru_cache(maxsize=4096)
def _measured_rates(model: str, batch: float) -> np.ndarray:
    """[M] epochs/s of a job of ``model`` at total batch ``batch`` at each measured placement (the engine's own
    lookup, so these match it exactly); NaN where this model was not measured."""
    points = throughput.throughput_model(model).points
    return np.array([catalog.allreduce_epoch_rate(model, batch, p) if p in points else np.nan
                     for p in measured_placements()])


@functools.cache
def _batch_tables() -> dict[str, np.ndarray]:
    """The measurements a job's speed at any batch reads (EnvParams.table_*, runs_*, batch_limits), per
    all-reduce model in catalog order; the measured placements in :func:`measured_placements`' order."""
    from dl2d.workload import batching, workloads  # noqa: PLC0415

    pls = measured_placements()
    models = catalog.ALLREDUCE_MODELS
    points = [throughput.throughput_model(m).points for m in models]
    K = max(len(v[0]) for pts in points for v in pts.values())
    local = np.full((len(models), len(pls), K), np.inf)
    step = np.ones((len(models), len(pls), K))
    count = np.zeros((len(models), len(pls)), np.int32)
    for a, pts in enumerate(points):
        for m, p in enumerate(pls):
            if p in pts:
                xs, ys, _ = pts[p]
                local[a, m, :len(xs)], step[a, m, :len(xs)], count[a, m] = xs, ys, len(xs)
    runs = [workloads.convergence_runs(m) for m in models]
    R = max(len(r) for r in runs)
    log_b, samples = np.zeros((len(models), R)), np.zeros((len(models), R))
    for a, r in enumerate(runs):
        lb, sm = np.log([b for b, _ in r]), np.array([b * it for b, it in r], float)
        # padded upwards at the last run's samples: np.interp's clamp at the end, as the engine's lookup has it
        log_b[a] = np.concatenate([lb, lb[-1] + np.arange(1, R - len(r) + 1)])
        samples[a] = np.concatenate([sm, np.full(R - len(r), sm[-1])])
    limits = np.array([[batching.limits(m).init, batching.limits(m).max_total] for m in models], float)
    epochs = np.array([catalog.epochs_to_converge(m) for m in models], float)
    return {"table_local": local, "table_step": step, "table_count": count, "runs_log_batch": log_b,
            "runs_samples": samples, "runs_epochs": epochs, "batch_limits": limits}


def _ftype():
    return jnp.result_type(float)  # float32, or float64 under jax_enable_x64


def make_params(cfg: SimConfig, max_jobs: int, *, has_allreduce: bool, placement: bool,
                adaptive: bool = False) -> EnvParams:
    """The static part of an environment from the engine's config. Cross-node traffic and heterogeneous
    servers are not modelled here (they need PS placements and per-server walks): refused. ``adaptive``:
    `step` takes each job's batch (some job may change its own)."""
    if cfg.cross_node_comm or cfg.heterogeneous:
        raise ValueError("the JAX environment does not model cross-node PS traffic or heterogeneous servers")
    if cfg.speed_rules != catalog.DEFAULT_RULES:
        raise ValueError("the JAX environment models dl2d's own speed rules only, not "
                         f"{cfg.speed_rules.as_dict()} (the NumPy engine models every one)")
    if max_jobs < 1:
        raise ValueError("max_jobs must be >= 1")
    f = _ftype()
    pls = measured_placements()
    width = max(len(p) for p in pls)
    table = np.zeros((len(pls), width), np.int32)
    for i, p in enumerate(pls):
        table[i, :len(p)] = p
    fits = np.array([[getattr(throughput.throughput_model(m).fit, k) for k in
                      ("alpha_grad", "beta_grad", "alpha_local", "beta_local", "alpha_node", "beta_node", "gamma")]
                     for m in catalog.ALLREDUCE_MODELS])
    return EnvParams(
        server_capacity=jnp.asarray(cfg.cluster.server_capacity, f), slot_seconds=jnp.asarray(cfg.slot_seconds, f),
        slot_noise=jnp.asarray(cfg.slot_noise, f), resize_overhead_s=jnp.asarray(cfg.resize_overhead_s, f),
        shared_node_slowdown=jnp.asarray(cfg.shared_node_slowdown, f),
        speed_table=jnp.asarray(speed_table(cfg.speed_model), f), batches_per_epoch=jnp.asarray(BATCHES_PER_EPOCH, f),
        measured_placements=jnp.asarray(table), pollux_fit=jnp.asarray(fits, f),
        **{k: jnp.asarray(v, jnp.int32 if v.dtype.kind == "i" else f) for k, v in _batch_tables().items()},
        num_servers=int(cfg.cluster.num_servers), max_jobs=int(max_jobs), max_workers=int(cfg.max_workers),
        max_ps=int(cfg.max_ps), gpus_per_node=max(int(cfg.cluster.gpus), 1), has_allreduce=bool(has_allreduce),
        placement=bool(placement), adaptive=bool(adaptive))


def job_arrays(trace: Trace, cfg: SimConfig, max_jobs: int) -> Jobs:
    """The trace's jobs padded to ``max_jobs`` rows, with each all-reduce job's placement-independent speeds."""
    n = len(trace)
    if n > max_jobs:
        raise ValueError(f"a trace of {n} jobs does not fit max_jobs = {max_jobs}")
    trace.check_site(cfg.site_speeds)
    names = trace.speed_names()
    f = _ftype()
    J = max_jobs
    pad = lambda a, fill, dtype: np.concatenate([np.asarray(a, dtype), np.full(J - n, fill, dtype)])  # noqa: E731
    t = np.asarray(trace.type_idx, int)
    ar = IS_ALLREDUCE[t]
    gpw = np.maximum(np.round(WORKER_DEMAND[t, 0]).astype(int), 1)
    iters = np.ones(n)
    meas = np.full((n, len(measured_placements())), np.nan)
    site = cfg.site_speeds
    g_max = cfg.max_workers * int(gpw.max()) if site is not None else 0
    site_rate = np.zeros((n, g_max + 1))
    use_site = np.zeros(n, bool)
    spread = np.zeros(n)
    for j in np.flatnonzero(ar):
        model, batch = names[j], float(trace.batch_size[j])
        if t[j] != catalog.UNSEEN:  # a site's own class has only the site's curve (check_site: it has one)
            iters[j] = catalog.iterations_per_epoch(model, batch)
            meas[j] = _measured_rates(model, batch)
        if site is not None and model in site.names():
            use_site[j] = True
            site_rate[j] = [site.epochs_per_s(model, g) for g in range(g_max + 1)]
            spread[j] = site.spread_slowdown(model)
    big = np.finfo(np.float32).max
    jobs = Jobs(
        valid=jnp.asarray(pad(np.ones(n, bool), False, bool)),
        arrival_slot=jnp.asarray(pad(trace.arrival_slot, np.iinfo(np.int32).max, np.int32)),
        submitted=jnp.asarray(pad(trace.submitted, 0.0, float), f),
        type_idx=jnp.asarray(pad(t, 0, np.int32)),
        est_epochs=jnp.asarray(pad(trace.est_epochs, 1.0, float), f),
        true_epochs=jnp.asarray(pad(trace.true_epochs, big, float), f),
        speed_factor=jnp.asarray(pad(trace.speed_factor, 1.0, float), f),
        allreduce=jnp.asarray(pad(ar, False, bool)),
        worker_demand=jnp.asarray(np.concatenate([WORKER_DEMAND[t], np.zeros((J - n, 3))]), f),
        ps_demand=jnp.asarray(np.concatenate([PS_DEMAND[t], np.zeros((J - n, 3))]), f),
        gpus_per_worker=jnp.asarray(pad(gpw, 1, np.int32)),
        batch_size=jnp.asarray(pad(trace.batch_size, 0.0, float), f),
        iters_per_epoch=jnp.asarray(pad(iters, 1.0, float), f),
        adaptive=jnp.asarray(pad(np.asarray(trace.adaptive, bool) & ar, False, bool)),
        measured_rate=jnp.asarray(np.concatenate([meas, np.full((J - n, meas.shape[1]), np.nan)]), f),
        site_rate=jnp.asarray(np.concatenate([site_rate, np.zeros((J - n, g_max + 1))]), f),
        use_site=jnp.asarray(pad(use_site, False, bool)), site_spread=jnp.asarray(pad(spread, 0.0, float), f),
        packed_rate=jnp.zeros((J, cfg.max_workers + 1), f),
    )
    if not ar.any():
        return jobs
    return jobs.replace(packed_rate=packed_rates(make_params(cfg, J, has_allreduce=True, placement=False), jobs))


@jax.jit
def packed_rates(params: EnvParams, jobs: Jobs) -> jnp.ndarray:
    """[J, W + 1] every job's epochs/s as an all-reduce job packed on the fewest servers at 0..W workers (0 for
    a PS job): `_allreduce_rates` without a placement, at every count."""
    k = jnp.arange(params.max_workers + 1, dtype=jnp.int32)
    rates = jax.vmap(lambda n: _allreduce_rates(params, jobs, jnp.full(jobs.type_idx.shape, n), None)[0],
                     out_axes=1)(k)
    return jnp.where(jobs.allreduce[:, None], rates, 0.0)


def reset(params: EnvParams, jobs: Jobs, key) -> EnvState:
    """A cluster at the first arrival of its jobs, nothing trained (the engine's `run` starts there)."""
    J = params.max_jobs
    f = jobs.est_epochs.dtype
    first = jnp.min(jnp.where(jobs.valid, jobs.arrival_slot, jnp.iinfo(jnp.int32).max))
    zi = jnp.zeros(J, jnp.int32)
    return EnvState(
        jobs=jobs, slot=jnp.where(jnp.any(jobs.valid), first, 0).astype(jnp.int32), epochs_done=jnp.zeros(J, f),
        finished=~jobs.valid, finish_time=jnp.full(J, jnp.nan, f), slots_run=zi, workers=zi, ps=zi,
        restart_debt=jnp.zeros(J, f),
        servers=jnp.zeros((J, params.num_servers if params.placement else 0), jnp.int32), batch=jobs.batch_size,
        key=key,
        speed_factors=jnp.full((J, SPEED_FACTOR_SLOTS), jnp.nan, f))


def from_trace(trace: Trace, cfg: SimConfig, max_jobs: int, *, seed: int = 0,
               placement: bool | None = None) -> tuple[EnvParams, EnvState]:
    """(params, initial state) of one cluster running ``trace`` under ``cfg``. ``placement``: whether `step`
    takes workers per server (default: when the trace has all-reduce jobs, whose speed depends on it); `step`
    takes each job's batch where the trace has jobs that adapt theirs."""
    has_ar = bool(np.any(trace.allreduce))
    params = make_params(cfg, max_jobs, has_allreduce=has_ar, placement=has_ar if placement is None else placement,
                         adaptive=bool(np.any(trace.adaptive)))
    return params, reset(params, job_arrays(trace, cfg, max_jobs), jax.random.PRNGKey(seed))


def from_traces(traces: list[Trace], cfg: SimConfig, max_jobs: int, *, seeds=None,
                placement: bool | None = None) -> tuple[EnvParams, EnvState]:
    """(shared params, a batch of initial states, one per trace, leading axis = trace) for `jax.vmap`."""
    has_ar = any(bool(np.any(t.allreduce)) for t in traces)
    params = make_params(cfg, max_jobs, has_allreduce=has_ar, placement=has_ar if placement is None else placement,
                         adaptive=any(bool(np.any(t.adaptive)) for t in traces))
    seeds = range(len(traces)) if seeds is None else seeds
    states = [reset(params, job_arrays(t, cfg, max_jobs), jax.random.PRNGKey(s)) for t, s in zip(traces, seeds)]
    return params, stack(states)


def stack(states):
    """A batch (leading axis) of pytrees of equal shapes."""
    return jax.tree_util.tree_map(lambda *x: jnp.stack(x), *states)


def unstack(batch, i: int):
    """The i-th member of a batch."""
    return jax.tree_util.tree_map(lambda x: x[i], batch)


# ------------------------------------------------------------------------------------------ one slot

def active(state: EnvState) -> jnp.ndarray:
    """[J] jobs that have arrived and not finished (the rows of the engine's SlotView)."""
    return state.jobs.valid & (state.jobs.arrival_slot <= state.slot) & ~state.finished


def is_done(state: EnvState) -> jnp.ndarray:
    """Every job of the trace has finished."""
    return jnp.all(state.finished)


def observe(params: EnvParams, state: EnvState) -> dict:
    """What a scheduler may know of the slot about to be decided (the engine's SlotView, padded to J rows, with
    ``active`` marking its rows): no true epochs, no interference factor (only its measurement,
    ``job_speed_factor``)."""
    j = state.jobs
    return {"slot": state.slot, "active": active(state), "type_idx": j.type_idx, "arrival_slot": j.arrival_slot,
            "slots_run": state.slots_run, "epochs_done": state.epochs_done, "est_epochs": j.est_epochs,
            "remaining_epochs": jnp.maximum(j.est_epochs - state.epochs_done, 0.0), "prev_workers": state.workers,
            "prev_ps": state.ps, "allreduce": j.allreduce, "worker_demand": j.worker_demand,
            "ps_demand": j.ps_demand, "prev_servers": state.servers, "batch_size": state.batch,
            "adaptive": j.adaptive,
            "job_speed_factor": measured_speed_factor(state.speed_factors)}


def measured_speed_factor(factors) -> jnp.ndarray:
    """[J] the mean of each row of ``factors`` [J, slots] over its measured slots (NaN: none), as the engine's."""
    seen = ~jnp.isnan(factors)
    count = jnp.sum(seen, axis=1)
    total = jnp.sum(jnp.where(seen, factors, 0.0), axis=1)
    return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)


def _measure_speed(params: EnvParams, state: EnvState, act, ends, w, per_s, epochs):
    """``state.speed_factors`` with this slot's trained / predicted speed appended for every job that trained
    through the whole slot (the engine's measure_speed): the prediction is the speed model's at the pair run,
    with factor 1, for a whole slot (a PS job's table, ``per_s`` epochs/s as the step looked it up; an
    all-reduce job's packed rate, its est_speed)."""
    if params.has_allreduce:
        jobs = state.jobs
        packed = jobs.packed_rate[jnp.arange(w.shape[0]), jnp.clip(w, 0, jobs.packed_rate.shape[1] - 1)]
        per_s = jnp.where(jobs.allreduce, packed, per_s)
    predicted = per_s * params.slot_seconds
    full = act & ~ends & (predicted > 0)
    ratio = epochs / jnp.where(predicted > 0, predicted, 1.0)
    rolled = jnp.concatenate([state.speed_factors[:, 1:], ratio[:, None]], axis=1)
    return jnp.where(full[:, None], rolled, state.speed_factors)


def _pollux_step_time(fit, gpus, nodes, local_bsz):
    """dl2d.workload.throughput.PolluxFit.step_time, element-wise over jobs (``fit`` [J, 7])."""
    ag, bg, al, bl, an, bn, gamma = (fit[:, i] for i in range(7))
    grad = ag + bg * local_bsz
    sync = jnp.where(nodes > 1, an + bn * (gpus - 2), al + bl * (gpus - 2))
    sync = jnp.where(gpus > 1, jnp.maximum(sync, 0.0), 0.0)
    return (grad ** gamma + sync ** gamma) ** (1.0 / gamma)


def _model_row(jobs: Jobs) -> jnp.ndarray:
    """[J] each job's row in the per-all-reduce-model arrays (catalog.ALLREDUCE_MODELS; 0 for a PS job)."""
    return jnp.clip(jobs.type_idx - NUM_DL2_TYPES, 0, NUM_AR_MODELS - 1)


def _at_batch(params: EnvParams, jobs: Jobs, match, safe, nodes, fit, batch):
    """([J] seconds per step at the job's measured placement, [J] iterations per epoch) at total batch ``batch``:
    the engine's lookup (dl2d.workload.throughput.ThroughputModel.times: linear between the measured local
    batches, the fit through the nearest one outside them; workloads.iterations_to_finish: the measured runs'
    samples interpolated in log batch) in arrays. ``match`` [J, M]: the job's placement among the measured ones;
    ``safe`` [J]: its GPUs (at least 1)."""
    rows = jnp.arange(batch.shape[0])
    a = _model_row(jobs)
    m = jnp.argmax(match, axis=1)
    xs, ys, n = params.table_local[a, m], params.table_step[a, m], params.table_count[a, m]
    local = batch / safe
    i = jnp.sum(xs < local[:, None], axis=1)  # bisect_left (padding is inf)
    top = xs.shape[1] - 1
    x_hi, y_hi = xs[rows, jnp.clip(i, 0, top)], ys[rows, jnp.clip(i, 0, top)]
    x_lo, y_lo = xs[rows, jnp.clip(i - 1, 0, top)], ys[rows, jnp.clip(i - 1, 0, top)]
    between = (i > 0) & (i < n)
    w = (local - x_lo) / jnp.where(between, x_hi - x_lo, 1.0)
    edge = jnp.clip(jnp.where(i == 0, 0, n - 1), 0, top)
    x_edge, y_edge = xs[rows, edge], ys[rows, edge]
    fitted = _pollux_step_time(fit, safe, nodes, local)
    through = fitted * y_edge / _pollux_step_time(fit, safe, nodes, jnp.where(jnp.isfinite(x_edge), x_edge, 1.0))
    step = jnp.where((i < n) & (x_hi == local), y_hi, jnp.where(between, y_lo + w * (y_hi - y_lo), through))
    log_b = jnp.log(jnp.maximum(batch, 1e-30))
    samples = jax.vmap(jnp.interp)(log_b, params.runs_log_batch[a], params.runs_samples[a])
    iters = samples / jnp.maximum(batch, 1e-30) / params.runs_epochs[a]
    return step, iters


def _allreduce_rates(params: EnvParams, jobs: Jobs, workers, counts, batch=None):
    """[J] epochs/s of every job as an all-reduce job on its placement (before interference and noise), and
    [J] whether it spans several servers one of which holds another multi-server job. ``counts``: workers per
    server [J, servers], or None for packed placements (never sharing). ``batch`` [J]: each job's total batch
    now (with ``params.adaptive``; a job that does not adapt its batch keeps its submitted one)."""
    L = params.measured_placements.shape[1]
    gpw = jobs.gpus_per_worker
    if counts is None:  # packed: full nodes, then the rest
        per = params.gpus_per_node
        gpus = workers * gpw
        top = jnp.clip(gpus[:, None] - per * jnp.arange(L)[None, :], 0, per)
        nodes = (gpus + per - 1) // per
        shared = jnp.zeros(workers.shape, bool)
    else:
        on = counts > 0
        g = counts * gpw[:, None]
        gpus = g.sum(axis=1)
        nodes = on.sum(axis=1)
        top = -jnp.sort(-g, axis=1)[:, :L]
        if top.shape[1] < L:
            top = jnp.pad(top, ((0, 0), (0, L - top.shape[1])))
        multi = nodes > 1
        per_server = jnp.sum(multi[:, None] & on, axis=0)  # multi-server jobs on each server
        shared = multi & jnp.any(on & (per_server[None, :] > 1), axis=1)
    match = jnp.all(top[:, None, :] == params.measured_placements[None, :, :], axis=-1) & (nodes <= L)[:, None]
    known = ~jnp.isnan(jobs.measured_rate)
    measured = jnp.any(match & known, axis=1)  # at most one measured placement matches
    meas = jnp.sum(jnp.where(match & known, jobs.measured_rate, 0.0), axis=1)
    fit = params.pollux_fit[_model_row(jobs)]
    safe = jnp.maximum(gpus, 1).astype(jobs.batch_size.dtype)
    total, iters = jobs.batch_size, jobs.iters_per_epoch
    if params.adaptive and batch is not None:  # adaptive jobs at their batch now; the rest as precomputed
        step, at = _at_batch(params, jobs, match, safe, nodes, fit, batch)
        meas = jnp.where(jobs.adaptive, 1.0 / (step * at), meas)
        total, iters = jnp.where(jobs.adaptive, batch, total), jnp.where(jobs.adaptive, at, iters)
    fitted = 1.0 / (_pollux_step_time(fit, safe, nodes, total / safe) * iters)
    rate = jnp.where(measured, meas, fitted)
    site = jobs.site_rate[jnp.arange(jobs.site_rate.shape[0]), jnp.clip(gpus, 0, jobs.site_rate.shape[1] - 1)]
    spread = nodes > (gpus + params.gpus_per_node - 1) // params.gpus_per_node  # more nodes than it needs
    site = site / jnp.where(spread, 1.0 + jobs.site_spread, 1.0)
    rate = jnp.where(jobs.use_site, site, rate)
    return jnp.where(gpus > 0, rate, 0.0), shared


def step(params: EnvParams, state: EnvState, workers, ps, placement=None, noise=None, batch=None):
    """One slot: (next state, reward, done, info). Pure; jit-, vmap- and scan-able.

    ``workers`` / ``ps`` [J]: each job's placed tasks this slot. ``placement`` [J, servers] (required when
    ``params.placement``): workers per server; an all-reduce job's workers are its row's sum. ``noise`` [J]:
    this slot's U(-1, 1) draws (default: from the state's key). ``batch`` [J] (with ``params.adaptive``): each
    job's total batch, 0 or its own to keep it; a job that does not adapt its batch keeps its own, one that
    does is held to its model's measured batches (both counted in ``info["clipped"]``), and a new batch is a
    restart. A finished cluster stays as it is."""
    jobs, f = state.jobs, state.epochs_done.dtype
    key, sub = jax.random.split(state.key)
    u = jax.random.uniform(sub, (params.max_jobs,), f, -1.0, 1.0) if noise is None else jnp.asarray(noise, f)
    act = active(state)
    ar = jobs.allreduce
    asked_w, asked_p = jnp.asarray(workers, jnp.int32), jnp.asarray(ps, jnp.int32)
    w = jnp.clip(asked_w, 0, params.max_workers)
    counts = None
    if params.placement:
        if placement is None:
            raise ValueError("this environment takes a placement (workers per server) every slot")
        counts = jnp.where((ar & act)[:, None], jnp.maximum(jnp.asarray(placement, jnp.int32), 0), 0)
        w = jnp.where(ar, counts.sum(axis=1, dtype=jnp.int32), w)
    p = jnp.where(ar, 0, jnp.clip(asked_p, 0, params.max_ps))
    w, p = jnp.where(act, w, 0), jnp.where(act, p, 0)

    changed = act & ((w != state.workers) | (p != state.ps))
    if counts is not None:  # an all-reduce job moved to other servers restarts as well
        changed = changed | (act & ar & jnp.any(counts != state.servers, axis=1))
    new_batch, clipped_batch = state.batch, jnp.zeros(params.max_jobs, bool)
    if batch is not None:
        if not params.adaptive:
            raise ValueError("this environment has no job that adapts its batch (make_params adaptive=False)")
        want = jnp.asarray(batch, f)
        lim = params.batch_limits[_model_row(jobs)]
        asks = act & (want > 0) & (want != state.batch)
        held = jnp.clip(want, lim[:, 0], lim[:, 1])
        new_batch = jnp.where(asks & jobs.adaptive, held, state.batch)
        clipped_batch = asks & (~jobs.adaptive | (held != want))
        changed = changed | (new_batch != state.batch)  # a job takes a new batch at a restart (DL2D_BATCH_SIZE)
    debt = state.restart_debt + params.resize_overhead_s * changed
    seconds = params.slot_seconds - jnp.minimum(debt, params.slot_seconds)
    factor = jobs.speed_factor * (1 + params.slot_noise * u)

    n = params.speed_table.shape[1] - 1
    tps = jnp.minimum(jobs.type_idx, NUM_DL2_TYPES - 1)
    speed = params.speed_table[tps, jnp.clip(p, 0, n), jnp.clip(w, 0, n)]
    epochs = speed * factor * seconds / params.batches_per_epoch[tps]  # workload.speed.epochs_trained
    if params.has_allreduce:
        rate, shared = _allreduce_rates(params, jobs, w, counts, new_batch)
        ar_epochs = rate * factor * (1 - params.shared_node_slowdown * shared) * seconds
        epochs = jnp.where(ar, ar_epochs, epochs)
    epochs = jnp.where(act, epochs, 0.0)

    # engine.advance
    left = jobs.true_epochs - state.epochs_done
    trained = jnp.where(act, jnp.minimum(epochs, left), 0.0)
    ends = act & (epochs >= left - 1e-12)
    frac = jnp.where(epochs > 0, left / jnp.where(epochs > 0, epochs, 1.0), 1.0)
    finish = jnp.where(ends, state.slot + jnp.clip(frac, 0.0, 1.0), state.finish_time)
    reward = jnp.sum(trained / jobs.est_epochs)
    was_done = is_done(state)
    nxt = state.replace(
        slot=state.slot + jnp.where(was_done, 0, 1).astype(jnp.int32), epochs_done=state.epochs_done + trained,
        finished=state.finished | ends, finish_time=finish, slots_run=state.slots_run + act,
        workers=jnp.where(act, w, state.workers), ps=jnp.where(act, p, state.ps),
        restart_debt=jnp.where(act, debt - (params.slot_seconds - seconds), state.restart_debt),
        servers=state.servers if counts is None else jnp.where(act[:, None], counts, state.servers),
        batch=new_batch, key=key,
        speed_factors=_measure_speed(params, state, act, ends, w,
                                     speed / params.batches_per_epoch[tps], epochs))
    total = params.server_capacity * params.num_servers
    used = jnp.sum(w[:, None] * jobs.worker_demand + p[:, None] * jobs.ps_demand, axis=0)
    info = {
        "active": act, "workers": w, "ps": p, "batch": new_batch, "trained": trained, "resized": jnp.sum(changed),
        "utilisation": jnp.where(total > 0, used / jnp.where(total > 0, total, 1.0), 0.0),
        "over_capacity": jnp.any(used > total + 1e-6),
        # active jobs whose counts were not taken as given (limits, PS of an all-reduce job)
        "clipped": jnp.sum(act & (((w != asked_w) & ~(ar & params.placement)) | (p != asked_p) | clipped_batch)),
    }
    return nxt, reward, is_done(nxt), info


def jct(state: EnvState) -> jnp.ndarray:
    """[J] each job's completion time in slots (submission to finish; NaN unfinished or padding)."""
    return jnp.where(state.jobs.valid, state.finish_time - state.jobs.submitted, jnp.nan)


def autoreset(params: EnvParams, nxt: EnvState, done) -> tuple[EnvState, jnp.ndarray]:
    """``nxt``, or a fresh episode of the same trace (a new noise key) when ``done``; and the finished
    episode's average JCT in slots (NaN when not done)."""
    fresh = reset(params, nxt.jobs, jax.random.split(nxt.key)[1])
    out = jax.tree_util.tree_map(lambda a, b: jnp.where(done, a, b), fresh, nxt)  # not done: exactly `nxt`
    return out, jnp.where(done, jnp.nanmean(jct(nxt)), jnp.nan)


def step_autoreset(params: EnvParams, state: EnvState, workers, ps, placement=None, noise=None, batch=None):
    """`step`, then :func:`autoreset`: a batch of clusters keeps stepping useful slots (gymnax's auto-reset).
    ``info['episode_jct']`` is the finished episode's average JCT in slots (NaN in other slots)."""
    nxt, reward, done, info = step(params, state, workers, ps, placement, noise, batch)
    out, episode_jct = autoreset(params, nxt, done)
    return out, reward, done, {**info, "episode_jct": episode_jct}


# ------------------------------------------------------------------------------------------ many slots

def replay(params: EnvParams, state: EnvState, workers, ps, placement=None, noise=None, batch=None):
    """A fixed sequence of allocations (leading axis = slot: workers/ps [T, J], placement [T, J, servers],
    noise [T, J], batch [T, J]) under `jax.lax.scan`: (final state, per-slot reward, done, epochs_done [T, J],
    finish_time [T, J], resized, the measured job_speed_factor after the slot [T, J])."""
    xs = (workers, ps, placement, noise, batch)

    def body(s, x):
        w, p, pl, nz, b = x
        s, r, d, info = step(params, s, w, p, pl, nz, b)
        return s, {"reward": r, "done": d, "epochs_done": s.epochs_done, "finish_time": s.finish_time,
                   "resized": info["resized"], "job_speed_factor": measured_speed_factor(s.speed_factors)}

    return jax.lax.scan(body, state, xs)


Rule = Callable[[EnvParams, EnvState], tuple]


def rollout(params: EnvParams, state: EnvState, rule: Rule, num_slots: int, autoreset: bool = True):
    """``num_slots`` slots with allocations from a pure ``rule(params, state) -> (workers, ps, placement)``
    (or with each job's batch as well, a fourth) inside the scan: (final state, per-slot reward, done,
    episode_jct)."""
    stepper = step_autoreset if autoreset else step

    def body(s, _):
        w, p, pl, *b = rule(params, s)
        s, r, d, info = stepper(params, s, w, p, pl, None, *b)
        return s, {"reward": r, "done": d, "episode_jct": info.get("episode_jct", jnp.nan)}

    return jax.lax.scan(body, state, None, length=num_slots)


# ------------------------------------------------------------------------------------------ a trivial rule

def first_fit(params: EnvParams, demand, workers) -> jnp.ndarray:
    """[J, servers] workers per server: each job in row order fills servers in index order (only these
    workers count against the servers; what fits nowhere is dropped)."""
    S = params.num_servers
    free0 = jnp.broadcast_to(params.server_capacity, (S, 3))

    def body(free, x):
        d, w = x
        per = jnp.where(d > 0, free / jnp.where(d > 0, d, 1.0), jnp.inf)
        fit = jnp.minimum(jnp.floor(jnp.min(per, axis=1) + 1e-6), w).astype(jnp.int32)
        before = jnp.cumsum(fit) - fit
        take = jnp.clip(w - before, 0, fit)
        return free - take[:, None] * d, take

    return jax.lax.scan(body, free0, (demand, workers))[1]


def fair_share(params: EnvParams, state: EnvState):
    """A trivial allocation rule, pure and jitted with the environment (tests and benchmarks, not a policy):
    every active job gets the same number of bundles (a worker and, for a PS job, a PS), as many as the
    cluster's aggregate capacity allows (fragmentation ignored); when not even one each fits, the earliest
    jobs get one. With placement, all-reduce workers go first-fit on the servers."""
    jobs, act = state.jobs, active(state)
    bundle = jobs.worker_demand + jnp.where(jobs.allreduce[:, None], 0.0, jobs.ps_demand)
    bundle = jnp.where(act[:, None], bundle, 0.0)
    total = params.server_capacity * params.num_servers
    need = bundle.sum(axis=0)
    k = jnp.floor(jnp.min(jnp.where(need > 0, total / jnp.where(need > 0, need, 1.0), jnp.inf)) + 1e-6)
    k = jnp.clip(jnp.nan_to_num(k, posinf=params.max_workers), 0, params.max_workers).astype(jnp.int32)
    one = jnp.all(jnp.cumsum(bundle, axis=0) <= total + 1e-6, axis=1) & act
    w = jnp.where(act, jnp.where(k >= 1, k, one.astype(jnp.int32)), 0)
    p = jnp.where(jobs.allreduce, 0, jnp.minimum(w, params.max_ps))
    placement = None
    if params.placement:
        placement = first_fit(params, jobs.worker_demand, jnp.where(jobs.allreduce, w, 0))
    return w, p, placement
