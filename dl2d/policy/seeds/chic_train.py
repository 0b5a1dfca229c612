"""Training Chic and Chic-Pair (dl2d.policy.seeds.chic) in the simulator: the cross-entropy method of the paper's
Algorithm 1 (eq. 9), the elite fit, episodes and validation. The scheduler itself, its state encoding and its
checkpoints live in dl2d.policy.seeds.chic, which the daemon loads without the simulator.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from dl2d.policy.seeds.chic import (
    GREEDY,
    SAMPLE,
    UNIFORM,
    ChicConfig,
    ChicScheduler,
    flatten,
    init_params,
    logits,
    masked_probs,
    num_layers,
    unflatten,
)
from dl2d.sim.engine import SimConfig, run
from dl2d.sim.trace import Trace

_FIT_CACHE: dict = {}


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


# ---------------------------------------------------------------- fitting the elites (JAX)

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
