"""Slot-level PPO for the target-size policy (dl2d.policy.target) on the simulator's JAX environment.

A slot's decision is every active job's (workers, PS) pair. A rollout is `jax.lax.scan` over slots inside
`jax.vmap` over clusters (each its own trace and noise, auto-reset), GAE advantages, then clipped-PPO epochs over
shuffled minibatches: an iteration is two jitted functions (purejaxrl's shape, ``train_step(runner_state) ->
(runner_state, metrics)``, cut in two so that the update runs on the rows the batch's busiest slot needs:
:func:`compact`).

The reward is the average JCT's own: minus the job-slots spent active (each job that finishes counts the
fraction of the slot it needed), over ``max_jobs``. Summed over an episode it is minus the total JCT in slots
over J, so maximising it minimises the average JCT (DL2's eq. 1 rewards epochs trained, which a policy can
raise by favouring fast jobs without finishing any). It is a sum over jobs, so it is credited two ways
(``PPOConfig.credit``): "slot", the slot's allocation as one action (its log-probability the sum over the
jobs) against the slot's advantage; or "job", each job's pair against that job's own advantage (its own slots,
its own value: far less variance, but a job is not charged for what its size costs the others, which
``team_weight`` adds back in part).

Supervised warm-up (:func:`sl_step`): cross-entropy towards the best heuristic's allocation (Optimus's,
:func:`dl2d.policy.target.teacher_actions`) on the states the current policy visits, the value fitted beside.
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
    #: "job": each job's action is credited with its own reward (its slots spent active) against its own value
    #: (independent per-job advantages: low variance, blind to what a job's size does to the others'); "slot":
    #: the whole slot's allocation is one action, its log-probability the sum over the jobs, one advantage
    credit: str = "job"
    #: credit "job": how much of the slot's advantage (the team's) each job's own advantage gets beside it, so a
    #: job that takes what others needed is not credited as if it had cost nothing
    team_weight: float = 0.0
    #: the policy samples from softmax(logits / temperature) (and learns that distribution): below 1 it explores
    #: less, which matters where every change of a job's size is a restart (learning online, dl2d.policy.target_online)
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
    k = jnp.arange(params.max_workers + 1, dtype=jnp.int32)
    ar = jax.vmap(lambda n: X._allreduce_rates(params, jobs, jnp.full(jobs.type_idx.shape, n), None)[0],
                  out_axes=1)(k)
    row0 = jnp.where(jobs.allreduce[:, None], ar, speed[:, 0, :])
    speed = jnp.where(jobs.allreduce[:, None, None], 0.0, speed)
    return speed.at[:, 0, :].set(row0)


def env_obs(tcfg: T.TargetConfig, params: X.EnvParams, state: X.EnvState) -> dict:
    """:func:`dl2d.policy.target.job_features`'s arrays from an environment state, and the fill's. The speeds
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
           "arrival_slot": jobs.arrival_slot}
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


def entropy(log_pi, active):
    """[...] each slot's mean per-job entropy over its active jobs, from the log-probabilities ``log_pi`` [..., J,
    A] (a slot or a batch of them)."""
    h = -jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1)
    return jnp.sum(jnp.where(active, h, 0.0), axis=-1) / jnp.maximum(jnp.sum(active, axis=-1), 1)


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
                     "allreduce": obs["allreduce"], "teacher": T.teacher_actions(tcfg, obs)}

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


def ppo_loss(tcfg: T.TargetConfig, pcfg: PPOConfig, net, batch):
    """Clipped PPO: per job (``credit`` "job": each active job's ratio against its own advantage) or per slot
    (the slot's ratio, the product over its jobs, against the slot's advantage); the per-job values against
    their returns; entropy per job."""
    logits, values = T.apply(tcfg, net, batch["x"], batch["active"], batch["allreduce"])
    log_pi = jax.nn.log_softmax(logits / pcfg.temperature)  # once, for the ratio and the entropy
    act = batch["active"]
    learn = batch.get("learn", act)  # the jobs whose pairs are learned from (online: the policy's own, carried out)
    logp = T.chosen(log_pi, batch["idx"])
    if pcfg.credit == "job":
        ratio, adv, mask = jnp.exp(logp - batch["logp"]), batch["adv"], learn
    else:
        slot_logp = lambda lp: jnp.sum(jnp.where(act, lp, 0.0), axis=1)  # noqa: E731
        ratio, adv, mask = (jnp.exp(slot_logp(logp) - slot_logp(batch["logp"])), batch["adv"],
                            jnp.ones(act.shape[0], bool))
    clipped = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - pcfg.clip, 1 + pcfg.clip) * adv)
    pg = -masked_mean(clipped, mask)
    vf = 0.5 * masked_mean((values - batch["ret"]) ** 2, act)
    ent = jnp.mean(entropy(log_pi, learn))
    kl = masked_mean(batch["logp"] - logp, learn)
    return pg + pcfg.vf_coef * vf - pcfg.ent_coef * ent, {"pg": pg, "vf": vf, "entropy": ent, "approx_kl": kl}


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
    """An iteration's rollout and its returns: (the runner after it, the flat batch, the update's key, the
    rollout's statistics)."""
    net, opt_state, states, key = runner
    key, k_roll, k_upd = jax.random.split(key, 3)
    states, traj = rollout(tcfg, pcfg, env, net, states, k_roll)
    flat = _with_returns(tcfg, pcfg, env, net, states, traj)
    return ((net, opt_state, states, key), flat, k_upd,
            {"reward": traj["reward"].sum(-1).mean(), **_episode_stats(traj)})


def busy_rows(active) -> int:
    """How many job rows the update needs: the most jobs active in any slot of the batch, rounded up to a
    multiple of 8 (so that a run compiles the update for a few sizes only), at most the batch's J."""
    most = int(np.max(np.sum(np.asarray(active), axis=-1), initial=0))
    return int(min(active.shape[-1], max(8, -(-most // 8) * 8)))


def compact(batch: dict, rows: int) -> dict:
    """``batch`` (leading axes: samples, jobs) with each slot's jobs reordered active first and cut to ``rows``
    (at least every slot's active count, :func:`busy_rows`). Every loss reads a slot's active jobs only (the set
    network pools over them, the losses mask the rest), so it is the same batch for them, with fewer rows: on
    DL2 traces a slot has 4-8 active jobs of 40 once the policy finishes jobs, and the update was most of an
    iteration's time."""
    act = batch["active"]
    n, jobs = act.shape
    order = jnp.argsort(~act, axis=1, stable=True)[:, :rows]

    def cut(v):
        if v.ndim < 2 or v.shape[:2] != (n, jobs):
            return v
        return jnp.take_along_axis(v, order.reshape(n, rows, *([1] * (v.ndim - 2))), axis=1)

    return {k: cut(v) for k, v in batch.items()}


@partial(jax.jit, static_argnames=("tcfg", "pcfg", "rows"))
def _ppo_update(tcfg: T.TargetConfig, pcfg: PPOConfig, net, opt_state, flat, key, rows: int):
    return update(tcfg, pcfg, net, opt_state, compact(flat, rows), key)


def train_step(tcfg: T.TargetConfig, pcfg: PPOConfig, env: X.EnvParams, runner):
    """One PPO iteration: rollout and GAE (one jitted function), then the update (another) on the batch cut to
    the rows its busiest slot needs (:func:`compact`). ``runner`` = (net, opt_state, states, key)."""
    (net, opt_state, states, key), flat, k_upd, stats = collect(tcfg, pcfg, env, runner)
    net, opt_state, upd = _ppo_update(tcfg, pcfg, net, opt_state, flat, k_upd, busy_rows(flat["active"]))
    return (net, opt_state, states, key), {**upd, **stats}


def _observe(tcfg, env, state):
    """(the policy's observation of a cluster, its job features)."""
    obs = env_obs(tcfg, env, state)
    return obs, T.job_features(tcfg, obs)


def _features(tcfg, env, state):
    obs, x = _observe(tcfg, env, state)
    return x, obs["active"], obs["allreduce"]


def sl_loss(tcfg: T.TargetConfig, pcfg: PPOConfig, net, batch):
    """Cross-entropy of the teacher's levels over the active jobs, and the value's error on the returns (so
    that RL starts with a critic of the policy it starts from, not a random one that would undo the warm-up)."""
    logits, value = T.apply(tcfg, net, batch["x"], batch["active"], batch["allreduce"])
    lp = jax.nn.log_softmax(logits)
    nll = -T.chosen(lp, batch["teacher"])
    act = batch["active"]
    acc = jnp.sum(act & (jnp.argmax(logits, -1) == batch["teacher"])) / jnp.maximum(act.sum(), 1)
    vf = 0.5 * masked_mean((value - batch["ret"]) ** 2, act)
    return masked_mean(nll, act) + pcfg.vf_coef * vf, acc


@partial(jax.jit, static_argnames=("tcfg", "pcfg", "rows"))
def _sl_update(tcfg: T.TargetConfig, pcfg: PPOConfig, net, opt_state, flat, key, rows: int):
    net, opt_state, (loss, acc) = minibatch_epochs(pcfg, lambda n, mb: sl_loss(tcfg, pcfg, n, mb), net, opt_state,
                                                   compact(flat, rows), key)
    return net, opt_state, {"sl_loss": loss.mean(), "sl_acc": acc[-1].mean()}


def sl_step(tcfg: T.TargetConfig, pcfg: PPOConfig, env: X.EnvParams, runner):
    """One supervised warm-up iteration: a rollout of the current policy, then ``epochs`` x ``minibatches``
    gradient steps towards the teacher's levels on the states it visited (DAgger's on-policy states), the value
    fitted beside."""
    (net, opt_state, states, key), flat, k_upd, stats = collect(tcfg, pcfg, env, runner)
    net, opt_state, upd = _sl_update(tcfg, pcfg, net, opt_state, flat, k_upd, busy_rows(flat["active"]))
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
    """The teacher's sizes through the same fill: the heuristic's episodes in the same environment."""
    return _episodes(tcfg, env, states, slots, lambda obs: T.teacher_actions(tcfg, obs))
