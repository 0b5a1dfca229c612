"""One slot's allocation for a window of J jobs, in a single jitted `jax.lax.while_loop`.

Each iteration encodes the state (x, d, e, r, w, u), masks the 3J+1 actions by what fits on some server and by
per-job limits, picks an action (sampled by inverse CDF, greedy, or a teacher's), places the task(s) on the
least-loaded server that fits (the simulator's `Placer` rule) and updates w, u, r and the free resources.
It stops on the void action, which is the only one left once nothing fits. Action k means job k // 3 and
kind k % 3 (0 worker, 1 PS, 2 worker + PS); action 3J is void.

Every step's action and the servers it used are always recorded (the caller needs them to build the
allocation); the step's state and mask, which training needs and which dominate memory (T x state_dim, about
1.7 GB at J = 1000), only with `record=True`. The first layer of the policy network is
updated incrementally: only the acting job's features change in a step, so h = x W + b is patched with that
job's rows of W instead of recomputed. Likewise the fit checks and the least-loaded-server search: a step
changes at most two servers, so per block of ~sqrt(S) servers and demand row the loop keeps the block's
least-loaded fitting server and fit count (`FitCache`) and recomputes only the changed servers' blocks;
masks and placements are the same as a full scan's (ties to the lowest index).

All-reduce jobs (DL2 section 7) have no parameter servers: their PS and worker + PS actions are masked, their
starting task is a worker alone and their PS inputs stay zero.

Demand: every job asks for its own (worker, PS) demand (dl2d.core.contract.SlotView). A window keeps the
distinct demand pairs of its jobs as a small table (`Window.demands_w` / `demands_p`, L rows, padded with
rows that fit nowhere; L = 8 or the next power of two, so jit compiles for a few sizes only) and each job's
row in it (`Window.demand_row`): the fit checks work per row, not per job.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dl2d.policy.dl2.config import PolicyConfig
from dl2d.policy.dl2.job_info import NUM_SPEED_FEATURES

EPS = 1e-6
MIN_DEMAND_ROWS = 8  # demand rows of a window: at least this many, else the next power of two
NO_FIT = 1e30  # a padding demand row's amount of every resource: fits on no server

SAMPLE, GREEDY, TEACHER = "sample", "greedy", "teacher"


class Window(NamedTuple):
    """Up to J jobs (padded) and the cluster as they stand at the start of the window."""

    type_idx: jax.Array  # int32 [J], the job's model class (a feature)
    valid: jax.Array  # bool [J]
    slots_run: jax.Array  # f32 [J]
    remaining: jax.Array  # f32 [J], estimated remaining epochs
    w0: jax.Array  # int32 [J], workers already given this slot
    u0: jax.Array  # int32 [J]
    free: jax.Array  # f32 [S, 3]
    capacity: jax.Array  # f32 [S, 3]
    demand_row: jax.Array  # int32 [J]: the job's row of demands_w / demands_p
    demands_w: jax.Array  # f32 [L, 3]: a worker's demand per row
    demands_p: jax.Array  # f32 [L, 3]: a PS's demand per row
    allreduce: jax.Array  # bool [J]: an all-reduce job: no PS, so its PS and bundle actions are masked (DL2 s. 7)
    job_info: jax.Array  # f32 [J, NUM_SPEED_FEATURES]: what the job is (dl2d.policy.dl2.job_info), "speed" encoding


class SlotOut(NamedTuple):
    workers: jax.Array  # [J]
    ps: jax.Array
    free: jax.Array  # [S, 3] after this window
    n_steps: jax.Array
    states: jax.Array  # [T, state_dim]
    masks: jax.Array  # [T, A]
    actions: jax.Array  # [T]
    worker_server: jax.Array  # [T], -1 if the step placed no worker
    ps_server: jax.Array  # [T]
    explored: jax.Array  # [T] bool
    bundle_worker_server: jax.Array | None = None  # [J]: server of each job's starting worker, -1 if none
    bundle_ps_server: jax.Array | None = None  # [J]


def job_features(cfg: PolicyConfig, win: Window, w, u):
    """[J, F]: what the job is (one-hot type, or its speed features), slots run, remaining epochs, dominant
    share (x J), workers, PS; zero if padding."""
    total = win.capacity.sum(axis=0)
    inv = jnp.where(total > 0, 1.0 / jnp.where(total > 0, total, 1.0), 0.0)
    used = w[:, None] * win.demands_w[win.demand_row] + u[:, None] * win.demands_p[win.demand_row]
    r = jnp.max(used * inv, axis=1)
    cols = jnp.stack([
        win.slots_run / cfg.slots_scale, win.remaining / cfg.epochs_scale, r * cfg.max_jobs,
        w / cfg.max_workers, u / cfg.max_ps,
    ], axis=1)
    what = jax.nn.one_hot(win.type_idx, cfg.num_types) if cfg.job_encoding == "type" else win.job_info
    f = jnp.concatenate([what, cols], axis=1)
    return f * win.valid[:, None]


def encode(cfg: PolicyConfig, win: Window, w, u):
    return job_features(cfg, win, w, u).reshape(-1)


def server_load(free, capacity):
    """[..., S]: the sum of used fractions of each server's resources."""
    return jnp.sum(jnp.where(capacity > 0, 1.0 - free / jnp.where(capacity > 0, capacity, 1.0), 0.0), axis=-1)


def best_server(free, capacity, demand, load=None):
    """(least-loaded server that fits `demand`, whether any fits); ties go to the lowest index.

    `load` is ``server_load(free, capacity)`` when the caller has it already."""
    ok = jnp.all(free >= demand - EPS, axis=1)
    load = server_load(free, capacity) if load is None else load
    return jnp.argmin(jnp.where(ok, load, jnp.inf)), jnp.any(ok)


def row_fits(free, capacity, demands_w, demands_p, load=None):
    """Per demand row: does a worker fit, a PS, and a worker then a PS (placed one after the other)?

    The bundle test does not copy the cluster per row: after the worker goes to server s, a PS fits if it
    fits on another server (free unchanged there) or on s with what the worker left."""
    WD, PD = demands_w, demands_p
    load = server_load(free, capacity) if load is None else load
    fits_w = jnp.all(free[None] >= WD[:, None] - EPS, axis=2)  # [L, S]
    fits_p = jnp.all(free[None] >= PD[:, None] - EPS, axis=2)
    fw, fp = jnp.any(fits_w, axis=1), jnp.any(fits_p, axis=1)
    s = jnp.argmin(jnp.where(fits_w, load[None], jnp.inf), axis=1)  # [L]: where each row's worker goes
    rows = jnp.arange(WD.shape[0])
    elsewhere = jnp.sum(fits_p, axis=1) - fits_p[rows, s] > 0
    on_s = jnp.all(free[s] + (-WD) >= PD - EPS, axis=1)
    return fw, fp, fw & (elsewhere | on_s)


class FitCache(NamedTuple):
    """What the slot loop keeps of the cluster between steps, so that a step scans two blocks of servers
    instead of all of them. The servers (padded with ones that fit nothing) form B blocks of K; per demand
    row r (rows 0..L-1: a worker of demand row r, rows L..2L-1: a PS of demand row r - L) and block b: the load of the
    least-loaded server of the block where it fits (inf if none), that server, and on how many of the
    block's servers it fits. Every entry is a function of the block's free resources alone, so after a
    placement only the placed server's block is recomputed; the least-loaded fitting server of the cluster
    is the best of the B block bests (ties to the lowest index)."""

    load: jax.Array  # f32 [2L, B]
    server_count: jax.Array  # int32 [2, 2L, B]: the server, the count


def _block_size(num_servers: int) -> int:
    """K ~ sqrt(S): a step's work is two blocks of K servers plus the B = S / K block bests."""
    return max(8, int(np.ceil(np.sqrt(num_servers))))


def _pad_servers(free, capacity, K):
    """Pad the cluster to a multiple of K servers that fit nothing (free -1, capacity 0)."""
    S = free.shape[0]
    n = -S % K
    if n == 0:
        return free, capacity
    return (jnp.concatenate([free, jnp.full((n, 3), -1.0, free.dtype)]),
            jnp.concatenate([capacity, jnp.zeros((n, 3), capacity.dtype)]))


def _cache_rows(win: Window):
    """[2L, 3]: FitCache's rows, the workers' demands then the PS'."""
    return jnp.concatenate([win.demands_w, win.demands_p])


def _block_fits(free, capacity, start, demands):
    """(least-loaded load, [server, count]) per demand row over the servers `free` (one block [K, 3], or
    the whole cluster as [B, K, 3]; `start`: the index of each block's first server)."""
    load = server_load(free, capacity)  # [..., K]
    ok = jnp.all(free[..., None, :, :] >= demands[:, None] - EPS, axis=-1)  # [..., 2L, K]
    key = jnp.where(ok, load[..., None, :], jnp.inf)
    server = jnp.argmin(key, axis=-1).astype(jnp.int32) + start[..., None]
    return jnp.min(key, axis=-1), jnp.stack([server, jnp.sum(ok, axis=-1, dtype=jnp.int32)])


def _fit_cache(free_p, cap_p, K, demands) -> FitCache:
    B = free_p.shape[0] // K
    load, sc = _block_fits(free_p.reshape(B, K, 3), cap_p.reshape(B, K, 3), K * jnp.arange(B, dtype=jnp.int32),
                           demands)
    return FitCache(load.T, jnp.swapaxes(sc, 1, 2))  # blocks last


def _refresh(cache: FitCache, free_p, cap_p, s, K, demands) -> FitCache:
    """The cache after server s changed: its block recomputed."""
    b = s // K
    start = b * K
    load, sc = _block_fits(jax.lax.dynamic_slice_in_dim(free_p, start, K),
                           jax.lax.dynamic_slice_in_dim(cap_p, start, K), start, demands)
    return FitCache(cache.load.at[:, b].set(load), cache.server_count.at[:, :, b].set(sc))


def _cluster_best(load, server):
    """[R]: the least-loaded fitting server of the cluster per row, from the block bests (0 if none fits,
    as argmin over all-inf gives)."""
    b = jnp.argmin(load, axis=1)
    return jnp.take_along_axis(server, b[:, None], axis=1)[:, 0]


def cached_row_fits(win: Window, cache: FitCache, free_p):
    """`row_fits` from the cache: (fw, fp, fb, the server each row's worker would go to)."""
    WD, PD = win.demands_w, win.demands_p
    L = WD.shape[0]
    count = jnp.sum(cache.server_count[1], axis=1)  # [2L]
    fw, fp = count[:L] > 0, count[L:] > 0
    s = _cluster_best(cache.load[:L], cache.server_count[0, :L])
    row = free_p[s]  # [L, 3]
    p_on_s = jnp.all(row >= PD - EPS, axis=1)
    elsewhere = count[L:] - p_on_s > 0
    on_s = jnp.all(row + (-WD) >= PD - EPS, axis=1)
    return fw, fp, fw & (elsewhere | on_s), s


def _mask_from_fits(cfg: PolicyConfig, win: Window, w, u, fw, fp, fb):
    t = win.demand_row
    room_w, room_p = w < cfg.max_workers, (u < cfg.max_ps) & ~win.allreduce
    m = jnp.stack([win.valid & room_w & fw[t], win.valid & room_p & fp[t],
                   win.valid & room_w & room_p & fb[t]], axis=1)
    return jnp.concatenate([m.reshape(-1), jnp.array([True])])


def _cached_apply(cfg: PolicyConfig, win: Window, w, u, free_p, cap_p, cache: FitCache, worker_server, a, K):
    """`apply_action` on the padded cluster with the cache; `worker_server` [L] is where each row's worker
    goes (from `cached_row_fits`). Returns (w, u, free_p, cache, worker server or -1, PS server or -1)."""
    void = a == 3 * cfg.max_jobs
    j = jnp.minimum(a // 3, cfg.max_jobs - 1)
    kind = a % 3
    t = win.demand_row[j]
    add_w = ~void & (kind != 1)
    add_p = ~void & (kind != 0)
    rows = _cache_rows(win)
    sw = worker_server[t]
    free_p = free_p.at[sw].set(jnp.where(add_w, free_p[sw] + (-win.demands_w[t]), free_p[sw]))
    cache = _refresh(cache, free_p, cap_p, sw, K, rows)
    r = win.demands_w.shape[0] + t  # the PS row
    sp = _cluster_best(cache.load[r][None], cache.server_count[0, r][None])[0]
    free_p = free_p.at[sp].set(jnp.where(add_p, free_p[sp] + (-win.demands_p[t]), free_p[sp]))
    cache = _refresh(cache, free_p, cap_p, sp, K, rows)
    w = w.at[j].add(add_w.astype(w.dtype))
    u = u.at[j].add(add_p.astype(u.dtype))
    return w, u, free_p, cache, jnp.where(add_w, sw, -1), jnp.where(add_p, sp, -1)


def action_mask(cfg: PolicyConfig, win: Window, w, u, free, load=None):
    fw, fp, fb = row_fits(free, win.capacity, win.demands_w, win.demands_p, load)
    t = win.demand_row
    room_w, room_p = w < cfg.max_workers, (u < cfg.max_ps) & ~win.allreduce
    m = jnp.stack([win.valid & room_w & fw[t], win.valid & room_p & fp[t],
                   win.valid & room_w & room_p & fb[t]], axis=1)
    return jnp.concatenate([m.reshape(-1), jnp.array([True])])


def apply_action(cfg: PolicyConfig, win: Window, w, u, free, a, load=None):
    """Place the task(s) of action `a`; returns (w, u, free, worker server or -1, PS server or -1).

    `load` is ``server_load(free, win.capacity)`` when the caller has it already."""
    void = a == 3 * cfg.max_jobs
    j = jnp.minimum(a // 3, cfg.max_jobs - 1)
    kind = a % 3
    t = win.demand_row[j]
    wd, pd = win.demands_w[t], win.demands_p[t]
    add_w = ~void & (kind != 1)
    add_p = ~void & (kind != 0)
    sw, _ = best_server(free, win.capacity, wd, load)
    free = jnp.where(add_w, free.at[sw].add(-wd), free)
    sp, _ = best_server(free, win.capacity, pd)
    free = jnp.where(add_p, free.at[sp].add(-pd), free)
    w = w.at[j].add(add_w.astype(w.dtype))
    u = u.at[j].add(add_p.astype(u.dtype))
    return w, u, free, jnp.where(add_w, sw, -1), jnp.where(add_p, sp, -1)


def poor_state_action(cfg: PolicyConfig, win: Window, w, u, mask):
    """DL2's job-aware exploration: the fix for the first job in a poor state, and whether there is one.

    Poor: several workers but no PS (add a PS), several PS but no worker (add a worker), or w/u or u/w above
    the threshold (add the scarcer one); `cfg.poor_skew` picks which of the two skews count."""
    wf, uf = w.astype(jnp.float32), u.astype(jnp.float32)
    no_ps = (w >= 2) & (u == 0)
    no_w = (u >= 2) & (w == 0)
    skew_w, skew_u = wf > cfg.poor_ratio * uf, uf > cfg.poor_ratio * wf
    if cfg.poor_skew == "workers":
        skew_u = jnp.zeros_like(skew_u)
    elif cfg.poor_skew == "none":
        skew_w = skew_u = jnp.zeros_like(skew_u)
    skew = (w > 0) & (u > 0) & (skew_w | skew_u)
    kind = jnp.where(no_ps, 1, jnp.where(no_w, 0, jnp.where(wf > uf, 1, 0)))
    action = 3 * jnp.arange(cfg.max_jobs) + kind
    poor = win.valid & ~win.allreduce & (no_ps | no_w | skew) & mask[action]
    j = jnp.argmax(poor)
    return action[j], jnp.any(poor)


def teacher_action(cfg: PolicyConfig, w, u, mask, target_w, target_u):
    """Replays a heuristic's allocation as actions: the job furthest behind its target gets a bundle (or the
    one task it still lacks); void once every target is met or nothing more fits."""
    need_w, need_u = w < target_w, u < target_u
    kind = jnp.where(need_w & need_u, 2, jnp.where(need_w, 0, 1))
    action = 3 * jnp.arange(cfg.max_jobs) + kind
    ok = (need_w | need_u) & mask[action]
    order = jnp.where(ok, (w + u) * cfg.max_jobs + jnp.arange(cfg.max_jobs), jnp.iinfo(jnp.int32).max)
    j = jnp.argmin(order)
    return jnp.where(jnp.any(ok), action[j], 3 * cfg.max_jobs)


def starting_bundles(cfg: PolicyConfig, win: Window):
    """One worker + one PS (an all-reduce job: one worker) for each job without one, in window order, where it
    fits."""
    K = _block_size(win.free.shape[0])
    free_p, cap_p = _pad_servers(win.free, win.capacity, K)
    w, u, free_p, _, _, _ = _starting_bundles(cfg, win, free_p, cap_p, _fit_cache(free_p, cap_p, K, _cache_rows(win)),
                                              K)
    return w, u, free_p[: win.free.shape[0]]


def _starting_bundles(cfg: PolicyConfig, win: Window, free_p, cap_p, cache: FitCache, K):
    """(w, u, padded free, cache, server of each job's starting worker or -1, of its PS or -1)."""

    def body(j, carry):
        w, u, free_p, cache, bw, bp = carry
        fw, _, fb, worker_server = cached_row_fits(win, cache, free_p)
        ar = win.allreduce[j]
        fits = win.valid[j] & (w[j] < cfg.max_workers) & jnp.where(
            ar, fw[win.demand_row[j]], (u[j] < cfg.max_ps) & fb[win.demand_row[j]])
        a = jnp.where((w[j] == 0) & (u[j] == 0) & fits, 3 * j + jnp.where(ar, 0, 2), 3 * cfg.max_jobs)
        w, u, free_p, cache, sw, sp = _cached_apply(cfg, win, w, u, free_p, cap_p, cache, worker_server, a, K)
        return w, u, free_p, cache, bw.at[j].set(sw), bp.at[j].set(sp)

    none = jnp.full(cfg.max_jobs, -1, jnp.int32)
    return jax.lax.fori_loop(0, cfg.max_jobs, body, (win.w0, win.u0, free_p, cache, none, none))


@partial(jax.jit, static_argnames=("cfg", "mode", "record"))
def run_window(cfg: PolicyConfig, params, key, win: Window, mode: str = SAMPLE, epsilon=0.0,
               target_w=None, target_u=None, record: bool = True) -> SlotOut:
    from dl2d.policy.dl2.nets import masked_logits

    J, F, A = cfg.max_jobs, cfg.features_per_job, cfg.num_actions
    T = cfg.max_steps
    TS = T if record else 1  # rows of the state / mask records
    pol = params["policy"]
    W1, b1 = pol["in"]["kernel"], pol["in"]["bias"]
    W1_jobs = W1.reshape(J, F, -1)

    def head(h1):
        h = jax.nn.relu(jax.nn.relu(h1) @ pol["mid"]["kernel"] + pol["mid"]["bias"])
        return h @ pol["out"]["kernel"] + pol["out"]["bias"]

    S = win.free.shape[0]
    K = _block_size(S)
    free, cap_p = _pad_servers(win.free, win.capacity, K)
    cache = _fit_cache(free, cap_p, K, _cache_rows(win))
    if cfg.starting_bundle:
        w, u, free, cache, bundle_w, bundle_p = _starting_bundles(cfg, win, free, cap_p, cache, K)
    else:
        w, u = win.w0, win.u0
        bundle_w = bundle_p = jnp.full(J, -1, jnp.int32)
    if target_w is None:
        target_w = target_u = jnp.zeros(J, jnp.int32)
    feats = job_features(cfg, win, w, u)
    h1 = feats.reshape(-1) @ W1 + b1

    rec = (jnp.zeros((TS, cfg.state_dim)), jnp.zeros((TS, A), bool), jnp.zeros(T, jnp.int32),
           jnp.full(T, -1, jnp.int32), jnp.full(T, -1, jnp.int32), jnp.zeros(T, bool))

    def cond(c):
        return ~c["done"] & (c["t"] < cfg.max_steps)

    def body(c):
        w, u, free, cache, feats, h1 = c["w"], c["u"], c["free"], c["cache"], c["feats"], c["h1"]
        fw, fp, fb, worker_server = cached_row_fits(win, cache, free)
        mask = _mask_from_fits(cfg, win, w, u, fw, fp, fb)
        logits = masked_logits(head(h1), mask)
        key = c["key"]  # split only where sampled
        if mode == TEACHER:
            a = teacher_action(cfg, w, u, mask, target_w, target_u)
            explored = jnp.array(False)
        elif mode == GREEDY:
            a = jnp.argmax(logits)
            explored = jnp.array(False)
        else:
            key, k_act, k_eps = jax.random.split(c["key"], 3)
            cdf = jnp.cumsum(jax.nn.softmax(logits))
            a = jnp.minimum(jnp.sum(cdf < jax.random.uniform(k_act) * cdf[-1]), A - 1)
            fix, poor = poor_state_action(cfg, win, w, u, mask)
            explored = poor & (jax.random.uniform(k_eps) < epsilon)
            a = jnp.where(explored, fix, a)
        a = a.astype(jnp.int32)
        w2, u2, free2, cache, sw, sp = _cached_apply(cfg, win, w, u, free, cap_p, cache, worker_server, a, K)
        j = jnp.minimum(a // 3, J - 1)
        new_f = job_features(cfg, win, w2, u2)[j]
        h1 = h1 + (new_f - feats[j]) @ W1_jobs[j]
        feats = feats.at[j].set(new_f)
        states, masks, acts, sws, sps, exps = c["rec"]
        i = jnp.minimum(c["t"], T - 1)
        if record:
            states, masks = states.at[i].set(c["feats"].reshape(-1)), masks.at[i].set(mask)
        rec = (states, masks, acts.at[i].set(a), sws.at[i].set(sw), sps.at[i].set(sp), exps.at[i].set(explored))
        return {"t": c["t"] + 1, "key": key, "w": w2, "u": u2, "free": free2, "cache": cache, "feats": feats, "h1": h1,
                "done": a == A - 1, "rec": rec}

    c0 = {"t": jnp.int32(0), "key": key, "w": w, "u": u, "free": free, "cache": cache, "feats": feats, "h1": h1,
          "done": jnp.array(False), "rec": rec}
    c = jax.lax.while_loop(cond, body, c0)
    return SlotOut(c["w"], c["u"], c["free"][:S], c["t"], *c["rec"], bundle_w, bundle_p)


def demand_table(worker_demand, ps_demand) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each job's row, workers' demand rows [L, 3], PS' demand rows [L, 3]): the distinct (worker, PS) demand
    pairs of the jobs, in order of first appearance, padded to L rows that fit nowhere."""
    pairs = np.concatenate([np.asarray(worker_demand, np.float32).reshape(-1, 3),
                            np.asarray(ps_demand, np.float32).reshape(-1, 3)], axis=1)
    rows: dict[bytes, int] = {}
    job_row = np.array([rows.setdefault(p.tobytes(), len(rows)) for p in pairs], np.int32)
    n = max(len(rows), 1)
    L = MIN_DEMAND_ROWS if n <= MIN_DEMAND_ROWS else 1 << (n - 1).bit_length()
    table = np.full((L, 6), NO_FIT, np.float32)
    for key, r in rows.items():
        table[r] = np.frombuffer(key, np.float32)
    return job_row, table[:, :3].copy(), table[:, 3:].copy()


def pad_window(cfg: PolicyConfig, type_idx, slots_run, remaining, free, capacity, w0=None, u0=None, *,
               worker_demand, ps_demand, allreduce=None, job_info=None) -> Window:
    """A Window from NumPy arrays of up to J jobs (padding the rest); `worker_demand` / `ps_demand` [n, 3]
    are the jobs' own per-task demands, `allreduce` [n] marks the jobs without PS (default: none),
    `job_info` [n, NUM_SPEED_FEATURES] their speed features (dl2d.policy.dl2.job_info; default zeros)."""
    n = len(type_idx)
    if n > cfg.max_jobs:
        raise ValueError(f"{n} jobs in a window of {cfg.max_jobs}")
    J = cfg.max_jobs

    def pad(x, dtype):
        out = np.zeros(J, dtype)
        out[:n] = x
        return out

    zeros = np.zeros(n)
    info = np.zeros((J, NUM_SPEED_FEATURES), np.float32)
    if job_info is not None:
        info[:n] = job_info
    job_row, demands_w, demands_p = demand_table(worker_demand, ps_demand)
    return Window(*jax.device_put((  # one transfer call for all the arrays
        pad(type_idx, np.int32), np.arange(J) < n, pad(slots_run, np.float32), pad(remaining, np.float32),
        pad(zeros if w0 is None else w0, np.int32), pad(zeros if u0 is None else u0, np.int32),
        np.asarray(free, np.float32), np.asarray(capacity, np.float32),
        pad(job_row, np.int32), demands_w, demands_p, pad(zeros if allreduce is None else allreduce, bool),
        info,
    )))
