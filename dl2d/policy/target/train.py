"""Training the target-size policy (dl2d.policy.target.policy) in either world: the shell around dl2d.policy.target.ppo that
`dl2ctl train --policy dl2-target` and bench/bench_ppo.py share.

What it does: builds the world's training traces (one per parallel cluster, every cluster restarting its trace
when it finishes) and held-out validation traces, runs supervised warm-up towards the teacher (``teacher``:
Optimus or elastic, dl2d.policy.target.teachers; ``sl_iters``) and then slot-level PPO (``rl_iters``) on the JAX
environment, evaluates the greedy policy on the validation traces every ``eval_every`` iterations, and keeps the
parameters with the lowest validation JCT. Between the two, ``plan_rounds`` rounds of learning the planner on the
measured speeds (dl2d.policy.planning.plan_distill; the phase "plan"): the first clones the planner's own runs of
``plan_traces`` training traces in the NumPy simulator, each later one lets the network drive them while the
planner labels (DAgger), and the network is fitted to every slot labelled so far. The planner comes within 2-4 %
of the LP bound in the DL2 world where the greedy teachers stay 8-12 % above it, and PPO from those teachers never
found that room (docs/BENCHMARKS.md); in today's world it is elastic's equal, so there it is off by default. The
teacher (through the same fill) runs the same validation traces in the same environment, so the result says
whether the policy beat it. ``prior`` starts the policy as its teacher
(dl2d.policy.target.policy.TargetConfig.prior).

A site's speed model (``site``: `dl2ctl calibrate`'s curves) makes the environment a twin of that site: its
curves are the truth and the scheduler's belief for the models it holds, in training and validation alike.

Seeds: the training traces are ``seed .. seed + clusters - 1``, the validation traces ``val_seed ..
val_seed + val_traces - 1``; :func:`seed_overlap` says when they meet (the validation must be held out).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np

from dl2d.policy.target import ppo as P
from dl2d.policy.target import policy as T
from dl2d.sim import jaxenv as X
from dl2d.sim import trace as TR
from dl2d.sim.engine import SimConfig
from dl2d.sim.worlds import world as world_named
from dl2d.workload.philly import STYLES as PHILLY_STYLES
from dl2d.workload.seeds import seed_list


#: today's workload styles (dl2d.workload.philly's), and "both": even trace seeds as submitted, odd ones tuned
STYLES = (*PHILLY_STYLES, "both")


def style_of(style: str, seed: int) -> str:
    """The Philly generator's style for trace ``seed`` of a setup's ``style``."""
    return ("realistic", "tuned")[seed % 2] if style == "both" else style


@dataclass(frozen=True)
class TrainSetup:
    """Everything that decides a training run (recorded in the checkpoint's meta)."""

    world: str = "today"
    cluster: str | None = None  # preset; None: the world's
    servers: int | None = None  # overrides the preset's count
    jobs: int = 40  # jobs per trace (the environment's J)
    load: float = 1.0  # today: the Philly workload's load on the cluster's GPUs
    style: str = "realistic"  # today: the jobs as submitted, "tuned" as Pollux tuned them, or "both" (by seed parity)
    clusters: int = 64  # parallel training clusters, one training trace each
    slots: int = 32  # slots per rollout
    teacher: str = "optimus"  # the heuristic the warm-up imitates (dl2d.policy.target.teachers)
    prior: float = 0.0  # added to the teacher's pair's logit (dl2d.policy.target.policy.TargetConfig.prior)
    every_count: bool = False  # every whole count a level (TargetConfig.every_count: the DL2 world's shipped one)
    sl_iters: int = 30  # supervised warm-up iterations towards the teacher
    rl_iters: int = 80  # PPO iterations
    plan_rounds: int = 0  # rounds of learning the planner (plan_distill), between the warm-up and PPO
    plan_traces: int = 8  # training traces (the first ones) the planner labels in each round
    plan_iters: int = 2000  # Adam steps fitting the network to the planner's labels, per round
    plan_lr: float = 5e-4
    sl_lr: float = 1e-3
    lr: float = 1e-4
    ent_coef: float = 0.0
    credit: str = "job"  # dl2d.policy.target.ppo.PPOConfig.credit
    team_weight: float = 0.0
    eval_every: int = 10
    seed: int = 0  # first training trace seed
    rng: int = 0  # the network's initialisation and the rollouts' sampling
    val_seed: int = 10_000  # first validation trace seed
    val_traces: int = 5
    max_eval_slots: int = 20_000  # a validation episode is cut here (its unfinished jobs count as running until then)

    def __post_init__(self):
        for name in ("jobs", "clusters", "slots", "eval_every", "val_traces", "max_eval_slots", "plan_traces",
                     "plan_iters"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if min(self.sl_iters, self.rl_iters, self.plan_rounds) < 0:
            raise ValueError("sl_iters, rl_iters and plan_rounds must be >= 0")
        if self.sl_iters + self.rl_iters + self.plan_rounds == 0:
            raise ValueError("nothing to train: sl_iters, plan_rounds and rl_iters are all 0")
        if self.plan_rounds and self.plan_traces > self.clusters:
            raise ValueError(f"plan_traces ({self.plan_traces}) is more than the training traces ({self.clusters})")
        world_named(self.world)  # a ValueError naming the worlds
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {self.style!r}")
        if self.style != "realistic" and self.world != "today":
            raise ValueError(f"style {self.style!r} is a style of today's Philly workloads: --world today only")
        T.TargetConfig(teacher=self.teacher, prior=self.prior)  # a ValueError naming a bad teacher or prior
        from dl2d.policy.target.teachers import teacher

        teacher(self.teacher)  # the JAX heuristics only: lp-plan's pair is no JAX function (dl2d.policy.planning.plan_net)

    def training_seeds(self) -> range:
        return range(self.seed, self.seed + self.clusters)

    def validation_seeds(self) -> range:
        return range(self.val_seed, self.val_seed + self.val_traces)


def seed_overlap(setup: TrainSetup) -> list[int]:
    """Validation seeds that are also training seeds (none, for a held-out validation)."""
    return sorted(set(setup.training_seeds()) & set(setup.validation_seeds()))


def held_out_seeds(text: str, meta: dict) -> list[int]:
    """The trace seeds of ``text`` (dl2d.workload.seeds), refused (ValueError, naming them) where a checkpoint's meta
    says they were used for its training or validation."""
    seeds = seed_list(text)
    used = set()
    for key in ("train_seeds", "validation_seeds"):
        lo, hi = meta.get(key) or (0, -1)
        used |= set(range(int(lo), int(hi) + 1))
    if used & set(seeds):
        raise ValueError(f"seeds {sorted(used & set(seeds))} were used in training or validation")
    return seeds


def sim_config(setup: TrainSetup, site=None) -> SimConfig:
    """The world's simulator config on the setup's cluster, with a site's speed curves when given."""
    cfg = world_named(setup.world).sim_config(setup.cluster)
    cluster = cfg.cluster if setup.servers is None else dataclasses.replace(cfg.cluster, num_servers=setup.servers)
    return dataclasses.replace(cfg, cluster=cluster, site_speeds=site)


def make_trace(setup: TrainSetup, cfg: SimConfig, seed: int) -> TR.Trace:
    """One trace of the setup's world: DL2's generator, or a seeded Philly workload at the setup's load. With a
    site's speed model that records its job mix (``dl2ctl calibrate``), the jobs are of the site's own classes,
    as often and as long as they came (dl2d.sim.trace.from_workload's ``site_mix``)."""
    if setup.world == "dl2":
        return TR.generate(TR.TraceConfig(num_jobs=setup.jobs), seed=seed)
    from dl2d.workload import philly

    style = style_of(setup.style, seed)
    wl = philly.generate(setup.jobs, load=setup.load, cluster_gpus=int(cfg.cluster.capacity[0]), seed=seed,
                         max_gpus=cfg.max_workers, style=style)
    mix = cfg.site_speeds.mix if cfg.site_speeds is not None else ()
    return TR.from_workload(wl, cfg.slot_seconds, seed=seed,
                            config={"workload": "philly", "load": setup.load, "style": style}, site_mix=mix)


def lower_bound(traces, cfg: SimConfig, bucket_s: float | None = None) -> dict | None:
    """The mean LP lower bound on the average JCT of ``traces`` (dl2d.sim.lp_bound; ``bucket_s``: its buckets,
    default whole slots), in slots: at the slot noise's upper end ("every_run", a bound for any run) and at
    nominal speed ("nominal", what any policy can expect at best). None where the program does not apply
    (heterogeneous servers)."""
    from dl2d.sim.lp_bound import lp_lower_bound

    if cfg.heterogeneous:  # asked by name: any other ValueError of the program is a fault to show, not hide
        return None
    return {label: round(float(np.mean([lp_lower_bound(t, c, bucket_s).avg_jct_slots for t in traces])), 3)
            for label, c in (("every_run", cfg), ("nominal", dataclasses.replace(cfg, slot_noise=0.0)))}


def target_config(cfg: SimConfig, teacher: str = "optimus", prior: float = 0.0,
                  every_count: bool = False) -> T.TargetConfig:
    return T.TargetConfig(max_workers=cfg.max_workers, max_ps=cfg.max_ps, teacher=teacher, prior=prior,
                          every_count=every_count)


def average_jcts(final, cut: int) -> tuple[list[float], int]:
    """Average JCT in slots of every cluster of a batch of final states; a job unfinished at slot ``cut`` counts
    as running until then (a lower bound on its JCT). Also how many jobs were unfinished."""
    fin = np.asarray(final.finished)
    submitted = np.asarray(final.jobs.submitted, float)
    jct = np.where(fin, np.asarray(jax.vmap(X.jct)(final)), cut - submitted)
    valid = np.asarray(final.jobs.valid)
    return [float(jct[i][valid[i]].mean()) for i in range(len(fin))], int((~fin & valid).sum())


def run_to_end(episodes: Callable, states, max_slots: int, chunk: int = 500):
    """Run ``episodes(states, chunk)`` (a jitted greedy run without auto-reset) chunk by chunk until every
    cluster has finished or ``max_slots`` slots have passed: the final states and the slot reached."""
    done = 0
    while done < max_slots:
        states = episodes(states, chunk)
        done += chunk
        if bool(np.all(np.asarray(states.finished))):
            break
    return states, int(np.max(np.asarray(states.slot)))


@dataclass
class TrainResult:
    config: T.TargetConfig
    params: dict  # the chosen parameters (lowest validation JCT)
    chosen: dict  # the evaluation row they come from
    curve: list[dict]  # every evaluation
    teacher_val: list[float]  # the teacher through the same fill, on the validation traces
    cluster_slots_per_s: float | None  # in training iterations (the first of each phase, which compiles, excluded)

    @property
    def val_jct(self) -> float:
        return float(self.chosen["val_mean"])

    @property
    def teacher_val_jct(self) -> float:
        return float(np.mean(self.teacher_val))


def train(setup: TrainSetup, site=None, init_params=None, on_progress: Callable[[str, int, int], None] | None = None,
          on_eval: Callable[[dict], None] | None = None, extra_eval: Callable | None = None) -> TrainResult:
    """Train as the module docstring says. ``init_params``: warm-start parameters (of the same TargetConfig).
    ``on_progress(phase, iteration, iterations)`` after every iteration; ``on_eval(row)`` after every evaluation;
    ``extra_eval(net) -> dict`` adds fields to every evaluation row (bench_ppo: the held-out test traces)."""
    cfg = sim_config(setup, site)
    tc = target_config(cfg, setup.teacher, setup.prior, setup.every_count)
    rl = P.PPOConfig(clusters=setup.clusters, slots=setup.slots, lr=setup.lr, ent_coef=setup.ent_coef,
                       credit=setup.credit, team_weight=setup.team_weight)
    sl = dataclasses.replace(rl, lr=setup.sl_lr)
    train_traces = [make_trace(setup, cfg, s) for s in setup.training_seeds()]
    val_traces = [make_trace(setup, cfg, s) for s in setup.validation_seeds()]
    env, states = X.from_traces(train_traces, cfg, setup.jobs, placement=False)
    _, val_states = X.from_traces(val_traces, cfg, setup.jobs, placement=False)

    def val_score(episodes) -> tuple[list[float], int]:
        final, reached = run_to_end(episodes, val_states, setup.max_eval_slots)
        return average_jcts(final, reached)

    teacher_val, _ = val_score(lambda s, n: P.evaluate_teacher(tc, env, s, n))
    runner = P.init_runner(tc, sl if setup.sl_iters else rl, states, jax.random.PRNGKey(setup.rng), init_params)
    curve: list[dict] = []
    best: dict = {"val": np.inf}
    clock = {"train_s": 0.0, "timed_slots": 0, "slots": 0}

    def evaluate(phase: str, it: int, net=None) -> None:
        net = runner[0] if net is None else net
        jcts, unfinished = val_score(lambda s, n: P.evaluate(tc, env, net, s, n))
        row = {"phase": phase, "iter": it, "cluster_slots": clock["slots"], "train_s": round(clock["train_s"], 1),
               "val_jct": [round(x, 3) for x in jcts], "val_mean": round(float(np.mean(jcts)), 3),
               "val_unfinished_jobs": unfinished}
        if extra_eval is not None:
            row.update(extra_eval(net))
        curve.append(row)
        if on_eval is not None:
            on_eval(row)
        if row["val_mean"] < best["val"]:
            best.update(val=row["val_mean"], params=jax.device_get(net), row=row)

    def run_phase(phase: str, iters: int, fn: Callable, pc: P.PPOConfig) -> None:
        """``iters`` jitted iterations of ``fn`` (the warm-up's or PPO's step), timed and evaluated."""
        nonlocal runner
        for it in range(1, iters + 1):
            t0 = time.perf_counter()
            runner, stats = fn(tc, pc, env, runner)
            jax.block_until_ready(stats)
            if it > 1:  # the first iteration of a phase compiles
                clock["train_s"] += time.perf_counter() - t0
                clock["timed_slots"] += pc.clusters * pc.slots
            clock["slots"] += pc.clusters * pc.slots
            if on_progress is not None:
                on_progress(phase, it, iters)
            if it == 1 or it % setup.eval_every == 0 or it == iters:
                evaluate(phase, it)

    if init_params is not None:
        evaluate("init", 0)
    run_phase("sl", setup.sl_iters, P.sl_step, sl)
    if setup.plan_rounds:
        net = learn_planner(setup, tc, cfg, train_traces[:setup.plan_traces], runner[0], evaluate, on_progress)
        runner = P.init_runner(tc, rl, runner[2], runner[3], net)  # PPO then starts a fresh optimiser state
    # otherwise RL goes on with the warm-up's optimiser state (its Adam moments), at the RL learning rate
    run_phase("rl", setup.rl_iters, P.train_step, rl)
    rate = clock["timed_slots"] / clock["train_s"] if clock["train_s"] > 0 else None
    return TrainResult(tc, best["params"], best["row"], curve, [round(x, 3) for x in teacher_val], rate)


def learn_planner(setup: TrainSetup, tc: T.TargetConfig, cfg: SimConfig, traces: list, net, evaluate: Callable,
                  on_progress: Callable[[str, int, int], None] | None = None):
    """The phase "plan" (module docstring): ``setup.plan_rounds`` rounds, each collecting the planner's labels on
    ``traces`` (the planner drives in the first round, the network ``net`` in the later ones), fitting the network
    to every slot labelled so far and calling ``evaluate("plan", round, net)``; the last round's parameters. Progress
    is counted in traces labelled."""
    from dl2d.policy.planning import plan_distill as D
    seeds = list(setup.training_seeds())[:len(traces)]
    total, done = setup.plan_rounds * len(traces), 0
    data = None

    def on_trace(*_):
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress("plan", done, total)

    for rnd in range(1, setup.plan_rounds + 1):
        new = D.collect(tc, cfg, traces, seeds, None if rnd == 1 else net, on_trace=on_trace)
        data = new if data is None else D.Samples.concat([data, new])
        net, _ = D.fit(tc, net, data, setup.plan_iters, lr=setup.plan_lr, seed=setup.rng + rnd)
        evaluate("plan", rnd, net)
    return net


def rescore(path: str, why: str, site=None) -> dict:
    """Score a checkpoint again on its validation traces, greedy as training scored it, with its teacher beside
    it, and write the figures into its meta (the network unchanged), saying ``why``: what a simulator change does
    to a shipped policy's recorded figures, without training it again. ``site``: the speed model it was trained
    on, where its meta names one. The new meta."""
    from dl2d.policy.checkpoint import TargetCheckpoint, load_target, save_target

    ckpt = load_target(path)
    meta = ckpt.meta
    if meta.get("speed_model") and site is None:
        raise ValueError(f"{path} was trained on the speed model {meta['speed_model']}: give it (site=)")
    setup = TrainSetup(**meta["setup"])
    cfg = sim_config(setup, site)
    val = [make_trace(setup, cfg, s) for s in setup.validation_seeds()]
    env, states = X.from_traces(val, cfg, setup.jobs, placement=False)

    def score(episodes) -> list[float]:
        final, reached = run_to_end(episodes, states, setup.max_eval_slots)
        return [round(x, 3) for x in average_jcts(final, reached)[0]]

    net = score(lambda s, n: P.evaluate(ckpt.config, env, ckpt.params, s, n))
    teacher = score(lambda s, n: P.evaluate_teacher(ckpt.config, env, s, n))
    was = {k: meta[k] for k in ("validation_jct", "teacher_validation_jct")}
    meta = {**meta, "validation_jct": net, "validation_jct_mean": round(float(np.mean(net)), 3),
            "teacher_validation_jct": teacher, "teacher_validation_jct_mean": round(float(np.mean(teacher)), 3),
            "rescored": {"why": why, "by": "dl2d.policy.target.train.rescore", "before": was}}
    save_target(path, TargetCheckpoint(ckpt.config, ckpt.params, meta))
    return meta


def checkpoint_meta(setup: TrainSetup, result: TrainResult, command: str, site=None, **extra) -> dict:
    """What a trained checkpoint records of how it was made and how it scored on its validation traces."""
    import dl2d

    chosen = result.chosen
    return {"world": setup.world, "cluster": setup.cluster or world_named(setup.world).cluster,
            "servers": setup.servers, "jobs": setup.jobs, "load": setup.load if setup.world == "today" else None,
            "train_seeds": [setup.seed, setup.seed + setup.clusters - 1],
            "validation_seeds": [setup.val_seed, setup.val_seed + setup.val_traces - 1],
            "chosen": f"{chosen['phase']} iteration {chosen['iter']}", "validation_jct": chosen["val_jct"],
            "validation_jct_mean": chosen["val_mean"], "teacher": setup.teacher,
            "teacher_validation_jct": result.teacher_val,
            "teacher_validation_jct_mean": round(result.teacher_val_jct, 3),
            "speed_model": getattr(site, "source", None) if site is not None else None,
            "setup": dataclasses.asdict(setup), "command": command, "dl2d_version": dl2d.__version__, **extra}
