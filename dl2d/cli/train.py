"""`dl2ctl train`: supervised warm-up of a learned policy from a heuristic, then learning in the simulator.
``--policy dl2-target`` (the default, the kind that ships) is the target-size policy in either world: warm-up
from the world's best heuristic, in the DL2 world the planner on the measured speeds, then slot-level PPO, on a
site's speed model when one is given (dl2d.cli.train_target). ``--policy dl2`` is DL2's per-inference
actor-critic in the DL2 world (this module), kept for the paper's ablation.

``--policy dl2``: training traces use seeds `seed, seed + 1, ...` (first the SL traces, then one per RL
episode); the held-out validation trace uses `--val-seed` (default seed + 10000), which must not be one of them.
The result is a policy checkpoint that `dl2ctl sim --policy dl2 --checkpoint PATH` and the daemon load.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import suppress
from pathlib import Path

import click

from dl2d.cli.options import finite_number, flags, given_options
from dl2d.policy import registry
from dl2d.sim.cluster import MAX_SERVERS, PRESETS
from dl2d.sim.trace import MAX_TRACE_JOBS
from dl2d.sim.worlds import DEFAULT_WORLD, WORLDS
from dl2d.workload.philly import STYLES as WORKLOAD_STYLES

TEACHERS = registry.names(heuristic=True)
CLUSTERS = tuple(PRESETS)
TRAINABLE = ("dl2", "dl2-target")
#: Options that only one of the policies reads: given with the other, they are an error, not silently ignored.
DL2_ONLY = ("sl_epochs", "sl_traces", "rl_steps", "max_jobs", "hidden", "n_step", "entropy_weight",
            "epsilon", "updates_per_slot", "rl_lr", "advantage", "val_every")
TARGET_ONLY = ("world", "speed_model", "load", "style", "clusters", "slots", "sl_iters", "rl_iters", "lr", "sl_lr",
               "val_traces", "eval_every", "credit", "prior", "plan_rounds", "plan_traces", "plan_iters")


def _command(ctx: click.Context) -> str:
    """The command line as given (recorded in the checkpoint: how to make it again), with ``--policy`` always
    (its default was dl2, it is now dl2-target: a recorded command means the same whichever reads it)."""
    parts = ["dl2ctl", "train", "--policy", ctx.params["policy"]]
    for p in ctx.command.params:
        if p.name != "policy" and p.name in ctx.params and given_options(ctx, [p.name]):
            value = ctx.params[p.name]
            if getattr(p, "is_flag", False):
                parts += [p.opts[0]] if value else []
            else:
                parts += [p.opts[0], str(value)]
    return " ".join(parts)


def _training_seeds(seed: int, sl_traces: int, rl_steps: int) -> range:
    """Every seed a training trace may use (an RL episode is at least one slot, so at most rl_steps of them)."""
    return range(seed, seed + sl_traces + rl_steps)


def out_problem(path: Path) -> str | None:
    """Why a checkpoint cannot be written at ``path``, or None. Asked before training, so that hours of it are not
    lost at the end: the directory must exist and take a new file. A probe file is created there and removed,
    so permissions and read-only mounts count as the kernel applies them (root included, for whom os.access
    says yes to nearly everything)."""
    parent = path.parent
    if not parent.exists():
        return f"directory {str(parent)!r} does not exist"
    if not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
    except OSError as e:
        return f"cannot create a file in {str(parent)!r} ({e.strerror})"
    os.close(fd)
    with suppress(OSError):
        os.unlink(probe)
    return None


def _rescue(save, out_path: Path, error: OSError) -> click.ClickException:
    """The checkpoint could not be written at --out after all (the directory changed while training ran): write
    it to a temporary file instead and say where, rather than lose the trained policy."""
    try:
        fd, rescue = tempfile.mkstemp(prefix="dl2-policy-", suffix=".ckpt")
        os.close(fd)
        save(rescue)
        where = f"the trained policy was written to {rescue} instead"
    except OSError as e:
        where = f"nor to a temporary file ({e.strerror}): the trained policy is lost"
    return click.ClickException(f"cannot write --out {out_path} ({error.strerror}); {where}")


@click.command()
@click.option("--policy", type=click.Choice(TRAINABLE), default="dl2-target", show_default=True,
              help="dl2-target (what ships): a learned size for every job, in either world: warm-up from the "
                   "world's best heuristic, then (DL2 world) the planner, then slot-level PPO in the JAX simulator; "
                   "dl2: DL2's per-inference actor-critic (DL2 world, the paper's ablation).")
@click.option("--world", type=click.Choice(tuple(WORLDS)), default=DEFAULT_WORLD, show_default=True,
              help="dl2-target: the world it trains in (today: all-reduce jobs, Philly workloads, measured speeds).")
@click.option("--speed-model", metavar="FILE", default=None,
              help="dl2-target, --world today: a speed-model FILE from `dl2ctl calibrate`; its curves are the "
                   "truth and the scheduler's belief for the models it holds (train on a twin of that cluster).")
@click.option("--load", type=click.FloatRange(0, 100, min_open=True), callback=finite_number, default=1.0,
              show_default=True, help="dl2-target, --world today: the generated Philly workloads' load.")
@click.option("--style", type=click.Choice([*WORKLOAD_STYLES, "both"]), default="realistic", show_default=True,
              help="dl2-target, --world today: the generated jobs as their users submitted them (realistic), each "
                   "given a configuration (GPUs, batch) as Pollux's evaluation tuned its jobs (tuned), or both "
                   "(even trace seeds realistic, odd ones tuned).")
@click.option("--clusters", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="dl2-target: parallel simulated clusters, one training trace each.")
@click.option("--slots", type=click.IntRange(1, 10_000), default=32, show_default=True,
              help="dl2-target: slots per rollout.")
@click.option("--sl-iters", type=click.IntRange(min=0), default=30, show_default=True,
              help="dl2-target: supervised warm-up iterations towards the teacher.")
@click.option("--rl-iters", type=click.IntRange(min=0), default=80, show_default=True,
              help="dl2-target: PPO iterations.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), callback=finite_number, default=1e-4,
              show_default=True, help="dl2-target: PPO learning rate.")
@click.option("--sl-lr", type=click.FloatRange(min=0, min_open=True), callback=finite_number, default=1e-3,
              show_default=True, help="dl2-target: warm-up learning rate.")
@click.option("--prior", type=click.FloatRange(0, 50), callback=finite_number, default=0.0, show_default=True,
              help="dl2-target: added to the logit of the teacher's pair, so the policy starts as its teacher and "
                   "falls back on it where it has not learned better (0: none).")
@click.option("--plan-rounds", type=click.IntRange(min=0), default=None,
              help="dl2-target: rounds of learning the planner on the measured speeds between the warm-up and PPO: "
                   "the first imitates its own runs, each later one labels the network's (DAgger); in the DL2 "
                   "world the network then has every whole count as a level [default: 2 in the DL2 world, 0 today].")
@click.option("--plan-traces", type=click.IntRange(min=1), default=None,
              help="dl2-target: training traces the planner labels in each round (one linear program a slot) "
                   "[default: 8, or --clusters if fewer].")
@click.option("--plan-iters", type=click.IntRange(min=1), default=2000, show_default=True,
              help="dl2-target: Adam steps fitting the planner's labels, per round.")
@click.option("--credit", type=click.Choice(("job", "slot")), default="job", show_default=True,
              help="dl2-target: PPO's credit: each job's size against its own advantage (job), or the slot's "
                   "allocation as one action against the slot's (slot).")
@click.option("--val-traces", type=click.IntRange(1, 1000), default=None,
              help="dl2-target: validation traces (seeds val-seed..): the policy kept is the best on them "
                   "[default: 20 today, 5 in the DL2 world].")
@click.option("--eval-every", type=click.IntRange(min=1), default=10, show_default=True,
              help="dl2-target: validate every N iterations (and after the first and last of each phase).")
@click.option("--teacher", type=click.Choice(TEACHERS), default=None,
              help="Heuristic the policy imitates in the supervised warm-up [default: drf for dl2; for dl2-target, "
                   "which learns from optimus, optimus-relative or elastic, the world's best heuristic: elastic "
                   "today, optimus-relative in the DL2 world].")
@click.option("--sl-epochs", type=click.IntRange(min=0), default=None,
              help="Supervised epochs [default: 20, or 0 with --init].")
@click.option("--sl-traces", type=click.IntRange(min=1), default=2, show_default=True,
              help="Training traces the teacher is replayed on.")
@click.option("--rl-steps", type=click.IntRange(min=0), default=0, show_default=True,
              help="Simulated slots of online RL (one update per slot once the replay is warm); 0 = SL only.")
@click.option("--jobs", type=click.IntRange(1, MAX_TRACE_JOBS), default=40, show_default=True,
              help="Jobs per trace.")
@click.option("--cluster", type=click.Choice(CLUSTERS), default=None,
              help="Cluster preset [default: small for dl2; the world's for dl2-target].")
@click.option("--servers", type=click.IntRange(1, MAX_SERVERS), default=None,
              help=f"Number of servers (2 GPUs, 8 cores, 48 GB each; at most {MAX_SERVERS}); overrides --cluster.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="First training trace seed.")
@click.option("--val-seed", type=click.IntRange(min=0), default=None,
              help="Seed of the held-out validation trace [default: seed + 10000].")
@click.option("--val-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="Validate the greedy policy every N RL slots (0: only after SL and at the end).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("dl2-policy.ckpt"),
              show_default=True, help="Checkpoint to write.")
@click.option("--init", "init_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Resume from this checkpoint (its config, parameters and RL optimiser state).")
@click.option("--max-jobs", type=click.IntRange(min=1), default=None,
              help="Window size J of the policy [default: 40, or the --init checkpoint's].")
@click.option("--hidden", type=click.IntRange(min=1), default=None,
              help="Hidden units per layer [default: 256, or the --init checkpoint's].")
@click.option("--n-step", type=click.IntRange(min=1), default=None,
              help="RL: slots of rewards in the critic's target before bootstrapping [default: config's, 1].")
@click.option("--entropy-weight", type=click.FloatRange(min=0), callback=finite_number,
              default=None,
              help="RL: entropy regularisation beta [default: config's, 0.1].")
@click.option("--epsilon", type=click.FloatRange(0, 1), callback=finite_number,
              default=None,
              help="RL: job-aware exploration probability in a poor state [default: config's, 0.2].")
@click.option("--updates-per-slot", type=click.IntRange(min=1), default=None,
              help="RL: minibatch updates after each simulated slot [default: config's, 1].")
@click.option("--rl-lr", type=click.FloatRange(min=0, min_open=True), callback=finite_number,
              default=None,
              help="RL: Adam learning rate [default: config's, 1e-4].")
@click.option("--advantage", type=click.Choice(("critic", "greedy")), default=None,
              help="RL: advantage from the value network (DL2) or over the greedy policy's reward on the same "
                   "simulated slot [default: config's, critic].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table.")
@click.pass_context
def train(ctx, policy, world, speed_model, load, style, clusters, slots, sl_iters, rl_iters, lr, sl_lr, prior,
          plan_rounds, plan_traces, plan_iters, credit,
          val_traces, eval_every, teacher, sl_epochs, sl_traces, rl_steps, jobs, cluster, servers, seed, val_seed,
          val_every, out_path, init_path, max_jobs, hidden, n_step, entropy_weight, epsilon, updates_per_slot, rl_lr,
          advantage, as_json) -> None:
    """Train a learned policy: imitate a heuristic, then learn by reinforcement in the simulator; save a checkpoint.

    \b
    Examples:
      dl2ctl train --out today.msgpack               # the target-size policy, today's world, from elastic
      dl2ctl train --world dl2 --out dl2.msgpack     # the DL2 world: from the relative Optimus, then the planner
      dl2ctl train --speed-model site.json --out site.msgpack   # a twin of this cluster
      dl2ctl train --policy dl2 --out dl2.ckpt       # DL2's actor-critic, imitating drf, DL2 world
    """
    wrong = given_options(ctx, TARGET_ONLY if policy == "dl2" else DL2_ONLY)
    if wrong:
        raise click.UsageError(f"{flags(wrong)} only appl{'ies' if len(wrong) == 1 else 'y'} to --policy "
                               f"{'dl2-target' if policy == 'dl2' else 'dl2'}")
    if val_seed is None:
        val_seed = seed + 10_000
    if policy == "dl2-target":
        from dl2d.policy.target.teachers import TEACHERS as TARGET_TEACHERS

        teacher = teacher or WORLDS[world].best_heuristic
        if teacher not in TARGET_TEACHERS:
            raise click.BadParameter(f"{teacher!r} is not one --policy dl2-target learns from; choose from "
                                     f"{', '.join(TARGET_TEACHERS)}", param_hint="--teacher")
        problem = out_problem(out_path)
        if problem:
            raise click.BadParameter(f"{problem}: the checkpoint could not be written after training",
                                     param_hint="--out")
        from dl2d.cli import train_target

        train_target.run(world=world, teacher=teacher, cluster=cluster, servers=servers, jobs=jobs, load=load,
                         style=style,
                         clusters=clusters, slots=slots, sl_iters=sl_iters, rl_iters=rl_iters, sl_lr=sl_lr, lr=lr,
                         prior=prior, plan_rounds=WORLDS[world].plan_rounds if plan_rounds is None else plan_rounds,
                         plan_traces=min(8, clusters) if plan_traces is None else plan_traces,
                         plan_iters=plan_iters, credit=credit, seed=seed, val_seed=val_seed,
                         val_traces=WORLDS[world].val_traces if val_traces is None else val_traces,
                         eval_every=eval_every, speed_model=speed_model, init_path=init_path, out_path=out_path,
                         as_json=as_json, command=_command(ctx), rescue=_rescue)
        return
    cluster = cluster or "small"
    teacher = teacher or "drf"
    if sl_epochs is None:
        sl_epochs = 0 if init_path else 20
    if sl_epochs == 0 and rl_steps == 0 and init_path is None:
        raise click.UsageError("nothing to train: give --sl-epochs and/or --rl-steps")
    if val_seed in _training_seeds(seed, sl_traces, rl_steps):
        raise click.BadParameter(f"{val_seed} is also a training trace seed (training uses seeds {seed}.."
                                 f"{seed + sl_traces + rl_steps - 1}); the validation trace must be held out",
                                 param_hint="--val-seed")
    problem = out_problem(out_path)
    if problem:
        raise click.BadParameter(f"{problem}: the checkpoint could not be written after training",
                                 param_hint="--out")

    import jax
    import numpy as np
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Table

    from dl2d.policy import checkpoint as C
    from dl2d.policy.dl2 import learn as LN
    from dl2d.policy.dl2 import train as T
    from dl2d.policy.dl2.config import PolicyConfig
    from dl2d.policy.dl2.nets import init_params
    from dl2d.policy.registry import make_heuristic
    from dl2d.sim import engine as E
    from dl2d.sim.cluster import ClusterSpec, preset
    from dl2d.sim.trace import TraceConfig, generate

    err = Console(stderr=True)
    opt_state, meta0 = None, {}
    if init_path is not None:
        try:
            ck = C.load(init_path)
        except C.CheckpointError as e:
            raise click.ClickException(str(e)) from None
        cfg, params, opt_state, meta0 = ck.config, ck.params, ck.opt_state, ck.meta
        for name, given, have in (("--max-jobs", max_jobs, cfg.max_jobs), ("--hidden", hidden, cfg.hidden)):
            if given is not None and given != have:
                raise click.BadParameter(f"{given} differs from the checkpoint's {have}", param_hint=name)
    else:
        cfg = PolicyConfig(max_jobs=max_jobs or 40, hidden=hidden or 256)
        params = init_params(cfg, jax.random.PRNGKey(seed))
    rl_overrides = {k: v for k, v in (("n_step", n_step), ("entropy_weight", entropy_weight), ("epsilon", epsilon),
                                      ("updates_per_slot", updates_per_slot), ("rl_lr", rl_lr),
                                      ("advantage", advantage)) if v is not None}
    if rl_overrides:  # RL hyper-parameters only: they change no shape, so a checkpoint's parameters still fit
        from dataclasses import replace as _replace
        cfg = _replace(cfg, **rl_overrides)
    spec = ClusterSpec(servers) if servers else preset(cluster)
    sim = E.SimConfig(cluster=spec, max_workers=cfg.max_workers, max_ps=cfg.max_ps)
    tcfg = TraceConfig(num_jobs=jobs)
    val_trace = generate(tcfg, seed=val_seed)

    def val_jct(p) -> float:
        return T.validate(cfg, p, val_trace, sim).avg_jct_slots

    t0 = time.perf_counter()
    result: dict = {"teacher": teacher, "cluster": {"servers": spec.num_servers}, "jobs": jobs, "seed": seed,
                    "val_seed": val_seed, "config": cfg.to_dict(), "init": str(init_path) if init_path else None}
    teacher_jct = E.run(val_trace, make_heuristic(teacher), sim, seed=0).avg_jct_slots
    result["val_jct_slots"] = {teacher: round(teacher_jct, 4)}
    if init_path is not None:
        result["val_jct_slots"]["init"] = round(val_jct(params), 4)

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=err, disable=as_json, transient=False) as progress:
        # ---------------------------------------------------------------- supervised warm-up
        if sl_epochs > 0:
            task = progress.add_task(f"SL from {teacher}: samples", total=sl_traces, info="")
            data = T.sl_data(cfg, params, ((generate(tcfg, seed=seed + i), seed + i) for i in range(sl_traces)), sim,
                             teacher, on_trace=lambda: progress.advance(task))
            task = progress.add_task(f"SL from {teacher}: epochs", total=sl_epochs, info="")

            def on_epoch(ep, loss, _p):
                progress.update(task, advance=1, info=f"loss {loss:.3f}")

            params, losses = LN.supervised(cfg, params, data, sl_epochs, seed=seed, on_epoch=on_epoch)
            acc = LN.imitation_accuracy(cfg, params, data)
            sl = val_jct(params)
            progress.update(task, info=f"loss {losses[-1]:.3f}, accuracy {acc:.3f}, val JCT {sl:.2f}")
            result["sl"] = {"samples": int(len(data[2])), "epochs": sl_epochs, "losses": [round(x, 5) for x in losses],
                            "imitation_accuracy": round(acc, 4)}
            result["val_jct_slots"]["sl"] = round(sl, 4)
        # ---------------------------------------------------------------- online RL
        if rl_steps > 0:
            if opt_state is None:
                opt_state = C.make_optimizer(cfg.rl_lr).init(params)
            st = LN.RLState(params, opt_state, LN.Replay(cfg, seed=seed))
            task = progress.add_task("RL", total=rl_steps, info="")
            done, curve, rewards = 0, [], []

            def on_slot(_n, reward):
                nonlocal done
                done += 1
                rewards.append(reward)
                info = f"updates {st.steps}"
                if val_every and done % val_every == 0:
                    curve.append((done, round(val_jct(st.params), 4)))
                    info += f", val JCT {curve[-1][1]:.2f}"
                progress.update(task, advance=1, info=info)

            first = seed + sl_traces  # RL episode k trains on trace seed + sl_traces + k
            episodes = len(T.rl_slots(cfg, st, sim, rl_steps, lambda k: (generate(tcfg, seed=first + k), first + k),
                                      on_slot))
            params, opt_state = st.params, st.opt_state
            rl = val_jct(params)
            progress.update(task, info=f"updates {st.steps}, val JCT {rl:.2f}")
            result["rl"] = {"slots": done, "episodes": episodes, "updates": st.steps,
                            "mean_reward": round(float(np.mean(rewards)), 5), "val_curve": curve}
            result["val_jct_slots"]["sl+rl" if sl_epochs > 0 else "rl"] = round(rl, 4)

    meta = {**meta0, "teacher": teacher, "jobs": jobs, "servers": spec.num_servers, "seed": seed,
            "val_seed": val_seed, "val_jct_slots": result["val_jct_slots"],
            "sl_epochs": meta0.get("sl_epochs", 0) + sl_epochs,
            "rl_updates": meta0.get("rl_updates", 0) + result.get("rl", {}).get("updates", 0)}
    ckpt = C.Checkpoint(cfg, params, opt_state, meta)
    try:
        C.save(out_path, ckpt)
    except OSError as e:
        raise _rescue(lambda path: C.save(path, ckpt), out_path, e) from None
    result["checkpoint"] = str(out_path)
    result["wall_s"] = round(time.perf_counter() - t0, 2)

    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    table = Table(title=f"Average JCT on the validation trace (seed {val_seed}, {jobs} jobs, "
                        f"{spec.num_servers} servers)")
    table.add_column("policy")
    table.add_column("avg JCT (slots)", justify="right")
    table.add_column("vs teacher", justify="right")
    for name, v in result["val_jct_slots"].items():
        table.add_row(name if name != teacher else f"{teacher} (teacher)", f"{v:.2f}", f"{v / teacher_jct:.3f}")
    Console().print(table)
    click.echo(f"checkpoint written to {out_path}")
