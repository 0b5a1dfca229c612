"""Chic and Chic-Pair (Gong, Li, Liang, Zhan, IWQoS 2019) as schedulers of the slotted simulator.

The paper, mapped onto `dl2d.sim`:

- State (sec. 4.2): for each of the first I jobs by arrival, its model (one-hot over the job types), remaining
  iterations (here: remaining epochs / MAX_EPOCHS), workers and PS allocated so far in this decision phase
  (/ max_workers, / max_ps); plus the backlog N_t (jobs beyond the first I; fed as log1p(N_t)). Empty rows
  are all zero. Chic-Pair drops the PS column (it always equals the workers).
- Actions: Chic: 2I+1 (0-based: 2i = one more worker for job i, 2i+1 = one more PS, 2I = void);
  Chic-Pair: I+1 (i = one worker and one PS for job i, I = void).
- Decision phase: from zero tasks, one action per step until the void action, or Condition (1) (nothing more
  fits: here no add action is valid) or Condition (2) (no job's per-iteration time would drop by one more
  worker or PS, judged on the scheduler's speed model; a job with no worker or no PS can always improve).
  Jobs beyond the first I get nothing (they wait, as in the paper).
- Re-scheduling: only when the set of the first I jobs changes (a job of them finished, or a job arrived while
  fewer than I were in the system). Between those events the previous schedule is kept, slot after slot.
- Reward: r_t1 = minus the time all jobs spend in the system, in units of 20 min = one simulator slot, so an
  episode's sum of r_t1 is minus the total JCT in slots; r_t2 = -p1 for an action on a non-existent job;
  r_t3 = -p2 when a job gets its first task, +p2 back once it has both kinds (Chic only).
- Training (Algorithm 1, eq. 9): per iteration, N episodes sampled from the current policy on randomly chosen
  training traces, plus one episode with uniformly random actions; elite threshold xi_k = R_(floor((1-rho)N))
  of the sorted returns; theta_hat = argmax of the log-likelihood of the elite episodes' actions (Adam from the
  current parameters; dropout 0.5 on the first hidden layer while fitting); smoothed update
  theta_k = alpha theta_hat + (1 - alpha) theta_{k-1}; a validation set picks the best policy.

Deviations: the void action is masked while no job of the first I has both a worker and a PS and a task still
fits (a policy that allocates nothing would never be re-asked: the set of the first I jobs would not change).
Flags: invalid actions (a non-existent job, a task that fits nowhere, a job at its task limit)
are masked out by default (`mask_invalid=True`), so r_t2 never fires; with `mask_invalid=False` they are
no-ops punished by p1, as in the paper. The paper maximises the sum of probabilities of elite actions in
eq. (3)/(9); we maximise the log-likelihood (the cross-entropy method's usual form). The paper reuses alpha
for Adam's learning rate (0.01); the smoothing alpha is ours (default 0.8).

Also here: a parameter-space Gaussian cross-entropy method (`gaussian_cem_update`), not in the paper, kept as
an alternative optimiser (`method="gaussian"`).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from dl2d.sim.baselines import AllocationBuilder
from dl2d.sim.engine import Allocation, SimConfig, SlotView, run
from dl2d.sim.jobtypes import JOB_TYPES, MAX_EPOCHS
from dl2d.sim.speed import speed_table
from dl2d.sim.trace import Trace

NUM_TYPES = len(JOB_TYPES)
GREEDY, SAMPLE, UNIFORM = "greedy", "sample", "uniform"


# ---------------------------------------------------------------- configuration

@dataclass(frozen=True)
class ChicConfig:
    pair: bool = False  # Chic-Pair
    num_jobs: int = 3  # I, the first I jobs scheduled (paper default 3 on a 10-GPU cluster)
    hidden: tuple[int, ...] = (64, 32, 4)  # the paper's network
    dropout: float = 0.5  # on the first hidden layer while fitting
    max_workers: int = 16
    max_ps: int = 16
    speed_model: str = "parametric"  # what Condition (2) believes (Optimus's fitted model by default)
    mask_invalid: bool = True
    p1: float = 5.0
    p2: float = 1.0
    # cross-entropy method
    episodes: int = 35  # N
    rho: float = 0.3  # elite fraction: xi_k = R_(floor((1 - rho) N))
    alpha: float = 0.8  # smoothing
    lr: float = 0.01  # Adam
    fit_steps: int = 50  # Adam steps per iteration on the elite samples
    fit_batch: int = 512
    uniform_episode: bool = True  # the paper's extra x_{N+1}
    common_trace: bool = False  # all episodes of an iteration on one trace (the paper: a random trace each)
    method: str = "trajectory"  # trajectory (the paper) | gaussian (parameter-space CEM)
    sigma0: float = 0.1  # gaussian: initial std
    noise_floor: float = 0.01  # gaussian: std never below this

    def __post_init__(self):
        if self.num_jobs < 1:
            raise ValueError("num_jobs (I) must be >= 1")
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError("hidden must list positive layer widths")
        if not 0 <= self.dropout < 1:
            raise ValueError("dropout must be in [0, 1)")
        if not 0 < self.rho <= 1:
            raise ValueError("rho must be in (0, 1]")
        if not 0 < self.alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        if self.episodes < 1:
            raise ValueError("episodes (N) must be >= 1")
        if self.method not in ("trajectory", "gaussian"):
            raise ValueError(f"method must be trajectory or gaussian, not {self.method!r}")
        if self.max_workers < 1 or self.max_ps < 1:
            raise ValueError("max_workers and max_ps must be >= 1")

    @property
    def name(self) -> str:
        return "chic-pair" if self.pair else "chic"

    @property
    def row_dim(self) -> int:
        return NUM_TYPES + (2 if self.pair else 3)

    @property
    def state_dim(self) -> int:
        return self.num_jobs * self.row_dim + 1

    @property
    def num_actions(self) -> int:
        return (1 if self.pair else 2) * self.num_jobs + 1

    @property
    def void(self) -> int:
        return self.num_actions - 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        return d

    @staticmethod
    def from_dict(d: dict) -> "ChicConfig":
        known = {f.name for f in fields(ChicConfig)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config field(s) {sorted(unknown)}")
        d = dict(d)
        if "hidden" in d:
            d["hidden"] = tuple(int(h) for h in d["hidden"])
        return ChicConfig(**d)


# ---------------------------------------------------------------- state, actions, reward (pure)

def encode_state(cfg: ChicConfig, type_idx, remaining_epochs, workers, ps, backlog: int) -> np.ndarray:
    """The paper's s_t for up to I jobs (rows beyond the given jobs are zero) and the backlog N_t."""
    n = len(type_idx)
    if n > cfg.num_jobs:
        raise ValueError(f"{n} jobs given, the state holds I = {cfg.num_jobs}")
    rows = np.zeros((cfg.num_jobs, cfg.row_dim))
    if n:
        rows[np.arange(n), np.asarray(type_idx, int)] = 1.0
        rows[:n, NUM_TYPES] = np.asarray(remaining_epochs, float) / MAX_EPOCHS
        rows[:n, NUM_TYPES + 1] = np.asarray(workers, float) / cfg.max_workers
        if not cfg.pair:
            rows[:n, NUM_TYPES + 2] = np.asarray(ps, float) / cfg.max_ps
    return np.concatenate([rows.ravel(), [math.log1p(max(int(backlog), 0))]])


def decode_action(cfg: ChicConfig, a: int) -> tuple[int, str] | None:
    """(job row, 'worker' | 'ps' | 'bundle') of an action, or None for the void action."""
    if not 0 <= a < cfg.num_actions:
        raise ValueError(f"action {a} outside [0, {cfg.num_actions})")
    if a == cfg.void:
        return None
    if cfg.pair:
        return a, "bundle"
    return a // 2, ("worker" if a % 2 == 0 else "ps")


def can_improve(table: np.ndarray, t: int, w: int, p: int, pair: bool, max_w: int, max_p: int) -> bool:
    """Negation of Condition (2) for one job: one more worker or PS (a pair for Chic-Pair) would raise its
    speed (= lower its per-iteration time). A job lacking a worker or a PS can always improve."""
    if w == 0 or p == 0:
        return (w < max_w) and (p < max_p) if pair else True
    n = table.shape[1] - 1
    s = lambda pp, ww: table[t, min(pp, n), min(ww, n)]
    now = s(p, w)
    if pair:
        return w < max_w and p < max_p and s(p + 1, w + 1) > now
    return (w < max_w and s(p, w + 1) > now) or (p < max_p and s(p + 1, w) > now)


def r3_change(w_before: int, p_before: int, w_after: int, p_after: int, p2: float) -> float:
    """r_t3: -p2 when a job gets its first task, +p2 when it then has both a worker and a PS."""
    r = 0.0
    if w_before + p_before == 0 and w_after + p_after > 0:
        r -= p2
    if (w_before == 0 or p_before == 0) and w_after > 0 and p_after > 0:
        r += p2
    return r


def time_in_system(arrival_slot, finish_time, slot: int) -> float:
    """-r_t1 of one slot: the time (in slots, the paper's 20-min unit) jobs spend in the system during slot
    [slot, slot+1), counting a job that finishes inside the slot by its fraction. Its sum over a run is the
    total JCT, so an episode's sum of r_t1 is -sum(JCT)."""
    arr = np.asarray(arrival_slot, float)
    fin = np.asarray(finish_time, float)
    start = np.maximum(arr, slot)
    end = np.minimum(fin, slot + 1)
    return float(np.sum(np.clip(end - start, 0.0, None)))


# ---------------------------------------------------------------- cross-entropy method (pure)

def elite_threshold(returns: Sequence[float], rho: float, n: int | None = None) -> float:
    """xi_k = R_(floor((1 - rho) n)) (1-based, ascending) over all returns given; n = the number of policy
    samples N (default: all). Clamped to the smallest return when the index is < 1."""
    r = np.sort(np.asarray(returns, float))
    n = len(r) if n is None else n
    k = int(math.floor((1 - rho) * n + 1e-9))
    return float(r[min(max(k, 1), len(r)) - 1])


def elite_mask(returns: Sequence[float], xi: float) -> np.ndarray:
    """1{R(x_n) >= xi}."""
    return np.asarray(returns, float) >= xi


def smooth(new: dict, old: dict, alpha: float) -> dict:
    """theta_k = alpha theta_hat + (1 - alpha) theta_{k-1}, leaf by leaf."""
    return {k: alpha * np.asarray(new[k]) + (1 - alpha) * np.asarray(old[k]) for k in old}


def gaussian_cem_update(mu: np.ndarray, sigma: np.ndarray, samples: np.ndarray, scores: Sequence[float],
                        rho: float, alpha: float, noise_floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Parameter-space CEM (not the paper's): elites = the ceil(rho n) best samples; mean and std of the
    elites, smoothed with alpha, std floored at noise_floor."""
    samples = np.asarray(samples, float)
    k = max(1, int(math.ceil(rho * len(samples) - 1e-9)))
    elite = samples[np.argsort(-np.asarray(scores, float), kind="stable")[:k]]
    mu_new = alpha * elite.mean(axis=0) + (1 - alpha) * mu
    sd_new = alpha * elite.std(axis=0) + (1 - alpha) * sigma
    return mu_new, np.maximum(sd_new, noise_floor)


# ---------------------------------------------------------------- the policy network (numpy forward, JAX fit)

def init_params(cfg: ChicConfig, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    dims = (cfg.state_dim, *cfg.hidden, cfg.num_actions)
    p = {}
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        p[f"w{i}"] = rng.normal(0.0, math.sqrt(2.0 / a), (a, b)) * (0.1 if i == len(dims) - 2 else 1.0)
        p[f"b{i}"] = np.zeros(b)
    return p


def num_layers(params: dict) -> int:
    return sum(1 for k in params if k.startswith("w"))


def logits(params: dict, x: np.ndarray) -> np.ndarray:
    h = np.asarray(x, float)
    n = num_layers(params)
    for i in range(n):
        h = h @ params[f"w{i}"] + params[f"b{i}"]
        if i < n - 1:
            h = np.maximum(h, 0.0)
    return h


def masked_probs(z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    z = np.where(mask, z, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def flatten(params: dict) -> np.ndarray:
    return np.concatenate([np.ravel(params[k]) for k in sorted(params)])


def unflatten(vec: np.ndarray, template: dict) -> dict:
    out, i = {}, 0
    for k in sorted(template):
        n = np.size(template[k])
        out[k] = np.asarray(vec[i:i + n], float).reshape(np.shape(template[k]))
        i += n
    return out


_FIT_CACHE: dict = {}


def _fit_fns(n_layers: int, dropout: float, lr: float):
    key = (n_layers, dropout, lr)
    if key in _FIT_CACHE:
        return _FIT_CACHE[key]
    import jax
    import jax.numpy as jnp
    import optax

    def loss(params, x, mask, act, weight, rng):
        h = x
        for i in range(n_layers):
            h = h @ params[f"w{i}"] + params[f"b{i}"]
            if i < n_layers - 1:
                h = jax.nn.relu(h)
                if i == 0 and dropout > 0:
                    keep = jax.random.bernoulli(rng, 1 - dropout, h.shape)
                    h = jnp.where(keep, h / (1 - dropout), 0.0)
        h = jnp.where(mask, h, -1e9)
        logp = jax.nn.log_softmax(h)
        ll = jnp.take_along_axis(logp, act[:, None], axis=1)[:, 0]
        return -jnp.sum(ll * weight) / jnp.maximum(jnp.sum(weight), 1.0)

    opt = optax.adam(lr)

    @jax.jit
    def update(params, opt_state, x, mask, act, weight, rng):
        l, g = jax.value_and_grad(loss)(params, x, mask, act, weight, rng)
        upd, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, upd), opt_state, l

    _FIT_CACHE[key] = (opt, update, jax.jit(loss))
    return _FIT_CACHE[key]


def fit_elites(cfg: ChicConfig, params: dict, states: np.ndarray, masks: np.ndarray, actions: np.ndarray,
               seed: int = 0) -> tuple[dict, list[float]]:
    """theta_hat: Adam steps from `params` maximising the log-likelihood of the elite (state, action) pairs.
    Minibatches are padded to a fixed size (weight 0) so the update compiles once."""
    import jax
    import jax.numpy as jnp

    n = len(actions)
    if n == 0:
        return params, []
    opt, update, _ = _fit_fns(num_layers(params), cfg.dropout, cfg.lr)
    p = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    opt_state = opt.init(p)
    rng = np.random.default_rng(seed)
    key = jax.random.PRNGKey(seed)
    b = cfg.fit_batch
    losses = []
    for _ in range(cfg.fit_steps):
        idx = rng.choice(n, size=min(b, n), replace=False)
        x = np.zeros((b, states.shape[1]), np.float32)
        m = np.ones((b, masks.shape[1]), bool)
        a = np.zeros(b, np.int32)
        w = np.zeros(b, np.float32)
        x[: len(idx)], m[: len(idx)], a[: len(idx)], w[: len(idx)] = states[idx], masks[idx], actions[idx], 1.0
        key, sub = jax.random.split(key)
        p, opt_state, loss = update(p, opt_state, x, m, a, w, sub)
        losses.append(float(loss))
    return {k: np.asarray(v, float) for k, v in p.items()}, losses


def log_likelihood(cfg: ChicConfig, params: dict, states, masks, actions) -> float:
    """Mean log pi'(a|s) (no dropout): how likely the policy finds the given actions."""
    pr = masked_probs(logits(params, states), masks)
    return float(np.mean(np.log(np.maximum(pr[np.arange(len(actions)), actions], 1e-30))))


# ---------------------------------------------------------------- the scheduler

@dataclass
class Trajectory:
    states: list = field(default_factory=list)
    masks: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    penalty: float = 0.0  # sum of r_t2 and r_t3
    decisions: int = 0  # decision phases

    def arrays(self, cfg: ChicConfig):
        if not self.actions:
            return np.zeros((0, cfg.state_dim)), np.zeros((0, cfg.num_actions), bool), np.zeros(0, int)
        return np.array(self.states), np.array(self.masks), np.array(self.actions, int)


class ChicScheduler:
    """Chic / Chic-Pair as a simulator scheduler: `sched(view) -> Allocation`, with `name`.

    mode: greedy (argmax, for evaluation and deployment), sample (pi', for training) or uniform (x_{N+1}).
    """

    def __init__(self, cfg: ChicConfig, params: dict, mode: str = GREEDY, seed: int = 0, record: bool = False,
                 name: str | None = None):
        if mode not in (GREEDY, SAMPLE, UNIFORM):
            raise ValueError(f"mode must be greedy, sample or uniform, not {mode!r}")
        self.cfg, self.params, self.mode = cfg, params, mode
        self.rng = np.random.default_rng(seed)
        self.record = record
        self.name = name or cfg.name
        self.table = speed_table(cfg.speed_model)
        self.trajectory = Trajectory()
        self._key = None
        self._servers: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def reset(self) -> None:
        self.trajectory = Trajectory()
        self._key, self._servers = None, {}

    # -- one action mask / state from the builder
    def _mask(self, view: SlotView, b: AllocationBuilder, n: int) -> np.ndarray:
        cfg = self.cfg
        m = np.zeros(cfg.num_actions, bool)
        for j in range(n):
            if cfg.pair:
                if b.within_limits(j, "bundle"):
                    srv = b.placer.add_bundle(view.worker_demand[j], view.ps_demand[j])
                    if srv is not None:
                        b.placer.remove(srv[0], view.worker_demand[j])
                        b.placer.remove(srv[1], view.ps_demand[j])
                        m[j] = True
            else:
                m[2 * j] = b.within_limits(j, "worker") and self._fits_keeping_complements(view, b, n, j, "worker")
                m[2 * j + 1] = b.within_limits(j, "ps") and self._fits_keeping_complements(view, b, n, j, "ps")
        # starvation guard (ours): no void while no job would train and something still fits
        m[cfg.void] = not m[:-1].any() or any(b.workers(j) and b.ps(j) for j in range(n))
        return m

    @staticmethod
    def _fits_keeping_complements(view: SlotView, b: AllocationBuilder, n: int, j: int, kind: str) -> bool:
        """Whether one more `kind` task of job j fits while every job holding only workers can still get a PS
        and every job holding only PSs a worker (ours). Without this reservation Chic can fill the cluster
        with tasks no job can train with, and since it reuses a schedule until its jobs change, starve forever."""
        demand = view.worker_demand if kind == "worker" else view.ps_demand
        tasks = [demand[j]]
        for k in range(n):
            w, p = b.workers(k) + (k == j and kind == "worker"), b.ps(k) + (k == j and kind == "ps")
            if w and not p:
                tasks.append(view.ps_demand[k])
            elif p and not w:
                tasks.append(view.worker_demand[k])
        placed = b.placer.add_bundle(*tasks)
        if placed is None:
            return False
        for srv, d in zip(placed, tasks):
            b.placer.remove(srv, d)
        return True

    def _choose(self, state: np.ndarray, allowed: np.ndarray) -> int:
        if self.mode == UNIFORM:
            return int(self.rng.choice(np.flatnonzero(allowed)))
        z = logits(self.params, state)
        if self.mode == GREEDY:
            return int(np.argmax(np.where(allowed, z, -np.inf)))
        return int(self.rng.choice(len(z), p=masked_probs(z, allowed)))

    def decide(self, view: SlotView) -> AllocationBuilder:
        """One decision phase for the first I jobs of the view (rows are by arrival)."""
        cfg = self.cfg
        n = min(cfg.num_jobs, len(view))
        backlog = len(view) - n
        b = AllocationBuilder(view)
        rem = view.remaining_epochs[:n]
        max_steps = n * (cfg.max_workers + cfg.max_ps) + cfg.num_jobs + 1
        self.trajectory.decisions += 1
        for _ in range(max_steps):
            w = np.array([b.workers(j) for j in range(n)], int)
            p = np.array([b.ps(j) for j in range(n)], int)
            mask = self._mask(view, b, n)
            improvable = any(can_improve(self.table, int(view.type_idx[j]), int(w[j]), int(p[j]), cfg.pair,
                                         view.max_workers, view.max_ps) for j in range(n))
            if n == 0 or not mask[:-1].any() or not improvable:
                break  # a state of S': the void action is forced, nothing to learn from it
            state = encode_state(cfg, view.type_idx[:n], rem, w, p, backlog)
            allowed = mask.copy() if cfg.mask_invalid else np.ones_like(mask)
            allowed[cfg.void] = mask[cfg.void]
            a = self._choose(state, allowed)
            if self.record:
                self.trajectory.states.append(state)
                self.trajectory.masks.append(allowed)
                self.trajectory.actions.append(a)
            if a == cfg.void:
                break
            j, kind = decode_action(cfg, a)
            if not mask[a]:  # only reachable with mask_invalid=False: a no-op, punished (r_t2)
                self.trajectory.penalty -= cfg.p1
                continue
            b.add(j, kind)
            if not cfg.pair:
                self.trajectory.penalty += r3_change(w[j], p[j], b.workers(j), b.ps(j), cfg.p2)
        return b

    def __call__(self, view: SlotView) -> Allocation:
        n = min(self.cfg.num_jobs, len(view))
        key = tuple(int(x) for x in view.jobs[:n])
        idle = bool(np.allclose(view.free, view.capacity))
        if key != self._key or not idle:
            b = self.decide(view)
            self._key = key if idle else None
            self._servers = {int(view.jobs[j]): (tuple(b.worker_servers[j]), tuple(b.ps_servers[j]))
                             for j in range(n)}
        ws = tuple(self._servers.get(int(job), ((), ()))[0] for job in view.jobs)
        ps = tuple(self._servers.get(int(job), ((), ()))[1] for job in view.jobs)
        return Allocation(np.array([len(s) for s in ws], int), np.array([len(s) for s in ps], int), ws, ps)


# ---------------------------------------------------------------- episodes and training

@dataclass
class Episode:
    ret: float  # R(x) = sum of r_t1 + r_t2 + r_t3
    avg_jct: float  # slots
    states: np.ndarray
    masks: np.ndarray
    actions: np.ndarray


def run_episode(cfg: ChicConfig, params: dict, trace: Trace, sim: SimConfig, mode: str, seed: int,
                record: bool = True) -> Episode:
    """One simulated trace. A policy that has not finished the trace after `sim.max_slots` slots scores as if
    every job had been in the system all that time (JCT = max_slots each)."""
    sched = ChicScheduler(cfg, params, mode=mode, seed=seed, record=record)
    try:
        jct = run(trace, sched, sim, seed=seed).jct_slots
    except RuntimeError as e:
        if "did not finish" not in str(e):
            raise
        jct = np.full(len(trace), float(sim.max_slots))
    s, m, a = sched.trajectory.arrays(cfg)
    return Episode(-float(np.sum(jct)) + sched.trajectory.penalty, float(np.mean(jct)), s, m, a)


def evaluate(cfg: ChicConfig, params: dict, traces: Sequence[Trace], sim: SimConfig, seed: int = 0) -> float:
    """Mean over traces of the greedy policy's average JCT (slots)."""
    return float(np.mean([run_episode(cfg, params, t, sim, GREEDY, seed + i, record=False).avg_jct
                          for i, t in enumerate(traces)]))


@dataclass
class IterationLog:
    iteration: int
    xi: float
    mean_return: float
    max_return: float
    uniform_return: float | None
    elites: int
    fit_loss: float | None
    val_jct: float | None
    seconds: float


@dataclass
class TrainResult:
    cfg: ChicConfig
    params: dict  # the best on validation (or the last, without validation)
    last_params: dict
    history: list[IterationLog]
    best_val_jct: float | None


def train(cfg: ChicConfig, train_traces: Sequence[Trace], sim: SimConfig, iterations: int,
          val_traces: Sequence[Trace] = (), val_every: int = 2, seed: int = 0, params: dict | None = None,
          on_episode: Callable[[int, int], None] | None = None,
          on_iteration: Callable[[IterationLog], None] | None = None) -> TrainResult:
    """Algorithm 1 (or the Gaussian variant). `on_episode(done, total)` ticks per episode of an iteration."""
    import time

    if not train_traces:
        raise ValueError("no training traces")
    rng = np.random.default_rng(seed)
    theta = init_params(cfg, seed) if params is None else {k: np.asarray(v, float) for k, v in params.items()}
    sigma = np.full(flatten(theta).shape, cfg.sigma0)
    best, best_val, history = theta, None, []
    total = cfg.episodes + (1 if cfg.uniform_episode and cfg.method == "trajectory" else 0)
    for k in range(1, iterations + 1):
        t0 = time.perf_counter()
        common = int(rng.integers(len(train_traces)))
        eps, samples = [], []
        for n in range(total):
            tr = train_traces[common if cfg.common_trace else int(rng.integers(len(train_traces)))]
            ep_seed = int(rng.integers(2**31))
            if cfg.method == "gaussian":
                vec = flatten(theta) + sigma * rng.standard_normal(sigma.shape)
                samples.append(vec)
                eps.append(run_episode(cfg, unflatten(vec, theta), tr, sim, GREEDY, ep_seed, record=False))
            else:
                mode = UNIFORM if n == cfg.episodes else SAMPLE
                eps.append(run_episode(cfg, theta, tr, sim, mode, ep_seed))
            if on_episode:
                on_episode(n + 1, total)
        rets = np.array([e.ret for e in eps])
        loss = None
        if cfg.method == "gaussian":
            mu, sigma = gaussian_cem_update(flatten(theta), sigma, np.array(samples), rets, cfg.rho, cfg.alpha,
                                            cfg.noise_floor)
            theta = unflatten(mu, theta)
            xi = float(np.sort(rets)[::-1][max(1, int(math.ceil(cfg.rho * len(rets) - 1e-9))) - 1])
            elite = rets >= xi
        else:
            xi = elite_threshold(rets, cfg.rho, cfg.episodes)
            elite = elite_mask(rets, xi)
            sel = [e for e, ok in zip(eps, elite) if ok and len(e.actions)]
            if sel:
                hat, losses = fit_elites(cfg, theta, np.concatenate([e.states for e in sel]),
                                         np.concatenate([e.masks for e in sel]),
                                         np.concatenate([e.actions for e in sel]), seed=int(rng.integers(2**31)))
                theta = smooth(hat, theta, cfg.alpha)
                loss = losses[-1] if losses else None
        val = None
        if val_traces and (k % val_every == 0 or k == iterations):
            val = evaluate(cfg, theta, val_traces, sim, seed=seed)
            if best_val is None or val < best_val:
                best, best_val = {kk: v.copy() for kk, v in theta.items()}, val
        log = IterationLog(k, float(xi), float(rets[: cfg.episodes].mean()), float(rets.max()),
                           float(rets[-1]) if total > cfg.episodes else None, int(elite.sum()), loss, val,
                           time.perf_counter() - t0)
        history.append(log)
        if on_iteration:
            on_iteration(log)
    return TrainResult(cfg, best if val_traces else theta, theta, history, best_val)


# ---------------------------------------------------------------- checkpoints

FORMAT = "dl2d-chic"
VERSION = 1


class ChicCheckpointError(RuntimeError):
    pass


def save_checkpoint(path: str | Path, cfg: ChicConfig, params: dict, meta: dict | None = None) -> None:
    """An .npz: format, version, config (JSON), meta (JSON) and the arrays as param/<name>; written atomically."""
    path = Path(path)
    arrays = {f"param/{k}": np.asarray(v, float) for k, v in params.items()}
    tmp = path.with_name(path.name + ".tmp.npz")
    with open(tmp, "wb") as f:
        np.savez(f, format=np.array(FORMAT), version=np.array(VERSION), config=np.array(json.dumps(cfg.to_dict())),
                 meta=np.array(json.dumps(meta or {})), **arrays)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> tuple[ChicConfig, dict, dict]:
    """(config, params, meta); ChicCheckpointError on anything that is not a matching Chic checkpoint."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            doc = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise ChicCheckpointError(f"{path}: no such checkpoint") from None
    except Exception as e:  # zipfile/np errors on garbage
        raise ChicCheckpointError(f"{path}: not a Chic checkpoint (unreadable: {type(e).__name__})") from None
    if "format" not in doc or str(doc["format"]) != FORMAT:
        raise ChicCheckpointError(f"{path}: not a Chic checkpoint (format is not {FORMAT!r})")
    if "version" not in doc or int(doc["version"]) != VERSION:
        raise ChicCheckpointError(f"{path}: Chic checkpoint version {doc.get('version')} not supported "
                                  f"(this dl2d reads {VERSION})")
    try:
        cfg = ChicConfig.from_dict(json.loads(str(doc["config"])))
        meta = json.loads(str(doc.get("meta", "{}")))
    except (KeyError, TypeError, ValueError) as e:
        raise ChicCheckpointError(f"{path}: bad Chic config: {e}") from None
    template = init_params(cfg)
    params = {}
    for k, v in template.items():
        if f"param/{k}" not in doc:
            raise ChicCheckpointError(f"{path}: parameter {k} missing")
        a = doc[f"param/{k}"]
        if a.shape != v.shape:
            raise ChicCheckpointError(f"{path}: parameter {k} has shape {a.shape}, the config needs {v.shape}")
        params[k] = a.astype(float)
    extra = sorted(k for k in doc if k.startswith("param/") and k[6:] not in template)
    if extra:
        raise ChicCheckpointError(f"{path}: unexpected parameters {extra}")
    return cfg, params, meta


def load_scheduler(path: str | Path, name: str | None = None) -> ChicScheduler:
    cfg, params, _ = load_checkpoint(path)
    return ChicScheduler(cfg, params, GREEDY, name=name)
