"""Target-size policy: a learned size for every job, filled in shortest-remaining-work order.

Why a second action structure beside DL2's: DL2 hands out one task per inference, so a slot of a 64-GPU cluster
is hundreds of inferences, and its probability a product of hundreds of terms that all share one reward. Here a
slot is one decision per job: the network reads every job at once (a job's own features with the
cluster's, pooled over the jobs: the same weights for any number of jobs) and picks each job's workers among a
few ``levels`` (0 keeps it waiting) and, for a PS job, its PS among ``ps_levels``: one categorical over the
pairs. A slot's log-probability is the sum over the active jobs, a few dozen terms. What is not learned is the
fill: jobs in shortest-remaining-work order (as the elastic heuristic) take their targets or the most that
still fits.

Everything the network sees comes from :func:`job_features`, a pure function of arrays that the simulator's
JAX environment provides (training, dl2d.policy.target.ppo) and a :class:`~dl2d.core.contract.SlotView` holds too (the
NumPy simulator's and the daemon's side: dl2d.policy.target.view's ``view_obs`` and ``TargetPolicy``, registered
as ``dl2-target`` in dl2d.policy.target.entry): the remaining work at one worker, age, last size, demand, the job's
estimated speed-up at each level and PS level (the speed model the scheduler believes, never the truth), and what its
teacher would give it this slot, one-hot over the levels (``TargetConfig.teacher``, dl2d.policy.target.teachers:
Optimus, :func:`with_optimus` / :func:`teacher_actions`, or elastic), the warm-up's target too.
"""
from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

#: Candidate sizes: workers, cut at the cluster's max_workers; a PS job's PS are chosen beside them among the
#: same sizes from 1, cut at max_ps (PS cost no GPU: Optimus often gives one worker many PS).
BASE_LEVELS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 32, 48, 64)
#: The elastic heuristic's efficiency threshold (dl2d.policy.elastic.srtf.EFFICIENCY): the demand feature's sizes.
ELASTIC_EFFICIENCY = 0.6


def levels_for(max_workers: int) -> tuple[int, ...]:
    """The levels of a cluster whose jobs may have up to ``max_workers`` workers."""
    out = sorted({k for k in BASE_LEVELS if k <= max_workers} | {int(max_workers)})
    if len(out) < 2:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    return tuple(out)


@dataclass(frozen=True)
class TargetConfig:
    """The network's shape; static (hashable) so jitted functions take it as a static argument."""

    max_workers: int = 16
    max_ps: int = 16
    hidden: int = 64
    #: the heuristic whose pair the features show (one-hot) and the warm-up imitates (dl2d.policy.target.teachers); a
    #: checkpoint without it was trained with Optimus's
    teacher: str = "optimus"
    #: added to the logit of the teacher's pair (read from the features' one-hot block): the policy starts as
    #: its teacher and learns where to leave it, and on jobs unlike its training's falls back on it; 0: none
    prior: float = 0.0
    #: every whole count from 0 (workers) or 1 (PS) to the maximum is a level, not only those of BASE_LEVELS:
    #: the planner the DL2 world's policy learns from (dl2d.policy.planning.plan_distill) gives a job 11, 13 or 15 PS,
    #: which the base levels round down, and its pairs through the base levels cost it 1-2 % of its JCT
    every_count: bool = False
    #: a feature column with each job's measured speed against the speed model (the log of the view's
    #: ``job_speed_factor``, dl2d.daemon.jobstats; 0 before it is measured): the hidden interference and model
    #: error a scheduler sees only by measuring, which moves a job's remaining time; a checkpoint without it has none
    speed_factor: bool = False

    #: Each integer field's bounds: a checkpoint's config is checked against them before any network is built.
    BOUNDS = {"max_workers": (1, 64), "max_ps": (1, 64), "hidden": (1, 1024)}
    #: The teachers' names: the JAX heuristics of dl2d.policy.target.teachers.TEACHERS (a test keeps them equal), and
    #: ``lp-plan``, the planner on a learned speed table, which no JAX function is: its pair comes in the
    #: observation (dl2d.policy.planning.plan_net), and with it the plan's columns and the relative head
    TEACHERS = ("optimus", "optimus-relative", "elastic", "lp-plan")

    def __post_init__(self):
        for name, (lo, hi) in self.BOUNDS.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
        if self.teacher not in self.TEACHERS:
            raise ValueError(f"teacher must be one of {', '.join(self.TEACHERS)}, got {self.teacher!r}")
        if isinstance(self.prior, bool) or not isinstance(self.prior, (int, float)) or not 0 <= self.prior <= 50:
            raise ValueError(f"prior must be a number in [0, 50], got {self.prior!r}")
        for name in ("every_count", "speed_factor"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    def to_dict(self) -> dict:
        return {**{name: int(getattr(self, name)) for name in self.BOUNDS}, "teacher": self.teacher,
                "prior": float(self.prior), "every_count": self.every_count, "speed_factor": self.speed_factor}

    @classmethod
    def from_dict(cls, d: dict) -> "TargetConfig":
        known = (*cls.BOUNDS, "teacher", "prior", "every_count", "speed_factor")
        unknown = sorted(repr(k) for k in d if k not in known)
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
        return cls(**d)

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(range(self.max_workers + 1)) if self.every_count else levels_for(self.max_workers)

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    @property
    def ps_levels(self) -> tuple[int, ...]:
        return tuple(range(1, self.max_ps + 1)) if self.every_count else levels_for(self.max_ps)[1:]

    @property
    def num_actions(self) -> int:
        """Per job: workers and PS, one categorical over the pairs (worker-major)."""
        return self.num_levels * len(self.ps_levels)

    @property
    def feature_dim(self) -> int:
        return len(feature_columns(self))

    @property
    def reads_plan(self) -> bool:
        """Whether the network reads the planner's plan (teacher ``lp-plan``): its pair as the teacher's, the
        :data:`PLAN_COLUMNS`, and a head of :data:`RELATIVE_MOVES` from its pair."""
        return self.teacher == "lp-plan"


#: What a network with teacher ``lp-plan`` reads of the planner's program besides its pair, each job's: planned
#: to run this slot (1/0), its place in the planner's order over the jobs, its share of the first bucket, its
#: alpha point in slots (log1p). Observation keys: ``plan_now``, ``plan_pos``, ``plan_share``, ``plan_alpha``.
PLAN_COLUMNS = ("now", "order", "share", "alpha")
#: The relative head's moves from the planner's pair: (worker levels, PS levels) added to it. The lookahead's
#: departures from the planner (dl2d.policy.planning.lp_lookahead) are nearly all within them: a PS job's PS changed by up
#: to 4 levels, a job started or resized by a level or two.
RELATIVE_MOVES = tuple((dw, dp) for dw in range(-2, 3) for dp in range(-4, 5))


# ------------------------------------------------------------------------------------------ features (pure)

def feature_columns(cfg: TargetConfig) -> list[tuple[str, int]]:
    """What each column of :func:`job_features` is, in order: (block, the scalar's index or the worker or PS
    level the column is of). A network on other levels maps its columns by these (plan_distill.widen)."""
    lv, pl = cfg.levels, cfg.ps_levels
    return ([("scalar", i) for i in range(9)] + [("speed_factor", 0)] * cfg.speed_factor
            + [("efficiency", k) for k in lv] + [("speedup", k) for k in lv] + [("ps_gain", k) for k in pl]
            + [("plan", i) for i in range(len(PLAN_COLUMNS)) if cfg.reads_plan]
            + [("teacher_workers", k) for k in lv] + [("teacher_ps", k) for k in pl])


def job_features(cfg: TargetConfig, obs: dict) -> jnp.ndarray:
    """[J, feature_dim] from arrays every side has (``obs``; J rows, ``active`` marks the real ones):

    ``active`` [J] bool, ``remaining_epochs`` [J], ``slots_run`` [J], ``age`` [J] slots since arrival,
    ``prev_workers`` [J], ``worker_gpus`` [J] a bundle's GPUs over a server's, ``allreduce`` [J] bool,
    ``curves`` [J, L] estimated epochs/s at each level (as many PS as workers for a PS job), ``ps_curves``
    [J, Lp] with one worker and each PS level (PS jobs; all-reduce jobs: their one-worker speed),
    ``slot_seconds`` [], ``capacity_gpus`` [] the cluster's, ``optimus_workers``/``optimus_ps`` [J] what the
    best heuristic would give each job this slot (:func:`with_optimus`); with ``cfg.speed_factor``,
    ``job_speed_factor`` [J] (NaN: not measured yet); with teacher ``lp-plan``, ``plan_pair`` [J] and the
    :data:`PLAN_COLUMNS`' keys (dl2d.policy.planning.plan_net.plan_obs).
    """
    act = obs["active"]
    c = jnp.maximum(obs["curves"], 0.0)
    one = jnp.maximum(c[:, 1], 1e-12)  # level 1 is one worker
    rem_slots = obs["remaining_epochs"] / (one * obs["slot_seconds"])
    lv = jnp.asarray(cfg.levels, c.dtype)
    eff = jnp.where(lv[None, :] > 0, c / (one[:, None] * jnp.maximum(lv[None, :], 1.0)), 0.0)
    speedup = jnp.log1p(c / one[:, None])
    # remaining work's rank among the active jobs (0 = shortest) and how contended the cluster is
    t = jnp.where(act, rem_slots, jnp.inf)
    rank = jnp.sum(act[None, :] & (t[None, :] < t[:, None]), axis=1)
    n_act = jnp.maximum(jnp.sum(act), 1)
    want = elastic_sizes(cfg, c)
    demand = jnp.sum(jnp.where(act, want * obs["worker_gpus"], 0.0)) / jnp.maximum(obs["capacity_gpus"], 1e-9)
    cols = [jnp.log1p(rem_slots), jnp.log1p(obs["slots_run"]), jnp.log1p(obs["age"]),
            obs["prev_workers"] / cfg.max_workers, obs["worker_gpus"], obs["allreduce"].astype(c.dtype),
            rank / n_act, jnp.broadcast_to(jnp.log1p(n_act.astype(c.dtype)), act.shape),
            jnp.broadcast_to(jnp.log1p(demand), act.shape)]
    if cfg.speed_factor:  # measured against believed; unmeasured reads as the model's own speed
        factor = jnp.asarray(obs["job_speed_factor"], c.dtype)
        cols.append(jnp.log(jnp.clip(jnp.where(jnp.isnan(factor), 1.0, factor), 1e-3, 1e3)))
    ps_gain = jnp.log1p(jnp.maximum(obs["ps_curves"], 0.0) / one[:, None])
    teacher = teacher_pairs(cfg, obs)  # the teacher's pair, one-hot: following it is easy to learn
    opt_w = jax.nn.one_hot(teacher // len(cfg.ps_levels), cfg.num_levels, dtype=c.dtype)
    opt_p = jax.nn.one_hot(teacher % len(cfg.ps_levels), len(cfg.ps_levels), dtype=c.dtype)
    blocks = [jnp.stack(cols, axis=1), eff, speedup, ps_gain]
    if cfg.reads_plan:
        blocks.append(jnp.stack([obs["plan_now"], obs["plan_pos"] / n_act, obs["plan_share"],
                                 jnp.log1p(jnp.maximum(obs["plan_alpha"], 0.0))], axis=1).astype(c.dtype))
    x = jnp.concatenate([*blocks, opt_w, opt_p], axis=1)
    return jnp.where(act[:, None], jnp.nan_to_num(x, posinf=50.0), 0.0)


def elastic_sizes(cfg: TargetConfig, curves: jnp.ndarray) -> jnp.ndarray:
    """[J] the elastic heuristic's efficient size on the levels: the largest level k >= 1 whose speed is at
    least ELASTIC_EFFICIENCY * k * c(1) and faster than every smaller level (1 when none is)."""
    lv = jnp.asarray(cfg.levels, curves.dtype)
    best_before = jax.lax.cummax(curves, axis=1)
    faster = jnp.concatenate([jnp.ones_like(curves[:, :1], bool), curves[:, 1:] > best_before[:, :-1]], axis=1)
    good = (curves >= ELASTIC_EFFICIENCY * lv[None, :] * curves[:, 1:2]) & faster & (lv[None, :] >= 1)
    return jnp.where(good.any(axis=1), jnp.max(jnp.where(good, lv[None, :], 0.0), axis=1), 1.0)


def with_optimus(obs: dict) -> dict:
    """``obs`` with what Optimus (dl2d.policy.target.marginal, on aggregate capacity) gives every active job this slot:
    ``optimus_workers``, ``optimus_ps`` [J], from the scheduler's believed ``speed`` [J, P + 1, W + 1],
    ``remaining_epochs``, ``worker_demand``, ``ps_demand``, ``allreduce``, ``arrival_slot`` and ``capacity``
    [3]. Pure (JAX)."""
    from dl2d.policy.target.marginal import optimus_counts

    w, p = optimus_counts(jnp.asarray(obs["speed"]), jnp.asarray(obs["remaining_epochs"]),
                          jnp.asarray(obs["worker_demand"]), jnp.asarray(obs["ps_demand"]),
                          jnp.asarray(obs["allreduce"]), jnp.asarray(obs["active"]),
                          jnp.asarray(obs["arrival_slot"]), jnp.asarray(obs["capacity"]))
    return {**obs, "optimus_workers": w, "optimus_ps": p}


def level_index(levels, counts) -> jnp.ndarray:
    """[J] the index of the largest of ``levels`` (ascending) at most ``counts`` (0 below the first)."""
    lv = jnp.asarray(levels, jnp.float32)
    return jnp.maximum(jnp.sum(lv[None, :] <= jnp.asarray(counts, jnp.float32)[:, None], axis=1) - 1, 0)


def teacher_pairs(cfg: TargetConfig, obs: dict) -> jnp.ndarray:
    """[J] the pair ``cfg.teacher`` gives each job this slot (dl2d.policy.target.teachers; ``lp-plan``: the observation's
    ``plan_pair``, which only dl2d.policy.planning.plan_net computes, outside JAX)."""
    from dl2d.policy.target.teachers import teacher

    if cfg.reads_plan:
        if "plan_pair" not in obs:
            raise ValueError("teacher lp-plan's pair is the planner's, solved outside JAX (dl2d.policy.planning.plan_net."
                             "plan_obs): this observation has none (the JAX environment cannot train such a network)")
        return jnp.asarray(obs["plan_pair"], jnp.int32)
    return teacher(cfg.teacher)(cfg, obs)


def features_teacher(cfg: TargetConfig, x) -> jnp.ndarray:
    """[..., J] the teacher's pair read back from the one-hot blocks of feature rows ``x`` [..., J, F] (what
    :func:`job_features` put there from :func:`teacher_pairs`; 0 for an inactive row), so that a caller holding
    the features does not compute the teacher a second time (elastic's is a fill and a sort)."""
    nl, np_ = cfg.num_levels, len(cfg.ps_levels)
    w, p = x[..., -nl - np_:-np_], x[..., -np_:]
    return (jnp.argmax(w, axis=-1) * np_ + jnp.argmax(p, axis=-1)).astype(jnp.int32)


def teacher_actions(cfg: TargetConfig, obs: dict) -> jnp.ndarray:
    """[J] Optimus's pair: what it gives each job this slot (``optimus_workers``,
    ``optimus_ps``, dl2d.policy.target.marginal), each rounded down to a level (no workers: level 0, the job waits)."""
    level = level_index(cfg.levels, jnp.minimum(obs["optimus_workers"], cfg.max_workers))
    ps = level_index(cfg.ps_levels, jnp.minimum(obs["optimus_ps"], cfg.max_ps))
    return level * len(cfg.ps_levels) + jnp.where(obs["allreduce"], 0, ps)


# ------------------------------------------------------------------------------------------ the network

class _SetNet(nn.Module):
    """Each job's embedding with the mean embedding of the active jobs beside it (permutation-equivariant, any
    number of jobs): [J, hidden]."""

    hidden: int

    @nn.compact
    def __call__(self, x, active):
        m = active[:, None].astype(x.dtype)
        e = nn.relu(nn.Dense(self.hidden, name="embed")(x))
        pooled = jnp.sum(e * m, axis=0) / jnp.maximum(jnp.sum(m), 1.0)
        z = jnp.concatenate([e, jnp.broadcast_to(pooled, e.shape)], axis=1)
        return nn.relu(nn.Dense(self.hidden, name="mix")(z))


class TargetNet(nn.Module):
    """Per-job logits over (workers, PS) pairs (the actor) and per-job values (the critic: each job's remaining
    share of the reward, its own slots still to run; the slot's value is their sum), each its own set network:
    a shared trunk let the critic's large early gradients move the warm-started actor."""

    cfg: TargetConfig

    @nn.compact
    def __call__(self, x, active):
        h = _SetNet(self.cfg.hidden, name="actor")(x, active)
        logits = nn.Dense(self.cfg.num_actions, name="logits")(h)
        if self.cfg.reads_plan:
            logits = logits + relative_logits(self.cfg, nn.Dense(len(RELATIVE_MOVES), name="relative")(h), x)
        v = nn.Dense(1, name="value")(_SetNet(self.cfg.hidden, name="critic")(x, active))[:, 0]
        return logits, jnp.where(active, v, 0.0)


def init_params(cfg: TargetConfig, key, jobs: int = 4) -> dict:
    return TargetNet(cfg).init(key, jnp.zeros((jobs, cfg.feature_dim)), jnp.ones(jobs, bool))["params"]


def _set_layers(p, x, m, pool, spread):
    """:class:`_SetNet`'s output on job rows ``x`` [R, F] (``m`` [R, 1]: 1 for an active job), its slots' sums
    taken by ``pool`` ([R, h] -> [S, h]) and a slot's row put back on its jobs by ``spread`` ([S, h] -> [R, h]):
    one matrix product per layer on all the rows (several times faster on the CPU than a vmap of the module per
    slot, above all in the gradient), and the mix layer's kernel split into the job's half and the pooled half
    (the pooled part once per slot, not spread to every job first). The same arithmetic as the Flax module's,
    so the same parameters."""
    e = jax.nn.relu(x @ p["embed"]["kernel"] + p["embed"]["bias"])
    h = e.shape[-1]
    pooled = pool(e * m) / jnp.maximum(pool(m), 1.0)
    k = p["mix"]["kernel"]
    return jax.nn.relu(e @ k[:h] + spread(pooled @ k[h:] + p["mix"]["bias"]))


def _set_forward(p, x, active):
    """:func:`_set_layers` on ``x`` [..., J, F] (any leading batch dims, each a slot of J jobs): rows [B x J,
    hidden]."""
    *lead, J, F = x.shape
    B = int(np.prod(lead)) if lead else 1
    m = active.reshape(B * J, 1).astype(x.dtype)
    return _set_layers(p, x.reshape(B * J, F), m, lambda v: jnp.sum(v.reshape(B, J, -1), axis=1),
                       lambda s: jnp.broadcast_to(s[:, None, :], (B, J, s.shape[-1])).reshape(B * J, -1))


def teacher_one_hot(cfg: TargetConfig, x) -> jnp.ndarray:
    """[R, A] the teacher's pair, one-hot, from feature rows ``x`` [R, F] (their last two blocks:
    :func:`job_features`)."""
    nl, np_ = cfg.num_levels, len(cfg.ps_levels)
    w, p = x[:, -nl - np_:-np_], x[:, -np_:]
    return (w[:, :, None] * p[:, None, :]).reshape(x.shape[0], nl * np_)


def relative_logits(cfg: TargetConfig, moves, x) -> jnp.ndarray:
    """[R, A] the relative head's logits ``moves`` [R, len(RELATIVE_MOVES)] put on the pairs they move the
    teacher's pair (read from feature rows ``x`` [R, F]) to; a move off the levels adds to no pair. Why: a
    departure from the planner ("one PS more", "start it at one worker") is one weight here for every pair the
    planner may give, where the absolute logits must learn it pair by pair."""
    nl, np_ = cfg.num_levels, len(cfg.ps_levels)
    pair = features_teacher(cfg, x)
    w, p = pair // np_, pair % np_
    dw, dp = (jnp.asarray(d, jnp.int32) for d in zip(*RELATIVE_MOVES))
    w2, p2 = w[:, None] + dw[None, :], p[:, None] + dp[None, :]  # [R, moves]
    ok = (w2 >= 0) & (w2 < nl) & (p2 >= 0) & (p2 < np_)
    to = jnp.clip(w2, 0, nl - 1) * np_ + jnp.clip(p2, 0, np_ - 1)
    rows = jnp.broadcast_to(jnp.arange(x.shape[0])[:, None], to.shape)
    return jnp.zeros((x.shape[0], cfg.num_actions), moves.dtype).at[rows, to].add(jnp.where(ok, moves, 0.0))


def _heads(cfg: TargetConfig, params, forward, allreduce, x):
    """(logits [R, A], values [R]) of the actor's and critic's rows ``forward(set_params)``, an all-reduce job's
    pairs other than the first PS level closed (it has no PS: the pair means workers only); the teacher's pair
    raised by ``cfg.prior`` (feature rows ``x`` [R, F]); with teacher ``lp-plan``, the relative head added."""
    h = forward(params["actor"])
    logits = h @ params["logits"]["kernel"] + params["logits"]["bias"]
    if cfg.reads_plan:
        logits = logits + relative_logits(cfg, h @ params["relative"]["kernel"] + params["relative"]["bias"], x)
    if cfg.prior:
        logits = logits + cfg.prior * teacher_one_hot(cfg, x)
    v = (forward(params["critic"]) @ params["value"]["kernel"] + params["value"]["bias"])[:, 0]
    ps_index = jnp.arange(cfg.num_actions) % len(cfg.ps_levels)
    return jnp.where(allreduce.reshape(-1, 1) & (ps_index > 0), -1e9, logits), v


def apply(cfg: TargetConfig, params, x, active, allreduce):
    """(logits [..., J, L x Lp], values [..., J], 0 for an inactive job) of one slot or of a batch of slots
    (``x`` [..., J, F], ``active``/``allreduce`` [..., J]): :class:`TargetNet`'s function, computed by
    :func:`_set_forward`."""
    shape = active.shape
    logits, v = _heads(cfg, params, lambda p: _set_forward(p, x, active), allreduce, x.reshape(-1, x.shape[-1]))
    return logits.reshape(*shape, cfg.num_actions), jnp.where(active, v.reshape(shape), 0.0)


def apply_rows(cfg: TargetConfig, params, x, active, allreduce, slot, slots: int):
    """:func:`apply` on packed rows: the jobs of ``slots`` slots as rows ``x`` [R, F], ``slot`` [R] the slot
    of each (a row of ``slot`` >= ``slots`` is padding: inactive, pooled nowhere); (logits [R, A], values [R], 0
    for an inactive row). A batch whose slots have few active jobs each is a fraction of its dense rows (PPO's
    update: :func:`dl2d.policy.target.ppo.pack`)."""
    m = active.reshape(-1, 1).astype(x.dtype)
    pool = lambda v: jax.ops.segment_sum(v, slot, num_segments=slots)  # rows past `slots` dropped
    spread = lambda s: jnp.take(s, slot, axis=0, mode="clip")
    logits, v = _heads(cfg, params, lambda p: _set_layers(p, x, m, pool, spread), allreduce, x)
    return logits, jnp.where(active, v, 0.0)


def chosen(log_pi, action):
    """[...] the log-probability ``log_pi`` [..., A] gives each ``action`` [...]: a product with the one-hot
    action rather than a gather, whose gradient (a scatter) costs the CPU more than the whole product."""
    return jnp.sum(log_pi * jax.nn.one_hot(action, log_pi.shape[-1], dtype=log_pi.dtype), axis=-1)


def sample(key, logits):
    """[...] one action per row of ``logits`` [..., A], drawn from softmax(logits): one uniform per row against
    the cumulative probabilities. The same law as ``jax.random.categorical``, which draws a Gumbel variate for
    every one of the A actions: on the CPU that was the training rollout's largest cost (9 ms a slot of 64
    clusters x 40 jobs x 156 pairs). A pair of probability 0 (closed) is never drawn."""
    c = jnp.cumsum(jax.nn.softmax(logits, axis=-1), axis=-1)
    u = jax.random.uniform(key, logits.shape[:-1], c.dtype) * c[..., -1]
    return jnp.sum(c < u[..., None], axis=-1).astype(jnp.int32)


def sizes(cfg: TargetConfig, action, allreduce, dtype=jnp.float32):
    """(workers [J], PS [J]) the chosen pairs ask for (no PS for an all-reduce job)."""
    level, ps = action // len(cfg.ps_levels), action % len(cfg.ps_levels)
    return (jnp.asarray(cfg.levels, dtype)[level],
            jnp.where(allreduce, 0.0, jnp.asarray(cfg.ps_levels, dtype)[ps]))


# ------------------------------------------------------------------------------------------ the fill (pure)

def _most(limit, fixed, unit, free):
    """The largest whole count c in [0, ``limit``] with ``c * unit + fixed`` <= ``free`` (+ 1e-6) in every
    resource [3], -1 when not even 0 fits: the quotient's floor, checked and moved by one with the same sum the
    condition reads (so a rounding of the division never grants what the sum would refuse)."""
    room = free + 1e-6 - fixed
    per = jnp.where(unit > 0, room / jnp.where(unit > 0, unit, 1.0), jnp.inf)
    c = jnp.clip(jnp.floor(jnp.min(per)), 0.0, limit)
    fits = lambda n: jnp.all(n * unit + fixed <= free + 1e-6)
    return jnp.where((c + 1 <= limit) & fits(c + 1), c + 1,
                     jnp.where(fits(c), c, jnp.where((c >= 1) & fits(c - 1), c - 1, -1.0)))


def fill(cfg: TargetConfig, workers, ps, active, worker_demand, ps_demand, capacity, order_key):
    """(workers [J], PS [J]) granted: jobs in ``order_key`` order (smallest first; inactive last) take the most
    workers up to their target ``workers`` that still fit the aggregate ``capacity`` [3], with the most PS up
    to their target ``ps`` beside them (at least one for a PS job: ``ps`` > 0; nothing when even one worker
    and one PS do not fit). Pure; never over capacity, never more than a target, nothing for an inactive job.
    Each job's counts are computed, not searched: the most workers with one PS beside them (demands are not
    negative, so a count that fits with more PS fits with one), then the most PS beside those workers."""
    order = jnp.argsort(jnp.where(active, order_key, jnp.inf))
    dt = worker_demand.dtype

    def body(free, j):
        wd, pd = worker_demand[j], ps_demand[j]
        w_cap = jnp.minimum(jnp.floor(workers[j]), cfg.max_workers).astype(dt)
        p_cap = jnp.minimum(jnp.floor(ps[j]), cfg.max_ps).astype(dt)
        is_ps = ps[j] > 0  # then workers only with PS beside them (a PS target below one: nothing)
        w = _most(w_cap, jnp.where(is_ps, 1.0, 0.0).astype(dt) * pd, wd, free)
        w = jnp.where(active[j] & jnp.where(is_ps, (w >= 1) & (p_cap >= 1), w >= 0), w, 0.0).astype(dt)
        p = jnp.where(is_ps & (w > 0), _most(p_cap, w * wd, pd, free), 0.0).astype(dt)
        return free - w * wd - p * pd, (j, w, p)

    _, (idx, w, p) = jax.lax.scan(body, jnp.asarray(capacity, dt), order)
    zero = jnp.zeros(workers.shape, dt)
    return zero.at[idx].set(w), zero.at[idx].set(p)


# ------------------------------------------------------------------------------------------ the decision (pure)

def decide(cfg: TargetConfig, params, obs: dict, kinds: tuple[str, ...], key=None, temperature: float = 1.0) -> dict:
    """One slot's choice for every job of ``obs`` (dl2d.policy.target.view.view_obs, padded): the greedy pair, or
    (``key``) one sampled from softmax(logits / ``temperature``), its log-probability under that; a job of a kind the
    policy never trained on (``kinds``: "ps", "allreduce") gets its teacher's pair (the network's choice for it
    is a guess: today's policy starved PS jobs). Pure (JAX): {"action", "greedy" (the greedy pair, = "action"
    without ``key``), "log_prob", "value", "x" (the features), "known"} [J]."""
    o = with_optimus(obs)
    x = job_features(cfg, o)
    logits, value = apply(cfg, params, x, o["active"], o["allreduce"])
    logits = logits / temperature
    known = jnp.where(o["allreduce"], "allreduce" in kinds, "ps" in kinds)
    teacher = features_teacher(cfg, x)
    greedy = jnp.where(known, jnp.argmax(logits, axis=1), teacher)
    action = greedy if key is None else jnp.where(known, sample(key, logits), teacher)
    log_prob = chosen(jax.nn.log_softmax(logits), action)
    return {"action": action, "greedy": greedy, "log_prob": log_prob, "value": value, "x": x, "known": known}
