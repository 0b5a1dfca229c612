"""DAgger for the DL2 policy: roll out the learner, label the states it visits with the teacher, aggregate, refit.

Supervised warm-up (`train.teacher_samples`) only sees states along the teacher's own trajectory; the greedy
learner drifts to cluster states (other allocations, other jobs still running) the teacher never produced.
DAgger (Ross et al. 2011) labels the learner's own states instead.

How a state is labelled. A heuristic teacher decides a whole slot (workers and PS per job) from the slot's
`SlotView`; the slot loop replays it as an action sequence (`slot.teacher_action`: the job furthest behind its
target gets its missing task(s), void once every target is met or nothing more fits). That rule only needs the
partial allocation (w, u), the action mask and the targets, so the teacher *can* be queried at any partial state
of a slot: the targets come from running the teacher on the learner's view of the slot (per slot, across slots
the learner's trajectory), and w, u are read back from the recorded state (its w / max_workers and
u / max_ps features).

Two kinds of label per state:
- ``action``: the teacher's one action there (cross entropy, as in `train.sl_loss`);
- ``set``: every action on the teacher's path (any job still short of its target gets its missing task(s); void
  only when none is left). The order in which the teacher's allocation is handed out barely matters, and the
  "furthest behind, lowest index first" order is hard for an MLP to reproduce, so the loss is
  -log sum_{a in set} pi(a|s): the policy may pick any good action.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dl2d.core.contract import Allocation
from dl2d.policy.checkpoint import make_optimizer
from dl2d.policy.config import PolicyConfig
from dl2d.policy.learn import fit_epochs
from dl2d.policy.nets import masked_logits, policy_logits
from dl2d.policy.registry import make_heuristic
from dl2d.policy.scheduler import decide
from dl2d.policy.slot import GREEDY, SAMPLE, TEACHER, teacher_action
from dl2d.sim import engine as E
from dl2d.sim.trace import Trace


def decode_wu(cfg: PolicyConfig, states):
    """(w, u) int32 [n, J] from recorded states (the w / max_workers and u / max_ps features)."""
    f = states.reshape(states.shape[0], cfg.max_jobs, cfg.features_per_job)
    w = jnp.round(f[..., -2] * cfg.max_workers).astype(jnp.int32)
    u = jnp.round(f[..., -1] * cfg.max_ps).astype(jnp.int32)
    return w, u


@partial(jax.jit, static_argnames=("cfg",))
def teacher_labels(cfg: PolicyConfig, states, masks, target_w, target_u):
    """The teacher's action at each recorded state of one window ([n]), targets [J]."""
    w, u = decode_wu(cfg, states)
    return jax.vmap(lambda w_, u_, m: teacher_action(cfg, w_, u_, m, target_w, target_u))(w, u, masks)


@partial(jax.jit, static_argnames=("cfg",))
def teacher_sets(cfg: PolicyConfig, states, masks, target_w, target_u):
    """bool [n, A]: the actions on the teacher's path at each state (void only when no other is)."""
    w, u = decode_wu(cfg, states)
    need_w, need_u = w < target_w, u < target_u  # [n, J]
    kind = jnp.where(need_w & need_u, 2, jnp.where(need_w, 0, 1))
    onehot = jax.nn.one_hot(kind, 3, dtype=bool) & (need_w | need_u)[..., None]  # [n, J, 3]
    good = onehot.reshape(w.shape[0], -1) & masks[:, :-1]
    void = ~jnp.any(good, axis=1, keepdims=True)
    return jnp.concatenate([good, void], axis=1)


def set_loss(cfg: PolicyConfig, params, states, masks, good):
    """-log of the policy's probability of picking some good action (cross entropy when `good` is one-hot)."""
    logp = jax.nn.log_softmax(masked_logits(policy_logits(cfg, params, states), masks))
    return -jnp.mean(jax.nn.logsumexp(jnp.where(good, logp, -jnp.inf), axis=1))


@partial(jax.jit, static_argnames=("cfg", "opt"))
def set_update(cfg, opt, params, opt_state, states, masks, good):
    loss, grads = jax.value_and_grad(partial(set_loss, cfg))(params, states, masks, good)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def _window_targets(cfg: PolicyConfig, alloc: Allocation, i: int, n: int):
    """The teacher's targets for window i of a view of n jobs, padded to J."""
    sl = slice(i * cfg.max_jobs, min((i + 1) * cfg.max_jobs, n))
    tw, tu = np.zeros(cfg.max_jobs, np.int32), np.zeros(cfg.max_jobs, np.int32)
    tw[: sl.stop - sl.start], tu[: sl.stop - sl.start] = alloc.workers[sl], alloc.ps[sl]
    return tw, tu


def collect(cfg: PolicyConfig, params, trace: Trace, sim: E.SimConfig, teacher: str = "optimus", seed: int = 0,
            driver: str = GREEDY, max_slots: int | None = None, per_slot: int | None = 64):
    """(states, masks, labels, good sets) of the states visited when `driver` runs the slots, teacher-labelled.

    driver: ``teacher`` (its own trajectory, what supervised warm-up sees), ``greedy`` or ``sample`` (the learner
    with `params` decides each slot and the simulator follows its allocation). `per_slot` subsamples each window's
    steps (None keeps all)."""
    if driver not in (TEACHER, GREEDY, SAMPLE):
        raise ValueError(f"driver must be teacher, greedy or sample, not {driver!r}")
    rng = np.random.default_rng(seed)
    pick = np.random.default_rng(seed + 1)
    heuristic = make_heuristic(teacher)
    key = jax.random.PRNGKey(seed)
    state = E.replace(E.SimState.initial(len(trace)), slot=int(trace.arrival_slot.min()))
    out: list[list[np.ndarray]] = [[], [], [], []]
    n = 0
    while not state.done() and (max_slots is None or n < max_slots):
        view = E.view_of(trace, state, sim)
        target = heuristic(view)
        key, sub = jax.random.split(key)
        d = decide(cfg, params, sub, view, mode=driver, targets=(target.workers, target.ps), record=True,
                   epsilon=0.0)
        for i, r in enumerate(d.records):
            if len(r.actions) == 0:
                continue
            tw, tu = _window_targets(cfg, target, i, len(view))
            s, m = jnp.asarray(r.states), jnp.asarray(r.masks)
            lab = np.asarray(teacher_labels(cfg, s, m, tw, tu))
            good = np.asarray(teacher_sets(cfg, s, m, tw, tu))
            keep = pick.permutation(len(lab))[:per_slot] if per_slot else np.arange(len(lab))
            for lst, x in zip(out, (r.states, r.masks, lab, good)):
                lst.append(x[keep])
        state, _, _ = E.step(trace, state, d.allocation, sim, rng)
        n += 1
    return tuple(np.concatenate(x) for x in out)


def fit(cfg: PolicyConfig, params, data, epochs: int, labels: str = "set", seed: int = 0, lr: float | None = None,
        opt_state=None, on_epoch: Callable | None = None):
    """Fit the policy to labelled data (states, masks, labels, good); returns (params, opt_state, losses)."""
    if labels not in ("action", "set"):
        raise ValueError(f"labels must be 'action' or 'set', not {labels!r}")
    states, masks, acts, good = data
    if labels == "action":
        good = np.eye(cfg.num_actions, dtype=bool)[acts]
    states, masks, good = jnp.asarray(states), jnp.asarray(masks), jnp.asarray(good)
    opt = make_optimizer(cfg.sl_lr if lr is None else lr)
    opt_state = opt.init(params) if opt_state is None else opt_state
    return fit_epochs(lambda p, o, s, m, g: set_update(cfg, opt, p, o, s, m, g), params, opt_state,
                      [states, masks, good], cfg.sl_batch, epochs, seed, on_epoch)


def set_accuracy(cfg: PolicyConfig, params, data) -> float:
    """Share of states where the greedy action is one of the teacher's good actions."""
    states, masks, _, good = data
    logits = masked_logits(policy_logits(cfg, params, jnp.asarray(states)), jnp.asarray(masks))
    a = np.asarray(jnp.argmax(logits, axis=1))
    return float(np.mean(good[np.arange(len(a)), a]))


def dagger(cfg: PolicyConfig, params, data, traces: list[Trace], sim: E.SimConfig, iterations: int,
           epochs: int, teacher: str = "optimus", labels: str = "set", driver: str = GREEDY, seed: int = 0,
           max_slots: int | None = None, per_slot: int | None = 64, on_iter: Callable | None = None):
    """`iterations` rounds of: roll the learner out on the next trace(s), label, aggregate with `data`, refit
    `epochs` epochs (continuing from the current parameters). Each round uses traces[k % len(traces)].
    Returns (params, aggregated data)."""
    opt_state = None
    for it in range(iterations):
        tr = traces[it % len(traces)]
        new = collect(cfg, params, tr, sim, teacher, seed=seed + it, driver=driver, max_slots=max_slots,
                      per_slot=per_slot)
        data = tuple(np.concatenate([a, b]) for a, b in zip(data, new))
        params, opt_state, losses = fit(cfg, params, data, epochs, labels=labels, seed=seed + it,
                                        opt_state=opt_state)
        if on_iter:
            on_iter(it, len(new[2]), len(data[2]), losses[-1], params)
    return params, data
