"""A slow, independent NumPy reference of one window of the slot loop (`dl2d.policy.dl2.slot.run_window`).

Encoding, masking, placement and job-aware exploration are re-implemented here in float64 NumPy; the
network is evaluated with its full `apply` at every step (no incremental first layer). Randomness follows
the jitted loop exactly: per step `key, k_act, k_eps = split(key, 3)` and inverse-CDF sampling."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dl2d.policy.dl2.nets import masked_logits, policy_logits


def job_demands(win):
    """Each job's own (worker [J, 3], PS [J, 3]) demand, from the window's demand table."""
    row = np.asarray(win.demand_row)
    return np.asarray(win.demands_w, float)[row], np.asarray(win.demands_p, float)[row]


def features(cfg, win, w, u):
    t = np.asarray(win.type_idx)
    cap = np.asarray(win.capacity, float)
    total = cap.sum(axis=0)
    WD, PD = job_demands(win)
    used = w[:, None] * WD + u[:, None] * PD
    r = np.max(np.where(total > 0, used / np.where(total > 0, total, 1), 0.0), axis=1)
    f = np.zeros((cfg.max_jobs, cfg.features_per_job))
    L = cfg.job_dim
    if cfg.job_encoding == "type":
        f[np.arange(cfg.max_jobs), t] = 1.0
    else:
        f[:, :L] = np.asarray(win.job_info)
    f[:, L] = np.asarray(win.slots_run) / cfg.slots_scale
    f[:, L + 1] = np.asarray(win.remaining) / cfg.epochs_scale
    f[:, L + 2] = r * cfg.max_jobs
    f[:, L + 3] = w / cfg.max_workers
    f[:, L + 4] = u / cfg.max_ps
    return f * np.asarray(win.valid)[:, None]


def best_server(free, cap, demand):
    ok = np.all(free >= demand - 1e-6, axis=1)
    if not ok.any():
        return -1
    load = np.sum(np.where(cap > 0, 1.0 - free / np.where(cap > 0, cap, 1), 0.0), axis=1)
    return int(np.argmin(np.where(ok, load, np.inf)))


def place(free, cap, demands):
    """Place tasks one after the other (all or nothing); returns (new free, servers) or (free, None)."""
    free = free.copy()
    servers = []
    for d in demands:
        s = best_server(free, cap, d)
        if s < 0:
            return None, None
        free[s] -= d
        servers.append(s)
    return free, servers


def mask_of(cfg, win, w, u, free):
    cap = np.asarray(win.capacity, float)
    m = np.zeros(cfg.num_actions, bool)
    m[-1] = True
    WD, PD = job_demands(win)
    for j in range(cfg.max_jobs):
        if not bool(win.valid[j]):
            continue
        wd, pd = WD[j], PD[j]
        m[3 * j] = w[j] < cfg.max_workers and place(free, cap, [wd])[0] is not None
        m[3 * j + 1] = u[j] < cfg.max_ps and place(free, cap, [pd])[0] is not None
        m[3 * j + 2] = w[j] < cfg.max_workers and u[j] < cfg.max_ps and place(free, cap, [wd, pd])[0] is not None
    return m


def poor_fix(cfg, win, w, u, mask):
    for j in range(cfg.max_jobs):
        if not bool(win.valid[j]):
            continue
        if w[j] >= 2 and u[j] == 0:
            a = 3 * j + 1
        elif u[j] >= 2 and w[j] == 0:
            a = 3 * j
        elif w[j] > 0 and u[j] > 0 and (w[j] > cfg.poor_ratio * u[j] or u[j] > cfg.poor_ratio * w[j]):
            a = 3 * j + (1 if w[j] > u[j] else 0)
        else:
            continue
        if mask[a]:
            return a
    return None


def reference_window(cfg, params, key, win, mode, epsilon=0.0):
    """(actions, workers, ps, free, states, masks) of one window, step by step."""
    cap = np.asarray(win.capacity, float)
    free = np.asarray(win.free, float).copy()
    w, u = np.asarray(win.w0).astype(int).copy(), np.asarray(win.u0).astype(int).copy()
    WD, PD = job_demands(win)
    if cfg.starting_bundle:
        for j in range(cfg.max_jobs):
            if w[j] == 0 and u[j] == 0 and mask_of(cfg, win, w, u, free)[3 * j + 2]:
                free, _ = place(free, cap, [WD[j], PD[j]])
                w[j] += 1
                u[j] += 1
    A = cfg.num_actions
    actions, states, masks = [], [], []
    while len(actions) < cfg.max_steps:
        key, k_act, k_eps = jax.random.split(key, 3)
        x = features(cfg, win, w, u).reshape(-1)
        m = mask_of(cfg, win, w, u, free)
        logits = masked_logits(policy_logits(cfg, params, jnp.asarray(x, jnp.float32)[None])[0], jnp.asarray(m))
        if mode == "greedy":
            a = int(jnp.argmax(logits))
        else:
            cdf = jnp.cumsum(jax.nn.softmax(logits))
            a = min(int(jnp.sum(cdf < jax.random.uniform(k_act) * cdf[-1])), A - 1)
            fix = poor_fix(cfg, win, w, u, m)
            if fix is not None and float(jax.random.uniform(k_eps)) < epsilon:
                a = fix
        assert m[a], "the reference sampled a masked action"
        actions.append(a)
        states.append(x)
        masks.append(m)
        if a == A - 1:
            break
        j, kind = divmod(a, 3)
        demands = {0: [WD[j]], 1: [PD[j]], 2: [WD[j], PD[j]]}[kind]
        free, _ = place(free, cap, demands)
        w[j] += kind != 1
        u[j] += kind != 0
    return np.array(actions), w, u, free, np.array(states), np.array(masks)
