"""The time-slotted simulator: state in, allocation out, next state and reward.

Every slot (20 minutes by default) the scheduler sees a `SlotView` of the jobs that have arrived and not
finished, ordered by arrival, and returns an `Allocation`: workers and PS per job, for this slot, decided
from scratch as in DL2. `step` places the tasks, trains every job for one slot at the speed its (PS, workers)
give on the measured speed table, times its hidden interference factor and a per-slot noise, and returns the
next state and DL2's reward (eq. 1): the sum over jobs of epochs trained this slot / the job's epoch estimate.

A job is seen at the first slot boundary at or after its submission and its JCT counts from the submission
(dl2d.sim.trace.Trace). `SimState` is a handful of arrays over all jobs of the trace and `advance` is
element-wise math plus a table lookup; dl2d.sim.jaxenv is the same slot as a pure JAX environment (the parity
tests in tests/sim/test_jaxenv.py), which takes the placement this engine makes as given.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from dl2d.core.contract import SPEED_FACTOR_SLOTS, Allocation, SlotView, check_allreduce_placement, validate
from dl2d.core.limits import MAX_PS, MAX_WORKERS
from dl2d.core.placement import place_servers
from dl2d.sim import allreduce, hetero, network
from dl2d.sim.cluster import ClusterSpec
from dl2d.sim.trace import Trace
from dl2d.workload.catalog import DEFAULT_RULES, MODEL_NAMES, WORKER_DEMAND, SpeedRules, demand_fields, speed_estimate
from dl2d.workload.jobtypes import BATCHES_PER_EPOCH
from dl2d.workload.speed import epochs_trained, speed_table
from dl2d.workload.speedfit import SiteSpeeds


@dataclass(frozen=True)
class SimConfig:
    cluster: ClusterSpec = ClusterSpec()
    slot_seconds: float = 1200.0
    speed_model: str = "measured"  # measured (testbed data) | parametric (Optimus-style fit)
    slot_noise: float = 0.1  # per job and slot speed factor 1 + noise * U(-1, 1)
    max_workers: int = MAX_WORKERS
    max_ps: int = MAX_PS
    # training time a job loses when its allocation changes (may exceed a slot: the rest is lost next slot);
    # for an all-reduce job also when its servers change (a checkpoint-restart)
    resize_overhead_s: float = 0.0
    # a multi-server all-reduce job sharing a server with another one trains this much slower (dl2d.sim.allreduce)
    shared_node_slowdown: float = 0.0
    # where the schedulers place an all-reduce job's new workers (dl2d.core.contract.ALLREDUCE_PLACEMENTS):
    # "pack" on the best fit for the workers the job still wants (SlotView's), "spread" on the least loaded server
    allreduce_placement: str = "pack"
    max_slots: int = 50_000
    # Cross-node PS <-> worker communication (dl2d.sim.network). Traffic is always measured and reported;
    # with this on it also slows jobs whose traffic crosses servers. Off by default.
    cross_node_comm: bool = False
    # Heterogeneous servers (dl2d.sim.hetero), off by default: per-server base speeds drawn from these
    # classes (e.g. hetero.THREE_GENERATIONS), and a log-speed random walk per server and slot.
    server_speed_classes: tuple[float, ...] = ()
    speed_walk_sigma: float = 0.0
    speed_walk_reversion: float = 0.1
    speed_walk_bound: float = 0.5
    hetero_seed: int = 0
    # a site's calibrated speed curves (dl2d.workload.speedfit.SiteSpeeds, from `dl2ctl calibrate`): the truth
    # and the scheduler's estimate of the all-reduce models it holds; None: the measured lookup for all
    site_speeds: SiteSpeeds | None = None
    # how an all-reduce job's speed follows from the measurements (per-GPU batch cap and accumulation, off-table
    # placements, work): dl2d's own by default, the Pollux artifact's in the reference preset (dl2d.sim.presets)
    speed_rules: SpeedRules = DEFAULT_RULES
    # a job that lets the scheduler choose its batch chooses its own at every epoch, the goodput-optimal one for its
    # GPUs, in place (as an AdaptDL job does; the Pollux artifact's); off: its batch changes only at a restart, as
    # dl2d's job contract gives it (progress rule only)
    batch_in_place: bool = False

    @property
    def heterogeneous(self) -> bool:
        return bool(self.server_speed_classes) or self.speed_walk_sigma > 0

    def __post_init__(self):
        if self.slot_seconds <= 0:
            raise ValueError("slot_seconds must be > 0")
        if not 0 <= self.slot_noise < 1:
            raise ValueError("slot_noise must be in [0, 1)")
        if self.max_workers < 1 or self.max_ps < 1:
            raise ValueError("max_workers and max_ps must be >= 1")
        if not 0 <= self.resize_overhead_s < float("inf"):
            raise ValueError("resize_overhead_s must be a finite number >= 0")
        if not 0 <= self.shared_node_slowdown < 1:
            raise ValueError("shared_node_slowdown must be in [0, 1)")
        check_allreduce_placement(self.allreduce_placement)
        if any(c <= 0 for c in self.server_speed_classes):
            raise ValueError("server_speed_classes must be > 0")
        if self.speed_walk_sigma < 0 or not 0 <= self.speed_walk_reversion <= 1 or self.speed_walk_bound < 0:
            raise ValueError("speed walk needs sigma >= 0, reversion in [0, 1] and bound >= 0")


@dataclass(frozen=True)
class SimState:
    slot: int
    epochs_done: np.ndarray  # [N]
    finish_time: np.ndarray  # [N], in slots (fractional), nan while unfinished
    slots_run: np.ndarray  # [N], slots spent in the system so far
    workers: np.ndarray  # [N], last slot's allocation
    ps: np.ndarray  # [N]
    server_perf: np.ndarray | None = None  # [servers] log-speed walk state (heterogeneous runs only)
    restart_debt: np.ndarray | None = None  # [N] seconds of resize overhead still to lose; None: none
    worker_servers: tuple[tuple[int, ...], ...] | None = None  # [N] last slot's servers of each job's workers
    ps_servers: tuple[tuple[int, ...], ...] | None = None
    # [N, SPEED_FACTOR_SLOTS] each job's measured / predicted speed in its last full slots, newest last (NaN: none
    # yet), as the daemon measures it (dl2d.daemon.jobstats): the view's job_speed_factor is their mean
    speed_factors: np.ndarray | None = None
    batch: np.ndarray | None = None  # [N] the total batch each job trains at (None: each its trace's)

    @staticmethod
    def initial(n: int) -> "SimState":
        z = np.zeros(n)
        none = tuple(() for _ in range(n))
        return SimState(0, z.copy(), np.full(n, np.nan), np.zeros(n, int), np.zeros(n, int), np.zeros(n, int),
                        None, z.copy(), none, none, np.full((n, SPEED_FACTOR_SLOTS), np.nan))

    def active(self, trace: Trace) -> np.ndarray:
        """Trace indices of jobs that have arrived and not finished, by arrival."""
        return np.flatnonzero((trace.arrival_slot <= self.slot) & np.isnan(self.finish_time))

    def done(self) -> bool:
        return bool(np.all(~np.isnan(self.finish_time)))


def trace_speed_estimate(trace: Trace, cfg: SimConfig) -> np.ndarray:
    """[N, max_ps + 1, max_workers + 1]: what a scheduler believes of every job's speed (computed once per
    trace and limits)."""
    key = ("est_speed", cfg.max_ps, cfg.max_workers, float(cfg.cluster.gpus), cfg.site_speeds, cfg.speed_rules)
    cache = trace.__dict__.setdefault("_cache", {})
    if key not in cache:
        est = speed_estimate(trace.type_idx, trace.batch_size, cfg.max_ps, cfg.max_workers, cfg.cluster.gpus,
                             rules=cfg.speed_rules)
        if cfg.site_speeds is not None:  # the site's own curve is what its scheduler would know
            names = trace.speed_names()
            for j in np.flatnonzero(trace.allreduce):
                model = names[j]
                if model in cfg.site_speeds.names():
                    g = max(int(np.ceil(WORKER_DEMAND[int(trace.type_idx[j]), 0])), 1)
                    est[j, 0] = [cfg.site_speeds.epochs_per_s(model, w * g) for w in range(cfg.max_workers + 1)]
        cache[key] = est
    return cache[key]


def batches(trace: Trace, state: SimState) -> np.ndarray:
    """[N] the total batch each job trains at now."""
    return trace.batch_size if state.batch is None else state.batch


def view_of(trace: Trace, state: SimState, cfg: SimConfig) -> SlotView:
    idx = state.active(trace)
    cap = cfg.cluster.empty()
    return SlotView(
        slot=state.slot, job_ids=idx, type_idx=trace.type_idx[idx], arrival_slot=trace.arrival_slot[idx],
        slots_run=state.slots_run[idx], epochs_done=state.epochs_done[idx], est_epochs=trace.est_epochs[idx],
        prev_workers=state.workers[idx], prev_ps=state.ps[idx], free=cap.copy(), capacity=cap,
        max_workers=cfg.max_workers, max_ps=cfg.max_ps, server_speed=server_speeds(state, cfg),
        **demand_fields(trace.type_idx[idx]), est_speed=trace_speed_estimate(trace, cfg)[idx],
        requested_workers=trace.requested[idx], batch_size=batches(trace, state)[idx],
        adaptive=trace.adaptive[idx] if trace.adaptive.any() else None,
        submitted_batch=trace.batch_size[idx] if trace.adaptive.any() else None, slot_seconds=cfg.slot_seconds,
        prev_worker_servers=tuple(state.worker_servers[i] for i in idx),
        prev_ps_servers=tuple(state.ps_servers[i] for i in idx), allreduce_placement=cfg.allreduce_placement,
        job_speed_factor=None if state.speed_factors is None else measured_speed_factor(state.speed_factors[idx]),
    )


def measured_speed_factor(factors: np.ndarray) -> np.ndarray:
    """[jobs] the mean of each row of ``factors`` [jobs, slots] over its measured slots (NaN: none)."""
    seen = ~np.isnan(factors)
    count = seen.sum(axis=1)
    return np.where(count > 0, np.where(seen, factors, 0.0).sum(axis=1) / np.maximum(count, 1), np.nan)


def server_speeds(state: SimState, cfg: SimConfig) -> np.ndarray | None:
    """Per-server speeds of the state's walk (None on a homogeneous cluster)."""
    if not cfg.heterogeneous:
        return None
    base = hetero.base_speeds(cfg.cluster.num_servers, cfg.server_speed_classes, cfg.hetero_seed)
    return hetero.speeds(base, state.server_perf)


def epochs_per_slot(table, types, ps, workers, factor, seconds) -> np.ndarray:
    """Epochs each job trains in `seconds` with (ps, workers): pure, element-wise."""
    return epochs_trained(table, types, ps, workers, factor, seconds)


def advance(state: SimState, trace: Trace, jobs, epochs) -> tuple[SimState, float, np.ndarray]:
    """Train `jobs` by `epochs` this slot; returns (next state, reward, epochs actually trained)."""
    done = state.epochs_done.copy()
    finish = state.finish_time.copy()
    left = trace.true_epochs[jobs] - done[jobs]
    trained = np.minimum(epochs, left)
    ends = epochs >= left - 1e-12
    frac = np.where(epochs > 0, left / np.where(epochs > 0, epochs, 1.0), 1.0)
    finish[jobs] = np.where(ends, state.slot + np.clip(frac, 0.0, 1.0), np.nan)
    done[jobs] += trained
    slots_run = state.slots_run.copy()
    slots_run[jobs] += 1
    reward = float(np.sum(trained / trace.est_epochs[jobs]))
    return replace(state, slot=state.slot + 1, epochs_done=done, finish_time=finish, slots_run=slots_run), reward, trained


def step(trace: Trace, state: SimState, alloc: Allocation, cfg: SimConfig, rng: np.random.Generator,
         table: np.ndarray | None = None, view: SlotView | None = None) -> tuple[SimState, float, dict]:
    """One slot. Pure given `rng`: the same inputs and generator state give the same outputs. ``view``: the view
    of ``state`` where the caller already built it (the one its scheduler decided on), else built here."""
    view = view_of(trace, state, cfg) if view is None else view
    validate(view, alloc)
    usage, w, p, w_srv, p_srv = place_servers(view, alloc)
    table = speed_table(cfg.speed_model) if table is None else table
    jobs = view.job_ids
    ar = trace.allreduce[jobs]
    noise = 1 + cfg.slot_noise * rng.uniform(-1, 1, len(jobs))
    changed = (w != state.workers[jobs]) | (p != state.ps[jobs])
    if ar.any():  # an all-reduce job moved to other servers restarts as well
        changed |= ar & allreduce.moved([state.worker_servers[i] for i in jobs], w_srv)
    batch = chosen_batches(trace, state, jobs, alloc)
    changed |= batch != batches(trace, state)[jobs]  # a job takes a new batch at a restart (DL2D_BATCH_SIZE)
    debt = state.restart_debt[jobs] + cfg.resize_overhead_s * changed
    seconds = cfg.slot_seconds - np.minimum(debt, cfg.slot_seconds)
    factor = trace.speed_factor[jobs] * noise
    cross = network.job_cross_fractions(w_srv, p_srv)
    perf = state.server_perf
    if cfg.heterogeneous:  # this slot's server speeds: one walk step from the last slot's
        perf = np.zeros(cfg.cluster.num_servers) if perf is None else perf
        perf = hetero.walk_step(perf, state.slot, cfg.speed_walk_sigma, cfg.speed_walk_reversion,
                                cfg.speed_walk_bound, cfg.hetero_seed)
        now = hetero.speeds(hetero.base_speeds(cfg.cluster.num_servers, cfg.server_speed_classes,
                                               cfg.hetero_seed), perf)
        factor = factor * np.array([hetero.bottleneck_speed(now, s) for s in w_srv])
    ps_jobs = np.flatnonzero(~ar)
    if cfg.cross_node_comm and len(ps_jobs):
        factor[ps_jobs] = factor[ps_jobs] * network.comm_speed_factor(view.type_idx[ps_jobs], cross[ps_jobs])
    epochs = np.zeros(len(jobs))
    if len(ps_jobs):
        epochs[ps_jobs] = epochs_per_slot(table, view.type_idx[ps_jobs], p[ps_jobs], w[ps_jobs], factor[ps_jobs],
                                          seconds[ps_jobs])
    ar_jobs = np.flatnonzero(ar)
    if len(ar_jobs):
        servers = [w_srv[j] for j in ar_jobs]
        names = trace.speed_names()
        models = [names[i] for i in jobs[ar_jobs]]
        rate = allreduce.epoch_rates(models, batch[ar_jobs], servers, view.worker_demand[ar_jobs, 0], cfg.site_speeds,
                                     int(cfg.cluster.gpus), cfg.speed_rules)
        shared = allreduce.shares_a_server(servers)
        pace = factor[ar_jobs] * (1 - cfg.shared_node_slowdown * shared)
        epochs[ar_jobs] = rate * pace * seconds[ar_jobs]
        if cfg.speed_rules.work == "progress":  # epoch by epoch, each at its own statistical efficiency
            in_place = trace.adaptive[jobs[ar_jobs]] if cfg.batch_in_place else None
            walk, walked = allreduce.progress_rates(models, batch[ar_jobs], servers, view.worker_demand[ar_jobs, 0],
                                                    state.epochs_done[jobs[ar_jobs]], pace * seconds[ar_jobs],
                                                    cfg.speed_rules, cfg.site_speeds, in_place)
            epochs[ar_jobs] = np.where(np.isnan(walk), epochs[ar_jobs], walk)
            batch = batch.copy()
            batch[ar_jobs] = walked
    nxt, reward, trained = advance(state, trace, jobs, epochs)
    factors = measure_speed(state.speed_factors, view, jobs, epochs, w, p, table, nxt.finish_time, cfg.slot_seconds)
    workers, ps = nxt.workers.copy(), nxt.ps.copy()
    workers[jobs], ps[jobs] = w, p
    restart_debt = state.restart_debt.copy()
    restart_debt[jobs] = debt - (cfg.slot_seconds - seconds)
    all_w, all_p = list(state.worker_servers), list(state.ps_servers)
    for k, i in enumerate(jobs):
        all_w[i], all_p[i] = w_srv[k], p_srv[k]
    now_batch = batches(trace, state).copy()
    now_batch[jobs] = batch
    nxt = replace(nxt, workers=workers, ps=ps, server_perf=perf, restart_debt=restart_debt,
                  worker_servers=tuple(all_w), ps_servers=tuple(all_p), speed_factors=factors,
                  batch=now_batch if trace.adaptive.any() else None)
    total_mb, cross_mb = np.zeros(0), np.zeros(0)
    if len(ps_jobs):
        t = view.type_idx[ps_jobs]
        total_mb, cross_mb = network.traffic_mb(network.MODEL_SIZE_MB[t], trained[ps_jobs] * BATCHES_PER_EPOCH[t],
                                                cross[ps_jobs])
    cap = cfg.cluster.capacity
    used = usage.sum(axis=0)
    info = {
        "jobs": jobs, "workers": w, "ps": p, "trained": trained, "resized": int(changed.sum()),
        "unplaced": int(np.sum(alloc.workers) + np.sum(alloc.ps) - w.sum() - p.sum()),
        "utilisation": np.where(cap > 0, used / np.where(cap > 0, cap, 1), 0.0),
        "worker_servers": w_srv, "ps_servers": p_srv, "cross_fraction": cross,
        "traffic_gb": float(np.sum(total_mb)) / 1024, "cross_node_gb": float(np.sum(cross_mb)) / 1024,
    }
    return nxt, reward, info


def chosen_batches(trace: Trace, state: SimState, jobs: np.ndarray, alloc: Allocation) -> np.ndarray:
    """[jobs] the total batch each job trains at this slot: the allocation's where it sets one (validate has
    checked that only adaptive jobs change theirs), within its model's limits (ValueError naming the job)."""
    from dl2d.workload.batching import limits  # noqa: PLC0415

    now = batches(trace, state)[jobs].astype(float)
    if alloc.batch_size is None:
        return now
    want = np.asarray(alloc.batch_size, float)
    for k in np.flatnonzero((want > 0) & (want != now)):
        lim = limits(MODEL_NAMES[int(trace.type_idx[jobs[k]])])
        if not lim.init <= want[k] <= lim.max_total:
            raise ValueError(f"job {int(jobs[k])}: batch {want[k]:g} outside its model's [{lim.init}, "
                             f"{lim.max_total}]")
    return np.where(want > 0, want, now)


def measure_speed(factors: np.ndarray | None, view: SlotView, jobs: np.ndarray, epochs: np.ndarray, w: np.ndarray,
                  p: np.ndarray, table: np.ndarray, finish_time: np.ndarray, slot_seconds: float) -> np.ndarray | None:
    """``factors`` with this slot's measured / predicted speed appended (the oldest dropped) for every job that
    trained through the whole slot, as the daemon measures it (dl2d.daemon.jobstats): what it trained against
    what the speed model predicts for the pair it ran, a PS job's speed table (factor 1), an all-reduce job's
    ``est_speed``. The ratio holds the job's hidden interference and this slot's noise (and time a restart
    took); a job that finished in the slot or ran nothing is not measured."""
    if factors is None:
        return None
    ar = view.allreduce
    predicted = np.zeros(len(jobs))
    ps_jobs, ar_jobs = np.flatnonzero(~ar), np.flatnonzero(ar)
    if len(ps_jobs):
        predicted[ps_jobs] = epochs_per_slot(table, view.type_idx[ps_jobs], p[ps_jobs], w[ps_jobs],
                                             np.ones(len(ps_jobs)), slot_seconds)
    if len(ar_jobs):
        predicted[ar_jobs] = view.est_speed[ar_jobs, 0, w[ar_jobs]] * slot_seconds
    full = np.isnan(finish_time[jobs]) & (predicted > 0)
    out = factors.copy()
    rows = jobs[full]
    out[rows] = np.column_stack([factors[rows, 1:], epochs[full] / predicted[full]])
    return out


# ---------------------------------------------------------------- a run and its metrics

@dataclass
class SimResult:
    policy: str
    jct_slots: np.ndarray  # per job
    type_idx: np.ndarray
    makespan_slots: float
    gpu_util: np.ndarray  # per slot
    cpu_util: np.ndarray
    rewards: np.ndarray
    slot_seconds: float
    decision_ms: float  # mean scheduler time per slot
    wall_s: float
    resizes: int = 0
    unplaced: int = 0
    extra: dict = field(default_factory=dict)
    cross_node_gb: np.ndarray | None = None  # per slot: PS <-> worker traffic between servers
    traffic_gb: np.ndarray | None = None  # per slot: all PS <-> worker traffic

    @property
    def avg_jct_slots(self) -> float:
        return float(np.mean(self.jct_slots))

    @property
    def avg_jct_hours(self) -> float:
        return self.avg_jct_slots * self.slot_seconds / 3600

    def per_type_jct_hours(self) -> dict[str, float]:
        h = self.slot_seconds / 3600
        return {MODEL_NAMES[t] if t < len(MODEL_NAMES) else "site classes":
                float(np.mean(self.jct_slots[self.type_idx == t]) * h) for t in np.unique(self.type_idx)}

    def summary(self) -> dict:
        return {
            "policy": self.policy, "jobs": len(self.jct_slots),
            "avg_jct_slots": round(self.avg_jct_slots, 3), "avg_jct_hours": round(self.avg_jct_hours, 3),
            "p99_jct_hours": round(float(np.percentile(self.jct_slots, 99)) * self.slot_seconds / 3600, 3),
            "makespan_slots": round(self.makespan_slots, 3),
            "makespan_hours": round(self.makespan_slots * self.slot_seconds / 3600, 3),
            "gpu_util": round(float(np.mean(self.gpu_util)), 4), "cpu_util": round(float(np.mean(self.cpu_util)), 4),
            "total_reward": round(float(np.sum(self.rewards)), 4), "resizes": self.resizes,
            "unplaced_tasks": self.unplaced, "decision_ms": round(self.decision_ms, 3), "wall_s": round(self.wall_s, 3),
            "per_type_jct_hours": {k: round(v, 3) for k, v in self.per_type_jct_hours().items()},
            **self.traffic_summary(),
        }

    def traffic_summary(self) -> dict:
        if self.cross_node_gb is None:
            return {}
        cross, total = float(np.sum(self.cross_node_gb)), float(np.sum(self.traffic_gb))
        return {"cross_node_gb_total": round(cross, 3),
                "cross_node_gb_per_slot": round(cross / max(len(self.cross_node_gb), 1), 3),
                "cross_node_fraction": round(cross / total, 4) if total > 0 else 0.0}


def decide(scheduler: Callable[[SlotView], Allocation], view: SlotView) -> Allocation:
    """The scheduler's allocation for ``view``; with no job in the system nothing is asked of it."""
    return scheduler(view) if len(view) else Allocation(np.zeros(0, int), np.zeros(0, int))


def run_slot(trace: Trace, state: SimState, scheduler: Callable[[SlotView], Allocation], cfg: SimConfig,
             rng: np.random.Generator, table: np.ndarray | None = None) -> tuple[SimState, float, dict]:
    """One slot of ``scheduler`` from ``state``: its view, its decision, the step (``step``'s result; the info
    also holds the "view", the "allocation" and "decide_s", the seconds the scheduler took)."""
    view = view_of(trace, state, cfg)
    t = time.perf_counter()
    alloc = decide(scheduler, view)
    decide_s = time.perf_counter() - t
    nxt, reward, info = step(trace, state, alloc, cfg, rng, table, view)
    return nxt, reward, {**info, "view": view, "allocation": alloc, "decide_s": decide_s}


class DidNotFinish(RuntimeError):
    """The engine's give-up: ``SimConfig.max_slots`` passed with jobs left (a scheduler that starves some job,
    or jobs too long for the cluster and slot). Carries how far the run got, for a comparison's row."""

    def __init__(self, max_slots: int, jobs_done: int, jobs: int):
        super().__init__(f"simulation did not finish within {max_slots} slots (a starving scheduler?): "
                         f"{jobs_done} of {jobs} jobs done")
        self.max_slots, self.jobs_done, self.jobs = max_slots, jobs_done, jobs


def run(trace: Trace, scheduler: Callable[[SlotView], Allocation], cfg: SimConfig = SimConfig(), seed: int = 0,
        on_slot: Callable[[SimState], None] | None = None, name: str | None = None) -> SimResult:
    """Simulate the whole trace with one scheduler until every job finishes."""
    trace.check_site(cfg.site_speeds)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    table = speed_table(cfg.speed_model)
    state = SimState.initial(len(trace))
    rewards, gpu, cpu, cross_gb, traffic_gb = [], [], [], [], []
    decide_s, resizes, unplaced = 0.0, 0, 0
    first = int(trace.arrival_slot.min())
    state = replace(state, slot=first)
    while not state.done():
        if state.slot - first > cfg.max_slots:
            raise DidNotFinish(cfg.max_slots, int(np.sum(~np.isnan(state.finish_time))), len(trace))
        state, r, info = run_slot(trace, state, scheduler, cfg, rng, table)
        decide_s += info["decide_s"]
        rewards.append(r)
        gpu.append(info["utilisation"][0])
        cpu.append(info["utilisation"][1])
        cross_gb.append(info["cross_node_gb"])
        traffic_gb.append(info["traffic_gb"])
        resizes += info["resized"]
        unplaced += info["unplaced"]
        if on_slot:
            on_slot(state)
    jct = state.finish_time - trace.submitted  # from submission: a job waits for the slot boundary it is seen at
    return SimResult(
        policy=name or getattr(scheduler, "name", type(scheduler).__name__), jct_slots=jct, type_idx=trace.type_idx,
        makespan_slots=float(np.max(state.finish_time) - np.min(trace.submitted)), gpu_util=np.array(gpu), cpu_util=np.array(cpu),
        rewards=np.array(rewards), slot_seconds=cfg.slot_seconds, decision_ms=1000 * decide_s / max(len(rewards), 1),
        wall_s=time.perf_counter() - t0, resizes=resizes, unplaced=unplaced,
        cross_node_gb=np.array(cross_gb), traffic_gb=np.array(traffic_gb),
    )
