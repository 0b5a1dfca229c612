"""`dl2ctl train --policy dl2-target` (the default policy): the target-size policy trained in either world
(dl2d.policy.target.train): a warm-up from its teacher and slot-level PPO in the simulator's JAX environment, with
rounds of learning the planner on the measured speeds between them (``--plan-rounds``; by default in the DL2
world), on a site's own speed model when one is given (`--speed-model FILE` from `dl2ctl calibrate`: a twin of
the cluster it was measured on).

The options it reads are checked here, before anything is built; the training is the library's. The result is a
``dl2d-target-policy`` checkpoint that `dl2ctl sim --policy dl2-target --checkpoint FILE` and the daemon
(``policy = "dl2-target"``, ``checkpoint = FILE``) load; its meta records how it was made and its validation JCT
beside the teacher's (``--teacher``: Optimus or elastic, dl2d.policy.target.teachers, through the same fill, on the same
traces). The report adds the validation traces' lower bound (dl2d.sim.lp_bound), which says how much room the
teacher left: at load 1 in today's world both come within about 2 % of it, so a policy can only tie there.
"""
from __future__ import annotations

import dataclasses
import json
import time
from contextlib import nullcontext
from pathlib import Path

import click

#: Validation JCTs this close (relative) to the teacher's count as a tie, not as better or worse: a policy that
#: reproduces its teacher differs from it by float rounding only.
TIE = 0.005
#: A teacher this close (relative) to the validation traces' nominal lower bound leaves a policy little to gain.
LITTLE_ROOM = 0.05


def load_site(value: str | None, world: str):
    """``--speed-model FILE``: the site's curves (SiteSpeeds) or None; a clear error for a bad file or a world
    without all-reduce jobs. Classes the world's traces never hold are named on stderr (they change nothing)."""
    if value is None:
        return None
    if world != "today":
        raise click.BadParameter("a speed-model file holds all-reduce curves: it applies to --world today only",
                                 param_hint="--speed-model")
    from dl2d.workload.catalog import ALLREDUCE_MODELS
    from dl2d.workload.speedfit import SiteSpeeds, SpeedModelError, load_speed_model

    try:
        site = SiteSpeeds.of(load_speed_model(value), source=str(value))
    except SpeedModelError as e:
        raise click.BadParameter(str(e), param_hint="--speed-model") from None
    if site.mix:  # the training traces are the site's own mix: every class with a recorded mix is trained on
        mixed = {name for name, _, _ in site.mix}
        unused = [n for n in site.names() if n not in mixed]
        why = "no job mix recorded for it (jobs, epochs), so no training job is of it"
    else:
        unused = [n for n in site.names() if n not in ALLREDUCE_MODELS]
        why = f"not a model of the training traces ({', '.join(ALLREDUCE_MODELS)})"
    if unused:
        click.echo(f"--speed-model: {', '.join(unused)}: {why}; those curves are not used", err=True)
    if len(unused) == len(site.names()):
        raise click.BadParameter(f"{value}: none of its classes is in the training traces, so it would change "
                                 "nothing", param_hint="--speed-model")
    return site


def validation_bound(setup, cfg) -> dict | None:
    """The validation traces' LP lower bound (target_train.lower_bound): how much room the teacher left."""
    from dl2d.policy.target import train as TT
    return TT.lower_bound([TT.make_trace(setup, cfg, s) for s in setup.validation_seeds()], cfg)


def run(*, world: str, teacher: str, cluster: str | None, servers: int | None, jobs: int, load: float, style: str,
        clusters: int, slots: int, sl_iters: int, rl_iters: int, sl_lr: float, lr: float, prior: float,
        plan_rounds: int, plan_traces: int, plan_iters: int, credit: str,
        seed: int, val_seed: int, val_traces: int, eval_every: int, speed_model: str | None, init_path: Path | None,
        out_path: Path, as_json: bool, command: str, rescue) -> None:
    from dl2d.policy.target import train as TT
    try:
        setup = TT.TrainSetup(world=world, cluster=cluster, servers=servers, jobs=jobs, load=load, style=style,
                              clusters=clusters, teacher=teacher, slots=slots, sl_iters=sl_iters, rl_iters=rl_iters,
                              sl_lr=sl_lr, lr=lr,
                              prior=prior, credit=credit, eval_every=eval_every, seed=seed, rng=seed,
                              val_seed=val_seed, val_traces=val_traces, plan_rounds=plan_rounds,
                              plan_traces=plan_traces, plan_iters=plan_iters,
                              # the planner's PS counts above 8 are odd ones, which the base levels do not hold
                              every_count=plan_rounds > 0 and world == "dl2")
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    overlap = TT.seed_overlap(setup)
    if overlap:
        raise click.BadParameter(f"{overlap[0]} is both a training trace seed ({seed}..{seed + clusters - 1}) and a "
                                 f"validation one ({val_seed}..{val_seed + val_traces - 1}); the validation must be "
                                 "held out", param_hint="--val-seed")
    site = load_site(speed_model, world)
    cfg = TT.sim_config(setup, site)
    init_params = None
    if init_path is not None:
        from dl2d.policy.checkpoint import CheckpointError, load_target

        try:
            ck = load_target(init_path)
        except CheckpointError as e:
            raise click.BadParameter(str(e), param_hint="--init") from None
        # its levels are the checkpoint's own (the DL2 world's shipped policy has every count as a level)
        setup = dataclasses.replace(setup, every_count=ck.config.every_count)
        tc = TT.target_config(cfg, setup.teacher, setup.prior, setup.every_count)
        if ck.config != tc:
            raise click.BadParameter(f"{init_path} was trained for {ck.config.to_dict()}, this world and cluster need "
                                     f"{tc.to_dict()}", param_hint="--init")
        init_params = ck.params

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from dl2d.policy.checkpoint import TargetCheckpoint, save_target

    err = Console(stderr=True)
    t0 = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=err, disable=as_json) as progress:
        tasks = {}
        if init_params is not None:
            tasks["init"] = progress.add_task("initial checkpoint", total=1, info="")
        if sl_iters:
            tasks["sl"] = progress.add_task(f"warm-up from {teacher}", total=sl_iters, info="")
        if plan_rounds:
            tasks["plan"] = progress.add_task(f"learning the planner: {plan_rounds} round(s), traces labelled",
                                              total=plan_rounds * plan_traces, info="")
        if rl_iters:
            tasks["rl"] = progress.add_task("PPO", total=rl_iters, info="")

        def on_progress(phase, it, _iters):
            progress.update(tasks[phase], completed=it)

        def on_eval(row):
            done = {"completed": 1} if row["phase"] == "init" else {}
            progress.update(tasks[row["phase"]], info=f"validation JCT {row['val_mean']:.2f}", **done)

        result = TT.train(setup, site=site, init_params=init_params, on_progress=on_progress, on_eval=on_eval)
    meta = TT.checkpoint_meta(setup, result, command, site=site, init=str(init_path) if init_path else None)
    ckpt = TargetCheckpoint(result.config, result.params, meta)
    try:
        save_target(out_path, ckpt)
    except OSError as e:
        raise rescue(lambda path: save_target(path, ckpt), out_path, e) from None
    ratio = result.val_jct / result.teacher_val_jct
    verdict = "better" if ratio < 1 - TIE else "worse" if ratio > 1 + TIE else "tie"
    with err.status("the lower bound of the validation traces", spinner="dots") if not as_json else nullcontext():
        bound = validation_bound(setup, cfg)
    summary = {"policy": "dl2-target", "world": world, "cluster": meta["cluster"], "servers": cfg.cluster.num_servers,
               "jobs": jobs, "speed_model": meta["speed_model"], "chosen": meta["chosen"],
               "teacher": teacher,
               "val_jct_slots": {teacher: round(result.teacher_val_jct, 4), "learned": round(result.val_jct, 4),
                                 **({"lower_bound": bound} if bound else {})},
               "vs_teacher": round(ratio, 4), "verdict": verdict,
               "curve": [{k: r[k] for k in ("phase", "iter", "val_mean")} for r in result.curve],
               "cluster_slots_per_s": round(result.cluster_slots_per_s) if result.cluster_slots_per_s else None,
               "checkpoint": str(out_path), "wall_s": round(time.perf_counter() - t0, 2)}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    table = Table(title=f"Average JCT on the validation traces (seeds {val_seed}..{val_seed + val_traces - 1}, "
                        f"{jobs} jobs, {cfg.cluster.num_servers} servers, world {world})")
    table.add_column("policy")
    table.add_column("avg JCT (slots)", justify="right")
    table.add_column("vs teacher", justify="right")
    table.add_row(f"{teacher} (teacher)", f"{result.teacher_val_jct:.2f}", "1.000")
    table.add_row(f"learned ({meta['chosen']})", f"{result.val_jct:.2f}", f"{ratio:.3f}")
    if bound:
        table.add_row("lower bound, nominal speed (LP)", f"{bound['nominal']:.2f}",
                      f"{bound['nominal'] / result.teacher_val_jct:.3f}")
        table.add_row("lower bound, every run (LP)", f"{bound['every_run']:.2f}",
                      f"{bound['every_run'] / result.teacher_val_jct:.3f}")
    Console().print(table)
    if verdict != "better":
        room = result.teacher_val_jct / bound["nominal"] - 1 if bound else None
        advice = ("train longer (--rl-iters) or on more traces (--clusters)" if room is None or room >= LITTLE_ROOM else
                  f"the teacher is {room:.1%} above the lower bound at nominal speed, so little is left to learn on "
                  "these traces")
        click.echo(f"the learned policy {'matches' if verdict == 'tie' else 'is behind'} its teacher on the "
                   f"validation traces (within {TIE:.1%} counts as a tie); {advice}", err=True)
    click.echo(f"checkpoint written to {out_path}")
