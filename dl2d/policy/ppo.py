"""Slot-level PPO for the target-size policy (dl2d.policy.target) on the simulator's JAX environment.

One slot is one action: every active job's level, its log-probability the sum over those jobs. A rollout is
`jax.lax.scan` over slots inside `jax.vmap` over clusters (each its own trace and noise, auto-reset), GAE
advantages, then clipped-PPO epochs over shuffled minibatches: the whole iteration is one jitted function
(purejaxrl's shape: ``train_step(runner_state) -> (runner_state, metrics)``).

The reward is the average JCT's own: minus the job-slots spent active (each job that finishes counts the
fraction of the slot it needed), over ``max_jobs``. Summed over an episode it is minus the total JCT in slots
over J, so maximising it minimises the average JCT (DL2's eq. 1 rewards epochs trained, which a policy can
raise by favouring fast jobs without finishing any).

Supervised warm-up (:func:`sl_step`): cross-entropy towards the elastic heuristic's efficient size
(:func:`dl2d.policy.target.teacher_actions`) on the states the current policy visits.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dl2d.policy import target as T
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


# ------------------------------------------------------------------------------------------ the environment's side

@functools.lru_cache(maxsize=16)
def _ps_estimate(max_ps: int, max_workers: int) -> np.ndarray:
    """[8, max_ps + 1, max_workers + 1] what a scheduler believes of each DL2 type's speed in epochs/s
    (dl2d.workload.catalog.speed_estimate: the parametric table, not the environment's measured truth)."""
    return speed_estimate(np.arange(NUM_DL2_TYPES), np.zeros(NUM_DL2_TYPES), max_ps, max_workers, 1.0)


def curves(tcfg: T.TargetConfig, params: X.EnvParams, state: X.EnvState) -> jnp.ndarray:
    """[J, L] the scheduler's speed estimate (epochs/s) at each level, as a SlotView's ``est_speed`` gives it:
    a PS job with k workers and k PS (the parametric table), an all-reduce job packed on the fewest servers;
    no interference, no noise."""
    jobs = state.jobs
    lv = jnp.asarray(tcfg.levels, jnp.int32)
    est = jnp.asarray(_ps_estimate(params.max_ps, params.max_workers), params.speed_table.dtype)
    t = jnp.minimum(jobs.type_idx, NUM_DL2_TYPES - 1)
    ps_speed = est[t[:, None], jnp.minimum(lv, params.max_ps)[None, :], jnp.minimum(lv, params.max_workers)[None, :]]
    if not params.has_allreduce:
        return ps_speed
    ar = jax.vmap(lambda k: X._allreduce_rates(params, jobs, jnp.full(jobs.type_idx.shape, k), None)[0],
                  out_axes=1)(lv)
    return jnp.where(jobs.allreduce[:, None], ar, ps_speed)


def ps_curves(tcfg: T.TargetConfig, params: X.EnvParams, state: X.EnvState) -> jnp.ndarray:
    """[J, Lp] the speed estimate with one worker and each PS level (PS jobs; the caller puts all-reduce jobs'
    one-worker speed there)."""
    est = jnp.asarray(_ps_estimate(params.max_ps, params.max_workers), params.speed_table.dtype)
    t = jnp.minimum(state.jobs.type_idx, NUM_DL2_TYPES - 1)
    psl = jnp.minimum(jnp.asarray(tcfg.ps_levels, jnp.int32), params.max_ps)
    return est[t[:, None], psl[None, :], jnp.minimum(1, params.max_workers)]


def env_obs(tcfg: T.TargetConfig, params: X.EnvParams, state: X.EnvState) -> dict:
    """:func:`dl2d.policy.target.job_features`'s arrays from an environment state, and the fill's."""
    jobs = state.jobs
    act = X.active(state)
    bundle = jobs.worker_demand + jnp.where(jobs.allreduce[:, None], 0.0, jobs.ps_demand)  # one worker, one PS
    c = curves(tcfg, params, state)
    f = c.dtype
    return {"active": act, "remaining_epochs": jnp.maximum(jobs.est_epochs - state.epochs_done, 0.0),
            "slots_run": state.slots_run.astype(f), "age": jnp.maximum(state.slot - jobs.arrival_slot, 0).astype(f),
            "prev_workers": state.workers.astype(f),
            "worker_gpus": bundle[:, 0] / jnp.maximum(params.server_capacity[0], 1.0), "allreduce": jobs.allreduce,
            "curves": c, "ps_curves": jnp.where(jobs.allreduce[:, None], c[:, 1:2], ps_curves(tcfg, params, state)),
            "slot_seconds": params.slot_seconds,
            "capacity_gpus": params.server_capacity[0] * params.num_servers, "bundle": bundle,
            "worker_demand": jobs.worker_demand, "ps_demand": jobs.ps_demand,
            "capacity": params.server_capacity * params.num_servers}


def allocate(tcfg: T.TargetConfig, obs: dict, action) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(workers, ps) [J] of the chosen actions after the fill (shortest remaining work at one worker first)."""
    target_w, target_p = T.sizes(tcfg, action, obs["allreduce"], obs["bundle"].dtype)
    one = jnp.maximum(obs["curves"][:, 1], 1e-12)
    w, p = T.fill(tcfg, target_w, target_p, obs["active"], obs["worker_demand"], obs["ps_demand"], obs["capacity"],
                  obs["remaining_epochs"] / one)
    return w.astype(jnp.int32), p.astype(jnp.int32)


def jct_reward(state: X.EnvState, nxt: X.EnvState, max_jobs: int) -> jnp.ndarray:
    """Minus the job-slots spent active this slot, over J (a job that finished counts the part it needed)."""
    act = X.active(state)
    ended = act & nxt.finished & ~state.finished
    part = jnp.where(ended, jnp.clip(nxt.finish_time - state.slot, 0.0, 1.0), 1.0)
    return -jnp.sum(jnp.where(act, part, 0.0)) / max_jobs


def log_prob(logits, level_idx, active):
    """The slot's log-probability: the sum over the active jobs."""
    lp = jax.nn.log_softmax(logits)
    return jnp.sum(jnp.where(active, jnp.take_along_axis(lp, level_idx[:, None], axis=1)[:, 0], 0.0))


def entropy(logits, active):
    """Mean per-job entropy over the active jobs."""
    p = jax.nn.softmax(logits)
    h = -jnp.sum(p * jax.nn.log_softmax(logits), axis=1)
    return jnp.sum(jnp.where(active, h, 0.0)) / jnp.maximum(jnp.sum(active), 1)


# ------------------------------------------------------------------------------------------ rollout

def rollout(tcfg: T.TargetConfig, pcfg: PPOConfig, env: X.EnvParams, net, states, key):
    """``pcfg.slots`` slots of every cluster (``states``: a batch): (final states, transitions [T, N, ...])."""

    def one_slot(carry, _):
        s, k = carry
        k, k_act = jax.random.split(k)

        def decide(state, key_):
            obs = env_obs(tcfg, env, state)
            x = T.job_features(tcfg, obs)
            logits, value = T.apply(tcfg, net, x, obs["active"], obs["allreduce"])
            idx = jax.random.categorical(key_, logits)
            w, p = allocate(tcfg, obs, idx)
            nxt, _, done, _ = X.step(env, state, w, p)
            r = jct_reward(state, nxt, env.max_jobs)  # from the finished episode's state, before the reset
            nxt, episode_jct = X.autoreset(env, nxt, done)
            return nxt, {"x": x, "active": obs["active"], "idx": idx, "logp": log_prob(logits, idx, obs["active"]),
                         "value": value, "reward": r, "done": done, "episode_jct": episode_jct,
                         "allreduce": obs["allreduce"], "teacher": T.teacher_actions(tcfg, obs)}

        keys = jax.random.split(k_act, pcfg.clusters)
        s, tr = jax.vmap(decide)(s, keys)
        return (s, k), tr

    (states, _), traj = jax.lax.scan(one_slot, (states, key), None, length=pcfg.slots)
    return states, traj


def gae(pcfg: PPOConfig, rewards, values, dones, last_value):
    """GAE(λ) advantages and returns, [T, N]; ``dones[t]``: the episode ended at slot t (no bootstrap)."""

    def body(carry, x):
        adv, next_v = carry
        r, v, d = x
        nonterm = 1.0 - d
        delta = r + pcfg.gamma * next_v * nonterm - v
        adv = delta + pcfg.gamma * pcfg.gae_lambda * nonterm * adv
        return (adv, v), adv

    _, adv = jax.lax.scan(body, (jnp.zeros_like(last_value), last_value),
                          (rewards, values, dones.astype(rewards.dtype)), reverse=True)
    return adv, adv + values


# ------------------------------------------------------------------------------------------ updates

def ppo_loss(tcfg: T.TargetConfig, pcfg: PPOConfig, net, batch):
    logits, value = jax.vmap(lambda x, a, r: T.apply(tcfg, net, x, a, r))(batch["x"], batch["active"],
                                                                           batch["allreduce"])
    logp = jax.vmap(log_prob)(logits, batch["idx"], batch["active"])
    ratio = jnp.exp(logp - batch["logp"])
    adv = batch["adv"]
    pg = -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - pcfg.clip, 1 + pcfg.clip) * adv))
    vf = 0.5 * jnp.mean((value - batch["ret"]) ** 2)
    ent = jnp.mean(jax.vmap(entropy)(logits, batch["active"]))
    return pg + pcfg.vf_coef * vf - pcfg.ent_coef * ent, {"pg": pg, "vf": vf, "entropy": ent,
                                                            "approx_kl": jnp.mean(batch["logp"] - logp)}


def make_optimizer(pcfg: PPOConfig):
    return optax.chain(optax.clip_by_global_norm(pcfg.max_grad_norm), optax.adam(pcfg.lr, eps=1e-5))


def minibatch_epochs(pcfg: PPOConfig, loss_fn, net, opt_state, batch, key):
    """``pcfg.epochs`` passes over ``batch`` (leading axis: samples) in ``pcfg.minibatches`` shuffled
    minibatches, one optimizer step on ``loss_fn(net, minibatch) -> (loss, aux)`` each; (net, opt_state, the
    (loss, aux) of every step, [epochs, minibatches])."""
    opt = make_optimizer(pcfg)
    n = batch["idx"].shape[0]
    size = n // pcfg.minibatches

    def epoch(carry, k):
        perm = jax.random.permutation(k, n)[: size * pcfg.minibatches].reshape(pcfg.minibatches, size)

        def minibatch(carry, idx):
            net, opt_state = carry
            out, grads = jax.value_and_grad(loss_fn, has_aux=True)(net, jax.tree_util.tree_map(lambda a: a[idx],
                                                                                                 batch))
            upd, opt_state = opt.update(grads, opt_state, net)
            return (optax.apply_updates(net, upd), opt_state), out

        return jax.lax.scan(minibatch, carry, perm)

    (net, opt_state), outs = jax.lax.scan(epoch, (net, opt_state), jax.random.split(key, pcfg.epochs))
    return net, opt_state, outs


def update(tcfg: T.TargetConfig, pcfg: PPOConfig, net, opt_state, batch, key):
    """``pcfg.epochs`` passes of clipped PPO over ``batch`` (leading axis: samples) in shuffled minibatches."""
    net, opt_state, (loss, aux) = minibatch_epochs(pcfg, lambda n, mb: ppo_loss(tcfg, pcfg, n, mb), net,
                                                   opt_state, batch, key)
    return net, opt_state, jax.tree_util.tree_map(jnp.mean, {"loss": loss, **aux})


def _episode_stats(traj) -> dict:
    """How many episodes the rollout finished and their mean average JCT (0 when none)."""
    jcts = traj["episode_jct"]
    done = ~jnp.isnan(jcts)
    return {"episodes": done.sum(), "episode_jct": jnp.sum(jnp.where(done, jcts, 0.0)) / jnp.maximum(done.sum(), 1)}


def _flatten(traj):
    return jax.tree_util.tree_map(lambda a: a.reshape((-1, *a.shape[2:])), traj)


@partial(jax.jit, static_argnames=("tcfg", "pcfg"))
def train_step(tcfg: T.TargetConfig, pcfg: PPOConfig, env: X.EnvParams, runner):
    """One PPO iteration: rollout, GAE, update. ``runner`` = (net, opt_state, states, key)."""
    net, opt_state, states, key = runner
    key, k_roll, k_upd = jax.random.split(key, 3)
    states, traj = rollout(tcfg, pcfg, env, net, states, k_roll)
    last_value = jax.vmap(lambda s: T.apply(tcfg, net, *_features(tcfg, env, s))[1])(states)
    adv, ret = gae(pcfg, traj["reward"], traj["value"], traj["done"], last_value)
    flat = _flatten({**traj, "adv": (adv - adv.mean()) / (adv.std() + 1e-8), "ret": ret})
    net, opt_state, stats = update(tcfg, pcfg, net, opt_state, flat, k_upd)
    return (net, opt_state, states, key), {**stats, "reward": traj["reward"].mean(), **_episode_stats(traj)}


def _features(tcfg, env, state):
    obs = env_obs(tcfg, env, state)
    return T.job_features(tcfg, obs), obs["active"], obs["allreduce"]


def sl_loss(tcfg: T.TargetConfig, net, batch):
    """Cross-entropy of the teacher's levels over the active jobs."""
    logits, _ = jax.vmap(lambda x, a, r: T.apply(tcfg, net, x, a, r))(batch["x"], batch["active"],
                                                                       batch["allreduce"])
    lp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(lp, batch["teacher"][..., None], axis=-1)[..., 0]
    act = batch["active"]
    acc = jnp.sum(act & (jnp.argmax(logits, -1) == batch["teacher"])) / jnp.maximum(act.sum(), 1)
    return jnp.sum(jnp.where(act, nll, 0.0)) / jnp.maximum(act.sum(), 1), acc


@partial(jax.jit, static_argnames=("tcfg", "pcfg"))
def sl_step(tcfg: T.TargetConfig, pcfg: PPOConfig, env: X.EnvParams, runner):
    """One supervised warm-up iteration: a rollout of the current policy, then ``epochs`` x ``minibatches``
    gradient steps towards the teacher's levels on the states it visited (DAgger's on-policy states)."""
    net, opt_state, states, key = runner
    key, k_roll, k_upd = jax.random.split(key, 3)
    states, traj = rollout(tcfg, pcfg, env, net, states, k_roll)
    net, opt_state, (loss, acc) = minibatch_epochs(pcfg, lambda n, mb: sl_loss(tcfg, n, mb), net, opt_state,
                                                   _flatten(traj), k_upd)
    return (net, opt_state, states, key), {"sl_loss": loss.mean(), "sl_acc": acc[-1].mean(), **_episode_stats(traj)}


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
    """The teacher's sizes through the same fill: the heuristic's episodes in the same environment."""
    return _episodes(tcfg, env, states, slots, lambda obs: T.teacher_actions(tcfg, obs))
