"""Slot-level PPO for the target-size policy (dl2d.policy.target.policy) on the simulator's JAX environment.

A slot's decision is every active job's (workers, PS) pair. A rollout is `jax.lax.scan` over slots inside
`jax.vmap` over clusters (each its own trace and noise, auto-reset), GAE advantages, then clipped-PPO epochs over
shuffled minibatches: an iteration is two jitted functions (purejaxrl's shape, ``train_step(runner_state) ->
(runner_state, metrics)``, cut in two so that the update runs on the active jobs' rows only, packed on the
host between them: :func:`pack`).

The reward is the average JCT's own: minus the job-slots spent active (each job that finishes counts the
fraction of the slot it needed), over ``max_jobs``. Summed over an episode it is minus the total JCT in slots
over J, so maximising it minimises the average JCT (DL2's eq. 1 rewards epochs trained, which a policy can
raise by favouring fast jobs without finishing any). It is a sum over jobs, so it is credited two ways
(``PPOConfig.credit``): "slot", the slot's allocation as one action (its log-probability the sum over the
jobs) against the slot's advantage; or "job", each job's pair against that job's own advantage (its own slots,
its own value: far less variance, but a job is not charged for what its size costs the others, which
``team_weight`` adds back in part).

Supervised warm-up (:func:`sl_step`): cross-entropy towards a heuristic's allocation (``TargetConfig.teacher``:
Optimus's or elastic's, dl2d.policy.target.teachers) on the states the current policy visits, the value fitted beside.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dl2d.policy.target import policy as T
from dl2d.sim import jaxenv as X
from dl2d.workload.catalog import NUM_DL2_TYPES, speed_estimate


@dataclass(frozen=True)
class PPOConfig:
    clusters: int = 64  # parallel environments
    slots: int = 32  # slots per rollout
    epochs: int = 4
    minibatches: int = 4
    lr: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    #: "job": each job's action is credited with its own reward (its slots spent active) against its own value
    #: (independent per-job advantages: low variance, blind to what a job's size does to the others'); "slot":
    #: the whole slot's allocation is one action, its log-probability the sum over the jobs, one advantage
    credit: str = "job"
    #: credit "job": how much of the slot's advantage (the team's) each job's own advantage gets beside it, so a
    #: job that takes what others needed is not credited as if it had cost nothing
    team_weight: float = 0.0
    #: the policy samples from softmax(logits / temperature) (and learns that distribution): below 1 it explores
    #: less, which matters where every change of a job's size is a restart (learning online, dl2d.policy.target.online)
    temperature: float = 1.0

    def __post_init__(self):
        if self.credit not in ("job", "slot"):
            raise ValueError(f"credit must be 'job' or 'slot', got {self.credit!r}")
        if not 0 < self.temperature <= 10:
            raise ValueError(f"temperature must be in (0, 10], got {self.temperature}")


# ------------------------------------------------------------------------------------------ the environment's side

@functools.lru_cache(maxsize=16)
def _ps_estimate(max_ps: int, max_workers: int) -> np.ndarray:
    """[8, max_ps + 1, max_workers + 1] what a scheduler believes of each DL2 type's speed in epochs/s
    (dl2d.workload.catalog.speed_estimate: the parametric table, not the environment's measured truth)."""
    return speed_estimate(np.arange(NUM_DL2_TYPES), np.zeros(NUM_DL2_TYPES), max_ps, max_workers, 1.0)


def speed_belief(params: X.EnvParams, state: X.EnvState) -> jnp.ndarray:
    """[J, P + 1, W + 1] what the scheduler believes of every job's speed (epochs/s), as a SlotView's
    ``est_speed``: the parametric table for a PS job, the packed placement's rate in row 0 for an all-reduce job."""
    jobs = state.jobs
    est = jnp.asarray(_ps_estimate(params.max_ps, params.max_workers), params.speed_table.dtype)
    speed = est[jnp.minimum(jobs.type_idx, NUM_DL2_TYPES - 1)]
    if not params.has_allreduce:
        return speed
    row0 = jnp.where(jobs.allreduce[:, None], jobs.packed_rate, speed[:, 0, :])  # computed with the trace's arrays
    speed = jnp.where(jobs.allreduce[:, None, None], 0.0, speed)
    return speed.at[:, 0, :].set(row0)


def env_obs(tcfg: T.TargetConfig, params: X.EnvParams, state: X.EnvState) -> dict:
    """:func:`dl2d.policy.target.policy.job_features`'s arrays from an environment state, and the fill's. The speeds
    are what the scheduler believes (:func:`speed_belief`: a PS job with k workers and k PS at level k, an
    all-reduce job packed on the fewest servers; no interference, no noise), never the environment's truth."""
    jobs = state.jobs
    bundle = jobs.worker_demand + jnp.where(jobs.allreduce[:, None], 0.0, jobs.ps_demand)  # one worker, one PS
    speed = speed_belief(params, state)
    lv = jnp.asarray(tcfg.levels, jnp.int32)
    curves = speed[:, jnp.minimum(lv, params.max_ps), jnp.minimum(lv, params.max_workers)]
    curves = jnp.where(jobs.allreduce[:, None], speed[:, 0, jnp.minimum(lv, params.max_workers)], curves)
    ps_curves = speed[:, jnp.minimum(jnp.asarray(tcfg.ps_levels, jnp.int32), params.max_ps),
                      jnp.minimum(1, params.max_workers)]
    f = curves.dtype
    obs = {"active": X.active(state), "remaining_epochs": jnp.maximum(jobs.est_epochs - state.epochs_done, 0.0),
           "slots_run": state.slots_run.astype(f), "age": jnp.maximum(state.slot - jobs.arrival_slot, 0).astype(f),
           "prev_workers": state.workers.astype(f),
           "worker_gpus": bundle[:, 0] / jnp.maximum(params.server_capacity[0], 1.0), "allreduce": jobs.allreduce,
           "curves": curves, "ps_curves": jnp.where(jobs.allreduce[:, None], curves[:, 1:2], ps_curves),
           "slot_seconds": params.slot_seconds, "capacity_gpus": params.server_capacity[0] * params.num_servers,
           "bundle": bundle, "worker_demand": jobs.worker_demand, "ps_demand": jobs.ps_demand,
           "capacity": params.server_capacity * params.num_servers, "speed": speed,
           "arrival_slot": jobs.arrival_slot, "job_speed_factor": X.measured_speed_factor(state.speed_factors)}
    return T.with_optimus(obs)


def allocate(tcfg: T.TargetConfig, obs: dict, action) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(workers, ps) [J] of the chosen actions after the fill (shortest remaining work at one worker first)."""
    target_w, target_p = T.sizes(tcfg, action, obs["allreduce"], obs["bundle"].dtype)
    one = jnp.maximum(obs["curves"][:, 1], 1e-12)
    w, p = T.fill(tcfg, target_w, target_p, obs["active"], obs["worker_demand"], obs["ps_demand"], obs["capacity"],
                  obs["remaining_epochs"] / one)
    return w.astype(jnp.int32), p.astype(jnp.int32)


def job_rewards(state: X.EnvState, nxt: X.EnvState, max_jobs: int) -> jnp.ndarray:
    """[J] minus the slot each job spent active, over J (a job that finished counts the part it needed); their
    sum over an episode is minus the average JCT in slots."""
    act = X.active(state)
    ended = act & nxt.finished & ~state.finished
    part = jnp.where(ended, jnp.clip(nxt.finish_time - state.slot, 0.0, 1.0), 1.0)
    return -jnp.where(act, part, 0.0) / max_jobs


def job_log_probs(logits, action):
    """[J] each job's chosen pair's log-probability."""
    return T.chosen(jax.nn.log_softmax(logits), action)


def log_prob(logits, action, active):
    """The slot's log-probability: the sum over the active jobs."""
    return jnp.sum(jnp.where(active, job_log_probs(logits, action), 0.0))


# ------------------------------------------------------------------------------------------ rollout

def rollout(tcfg: T.TargetConfig, pcfg: PPOConfig, env: X.EnvParams, net, states, key):
    """``pcfg.slots`` slots of every cluster (``states``: a batch): (final states, transitions [T, N, ...])."""

    def act(state, obs, x, logits, value, key_):
        idx = T.sample(key_, logits)
        w, p = allocate(tcfg, obs, idx)
        nxt, _, done, _ = X.step(env, state, w, p)
        r = job_rewards(state, nxt, env.max_jobs)  # from the finished episode's state, before the reset
        nxt, episode_jct = X.autoreset(env, nxt, done)
        return nxt, {"x": x, "active": obs["active"], "idx": idx, "logp": job_log_probs(logits, idx),
                     "value": value, "reward": r, "done": done, "episode_jct": episode_jct,
                     "allreduce": obs["allreduce"], "teacher": T.features_teacher(tcfg, x)}

    def one_slot(carry, _):
        s, k = carry
        k, k_act = jax.random.split(k)
        obs, x = jax.vmap(lambda state: _observe(tcfg, env, state))(s)
        logits, value = T.apply(tcfg, net, x, obs["active"], obs["allreduce"])  # every cluster's jobs at once
        s, tr = jax.vmap(act)(s, obs, x, logits / pcfg.temperature, value, jax.random.split(k_act, pcfg.clusters))
        return (s, k), tr

    (states, _), traj = jax.lax.scan(one_slot, (states, key), None, length=pcfg.slots)
    return states, traj


def gae(pcfg: PPOConfig, rewards, values, dones, last_value):
    """GAE(λ) advantages and returns, [T, N, ...] (per job: [T, N, J]); ``dones[t]`` [T, N]: the episode ended at
    slot t (no bootstrap)."""
    d = dones.astype(rewards.dtype).reshape(dones.shape + (1,) * (rewards.ndim - dones.ndim))

    def body(carry, x):
        adv, next_v = carry
        r, v, d = x
        nonterm = 1.0 - d
        delta = r + pcfg.gamma * next_v * nonterm - v
        adv = delta + pcfg.gamma * pcfg.gae_lambda * nonterm * adv
        return (adv, v), adv

    _, adv = jax.lax.scan(body, (jnp.zeros_like(last_value), last_value), (rewards, values, d), reverse=True)
    return adv, adv + values


# ------------------------------------------------------------------------------------------ updates

def masked_mean(x, mask):
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def _slot_sum(x, mb):
    """[S] the sum of row values ``x`` [R] over each of the minibatch's slots."""
    return jax.ops.segment_sum(x, mb["slot"], num_segments=mb["slots"].shape[0])


def _forward(tcfg: T.TargetConfig, net, mb):
    return T.apply_rows(tcfg, net, mb["x"], mb["active"], mb["allreduce"], mb["slot"], mb["slots"].shape[0])


def ppo_loss(tcfg: T.TargetConfig, pcfg: PPOConfig, net, mb):
    """Clipped PPO on a minibatch of packed rows (:func:`pack`): per job (``credit`` "job": each active job's
    ratio against its own advantage) or per slot (the slot's ratio, the product over its jobs, against the
    slot's advantage); the per-job values against their returns; entropy per job, averaged in each slot."""
    logits, values = _forward(tcfg, net, mb)
    log_pi = jax.nn.log_softmax(logits / pcfg.temperature)  # once, for the ratio and the entropy
    act = mb["active"]
    learn = mb.get("learn", act)  # the jobs whose pairs are learned from (online: the policy's own, carried out)
    logp = T.chosen(log_pi, mb["idx"])
    if pcfg.credit == "job":
        ratio, adv, mask = jnp.exp(logp - mb["logp"]), mb["adv"], learn
    else:
        slot_logp = lambda lp: _slot_sum(jnp.where(act, lp, 0.0), mb)
        ratio, adv, mask = (jnp.exp(slot_logp(logp) - slot_logp(mb["logp"])), mb["adv"],
                            jnp.ones(mb["slots"].shape, bool))
    clipped = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - pcfg.clip, 1 + pcfg.clip) * adv)
    pg = -masked_mean(clipped, mask)
    vf = 0.5 * masked_mean((values - mb["ret"]) ** 2, act)
    h = -jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1)
    ent = jnp.mean(_slot_sum(jnp.where(learn, h, 0.0), mb) / jnp.maximum(_slot_sum(learn.astype(h.dtype), mb), 1))
    kl = masked_mean(mb["logp"] - logp, learn)
    return pg + pcfg.vf_coef * vf - pcfg.ent_coef * ent, {"pg": pg, "vf": vf, "entropy": ent, "approx_kl": kl}


def make_optimizer(pcfg: PPOConfig):
    return optax.chain(optax.clip_by_global_norm(pcfg.max_grad_norm), optax.adam(pcfg.lr, eps=1e-5))


def epoch_orders(pcfg: PPOConfig, key, n: int):
    """[epochs, minibatches, n // minibatches] the slots of every minibatch of every epoch: each epoch a
    shuffle of the ``n`` slots of the batch (a remainder left out)."""
    size = n // pcfg.minibatches
    return jax.vmap(lambda k: jax.random.permutation(k, n)[: size * pcfg.minibatches]
                    .reshape(pcfg.minibatches, size))(jax.random.split(key, pcfg.epochs))


def row_bucket(rows: int) -> int:
    """The packed minibatch size ``rows`` active jobs are padded to: the next power of two, at least 256. Each
    new size costs the update a compilation (about 3 s on 2 cores), so the grid is coarse: a run visits a few
    sizes, and the padding is under half of the rows."""
    return max(256, 1 << max(rows - 1, 0).bit_length())


def pack(active, orders) -> dict:
    """Where every minibatch's rows come from, its active jobs only (NumPy, on the host): for ``active`` [n, J]
    and :func:`epoch_orders` [E, M, S], {"row_slot", "row_job" (the batch's slot and job of each row), "slot"
    (the row's slot within its minibatch, S for a padding row), "valid"} [E, M, R] and "slots" [E, M, S], R the
    most active jobs of any minibatch rounded up by :func:`row_bucket`. Every loss reads a slot's active jobs
    only (the set network pools over them, the losses mask the rest), so it is the same update on fewer rows:
    once a policy finishes jobs, a slot has a few active jobs of J."""
    active, orders = np.asarray(active, bool), np.asarray(orders)
    E, M, S = orders.shape
    sel = active[orders]  # [E, M, S, J]
    counts = sel.sum(axis=(2, 3))
    R = row_bucket(int(counts.max(initial=0)))
    e, m, loc, job = np.nonzero(sel)  # row-major: each minibatch's rows in its slots' order, jobs in order
    start = np.concatenate([[0], np.cumsum(counts.ravel())[:-1]])
    pos = np.arange(len(e)) - start[e * M + m]
    plan = {"row_slot": np.zeros((E, M, R), np.int32), "row_job": np.zeros((E, M, R), np.int32),
            "slot": np.full((E, M, R), S, np.int32), "valid": np.zeros((E, M, R), bool)}
    plan["row_slot"][e, m, pos] = orders[e, m, loc]
    plan["row_job"][e, m, pos] = job
    plan["slot"][e, m, pos] = loc
    plan["valid"][e, m, pos] = True
    return {**plan, "slots": orders.astype(np.int32)}


def dense_plan(orders, jobs: int) -> dict:
    """:func:`pack`'s plan with every job of every slot a row (inactive ones masked), in JAX (traceable)."""
    E, M, S = orders.shape
    return {"row_slot": jnp.repeat(orders, jobs, axis=-1), "row_job": jnp.tile(jnp.arange(jobs), (E, M, S)),
            "slot": jnp.tile(jnp.repeat(jnp.arange(S), jobs), (E, M, 1)), "valid": jnp.ones((E, M, S * jobs), bool),
            "slots": orders}


def minibatch(batch: dict, plan: dict) -> dict:
    """One minibatch of packed rows: ``batch``'s per-job fields (leading axes: slots, jobs) at the plan's rows,
    its per-slot fields at the plan's slots, padding rows inactive; with the plan's "slot" and "slots"."""
    n, jobs = batch["active"].shape
    out = {}
    for k, v in batch.items():
        if v.ndim >= 2 and v.shape[:2] == (n, jobs):
            out[k] = v[plan["row_slot"], plan["row_job"]]
        elif v.ndim >= 1 and v.shape[0] == n:
            out[k] = v[plan["slots"]]
    out["active"] = out["active"] & plan["valid"]
    if "learn" in out:
        out["learn"] = out["learn"] & plan["valid"]
    return {**out, "slot": plan["slot"], "slots": plan["slots"]}


def minibatch_epochs(pcfg: PPOConfig, loss_fn, net, opt_state, batch, plan):
    """One optimizer step on ``loss_fn(net, minibatch) -> (loss, aux)`` for every minibatch of ``plan``
    (:func:`pack` or :func:`dense_plan`, [epochs, minibatches, ...]) in order: (net, opt_state, the (loss,
    aux) of every step, [epochs, minibatches])."""
    opt = make_optimizer(pcfg)

    def epoch(carry, plan_e):
        def step(carry, plan_m):
            net, opt_state = carry
            out, grads = jax.value_and_grad(loss_fn, has_aux=True)(net, minibatch(batch, plan_m))
            upd, opt_state = opt.update(grads, opt_state, net)
            return (optax.apply_updates(net, upd), opt_state), out

        return jax.lax.scan(step, carry, plan_e)

    (net, opt_state), outs = jax.lax.scan(epoch, (net, opt_state), plan)
    return net, opt_state, outs


def update(tcfg: T.TargetConfig, pcfg: PPOConfig, net, opt_state, batch, key=None, plan=None):
    """``pcfg.epochs`` passes of clipped PPO over ``batch`` (leading axes: slots, jobs) in shuffled minibatches:
    those of ``plan`` (:func:`pack`), or every row of the slots :func:`epoch_orders` draws from ``key``."""
    if plan is None:
        plan = dense_plan(epoch_orders(pcfg, key, batch["active"].shape[0]), batch["active"].shape[1])
    net, opt_state, (loss, aux) = minibatch_epochs(pcfg, lambda n, mb: ppo_loss(tcfg, pcfg, n, mb), net,
                                                   opt_state, batch, plan)
    return net, opt_state, jax.tree_util.tree_map(jnp.mean, {"loss": loss, **aux})


def _episode_stats(traj) -> dict:
    """How many episodes the rollout finished and their mean average JCT (0 when none)."""
    jcts = traj["episode_jct"]
    done = ~jnp.isnan(jcts)
    return {"episodes": done.sum(), "episode_jct": jnp.sum(jnp.where(done, jcts, 0.0)) / jnp.maximum(done.sum(), 1)}


def _flatten(traj):
    return jax.tree_util.tree_map(lambda a: a.reshape((-1, *a.shape[2:])), traj)


def _with_returns(tcfg: T.TargetConfig, pcfg: PPOConfig, env: X.EnvParams, net, states, traj):
    """The rollout's transitions, flat, with normalised GAE advantages (per job or per slot, as ``credit``
    says) and the per-job returns (the values' target)."""
    last = T.apply(tcfg, net, *jax.vmap(lambda s: _features(tcfg, env, s))(states))[1]
    adv, ret = gae(pcfg, traj["reward"], traj["value"], traj["done"], last)
    act = traj["active"]

    def normalised(a, mask):
        mean = masked_mean(a, mask)
        return jnp.where(mask, (a - mean) / (jnp.sqrt(masked_mean((a - mean) ** 2, mask)) + 1e-8), 0.0)

    if pcfg.credit == "slot" or pcfg.team_weight:
        team, _ = gae(pcfg, traj["reward"].sum(-1), traj["value"].sum(-1), traj["done"], last.sum(-1))
        team = normalised(team, jnp.ones(team.shape, bool))
    if pcfg.credit == "slot":
        adv = team
    else:
        adv = normalised(adv, act)
        if pcfg.team_weight:
            adv = jnp.where(act, adv + pcfg.team_weight * team[..., None], 0.0)
    return _flatten({**traj, "adv": adv, "ret": ret})


@partial(jax.jit, static_argnames=("tcfg", "pcfg"))
def collect(tcfg: T.TargetConfig, pcfg: PPOConfig, env: X.EnvParams, runner):
    """An iteration's rollout and its returns: (the runner after it, the flat batch, the update's minibatches
    (:func:`epoch_orders`), the rollout's statistics)."""
    net, opt_state, states, key = runner
    key, k_roll, k_upd = jax.random.split(key, 3)
    states, traj = rollout(tcfg, pcfg, env, net, states, k_roll)
    flat = _with_returns(tcfg, pcfg, env, net, states, traj)
    return ((net, opt_state, states, key), flat, epoch_orders(pcfg, k_upd, flat["active"].shape[0]),
            {"reward": traj["reward"].sum(-1).mean(), **_episode_stats(traj)})


@partial(jax.jit, static_argnames=("tcfg", "pcfg"))
def _ppo_update(tcfg: T.TargetConfig, pcfg: PPOConfig, net, opt_state, flat, plan):
    return update(tcfg, pcfg, net, opt_state, flat, plan=plan)


def train_step(tcfg: T.TargetConfig, pcfg: PPOConfig, env: X.EnvParams, runner):
    """One PPO iteration: rollout and GAE (one jitted function), then the update (another) on the active jobs'
    rows only (:func:`pack`). ``runner`` = (net, opt_state, states, key)."""
    (net, opt_state, states, key), flat, orders, stats = collect(tcfg, pcfg, env, runner)
    net, opt_state, upd = _ppo_update(tcfg, pcfg, net, opt_state, flat, pack(flat["active"], orders))
    return (net, opt_state, states, key), {**upd, **stats}


def _observe(tcfg, env, state):
    """(the policy's observation of a cluster, its job features)."""
    obs = env_obs(tcfg, env, state)
    return obs, T.job_features(tcfg, obs)


def _features(tcfg, env, state):
    obs, x = _observe(tcfg, env, state)
    return x, obs["active"], obs["allreduce"]


def sl_loss(tcfg: T.TargetConfig, pcfg: PPOConfig, net, mb):
    """Cross-entropy of the teacher's levels over the active jobs of a minibatch of packed rows (:func:`pack`),
    and the value's error on the returns (so that RL starts with a critic of the policy it starts from, not a
    random one that would undo the warm-up)."""
    logits, value = _forward(tcfg, net, mb)
    lp = jax.nn.log_softmax(logits)
    nll = -T.chosen(lp, mb["teacher"])
    act = mb["active"]
    acc = jnp.sum(act & (jnp.argmax(logits, -1) == mb["teacher"])) / jnp.maximum(act.sum(), 1)
    vf = 0.5 * masked_mean((value - mb["ret"]) ** 2, act)
    return masked_mean(nll, act) + pcfg.vf_coef * vf, acc


@partial(jax.jit, static_argnames=("tcfg", "pcfg"))
def _sl_update(tcfg: T.TargetConfig, pcfg: PPOConfig, net, opt_state, flat, plan):
    net, opt_state, (loss, acc) = minibatch_epochs(pcfg, lambda n, mb: sl_loss(tcfg, pcfg, n, mb), net, opt_state,
                                                   flat, plan)
    return net, opt_state, {"sl_loss": loss.mean(), "sl_acc": acc[-1].mean()}


def sl_step(tcfg: T.TargetConfig, pcfg: PPOConfig, env: X.EnvParams, runner):
    """One supervised warm-up iteration: a rollout of the current policy, then ``epochs`` x ``minibatches``
    gradient steps towards the teacher's levels on the states it visited (DAgger's on-policy states), the value
    fitted beside."""
    (net, opt_state, states, key), flat, orders, stats = collect(tcfg, pcfg, env, runner)
    net, opt_state, upd = _sl_update(tcfg, pcfg, net, opt_state, flat, pack(flat["active"], orders))
    return (net, opt_state, states, key), {**upd, "episodes": stats["episodes"], "episode_jct": stats["episode_jct"]}


def init_runner(tcfg: T.TargetConfig, pcfg: PPOConfig, states, key, net=None):
    """(net, opt_state, states, key) to start training from (``net``: warm-started parameters)."""
    k_net, key = jax.random.split(key)
    net = T.init_params(tcfg, k_net) if net is None else net
    return net, make_optimizer(pcfg).init(net), states, key


def _episodes(tcfg: T.TargetConfig, env: X.EnvParams, states, slots: int, choose):
    """Every cluster of ``states`` run ``slots`` slots without auto-reset (jaxenv.rollout) with the actions
    ``choose(obs)`` picks, through the fill: the final states."""
    def rule(params, s):
        obs = env_obs(tcfg, params, s)
        return (*allocate(tcfg, obs, choose(obs)), None)

    return jax.vmap(lambda s: X.rollout(env, s, rule, slots, autoreset=False)[0])(states)


@partial(jax.jit, static_argnames=("tcfg", "slots"))
def evaluate(tcfg: T.TargetConfig, env: X.EnvParams, net, states, slots: int):
    """Greedy (argmax) episodes without auto-reset: the final states (their JCTs: jaxenv.jct)."""
    def greedy(obs):
        logits, _ = T.apply(tcfg, net, T.job_features(tcfg, obs), obs["active"], obs["allreduce"])
        return jnp.argmax(logits, axis=1)

    return _episodes(tcfg, env, states, slots, greedy)


@partial(jax.jit, static_argnames=("tcfg", "slots"))
def evaluate_teacher(tcfg: T.TargetConfig, env: X.EnvParams, states, slots: int):
    """The teacher's (``tcfg.teacher``) sizes through the same fill: the heuristic's episodes in the same
    environment."""
    return _episodes(tcfg, env, states, slots, lambda obs: T.teacher_pairs(tcfg, obs))
