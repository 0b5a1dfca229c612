"""Distil the planner on the measured speeds into the target-size network (dl2d.policy.plan_distill) in the DL2
world: behaviour cloning on the planner's own runs, then DAgger rounds (the network drives, the planner labels,
all slots kept), choosing the round by the validation traces (NumPy simulator, both presets), and scoring the
chosen network on the held-out traces.

    python bench/bench_distill.py --presets small:40,testbed:30 --traces 32 --rounds 2 --iters 3000 \
        --init dl2d/policy/pretrained/target-dl2.msgpack --out FILE.msgpack --curve-out FILE.json

Seeds: training traces from ``--first-seed`` (1000, as bench_ppo's; the same seeds for each preset), validation 500-504, held out 0-4 (never trained on
or chosen by). Collecting runs the simulator and one linear program a slot, in ``--workers`` processes.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor

import jax
import numpy as np

from dl2d.policy import plan_distill as D
from dl2d.policy import registry
from dl2d.policy import target as T
from dl2d.policy import target_train as TT
from dl2d.policy.checkpoint import TargetCheckpoint, load_target, save_target
from dl2d.policy.lp_plan import on_measured_speeds
from dl2d.sim import engine as E



def setup_of(preset: str) -> TT.TrainSetup:
    cluster, _, jobs = preset.partition(":")
    return TT.TrainSetup(world="dl2", cluster=cluster, jobs=int(jobs))


def _collect(args):
    """One worker process: (preset, seeds, tcfg dict, params or None, view_factor) -> Samples."""
    preset, seeds, tcfg_dict, params, view_factor = args
    setup = setup_of(preset)
    cfg = TT.sim_config(setup)
    tcfg = T.TargetConfig.from_dict(tcfg_dict)
    return D.collect(tcfg, cfg, [TT.make_trace(setup, cfg, s) for s in seeds], seeds, params,
                     view_factor=view_factor)


def collect(pool, presets, seeds, tcfg, params, view_factor: bool) -> D.Samples:
    work = [(p, [s], tcfg.to_dict(), None if params is None else jax.device_get(params), view_factor)
            for p in presets for s in seeds]
    return D.Samples.concat(list(pool.map(_collect, work)))


def score(presets, seeds, make) -> dict:
    """{preset: [avg JCT per seed]} in the NumPy simulator."""
    out = {}
    for p in presets:
        setup = setup_of(p)
        cfg = TT.sim_config(setup)
        out[p] = [round(float(E.run(TT.make_trace(setup, cfg, s), make(cfg), cfg, seed=s).jct_slots.mean()), 3)
                  for s in seeds]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="small:40,testbed:30")
    ap.add_argument("--traces", type=int, default=32, help="training traces per preset and round")
    ap.add_argument("--rounds", type=int, default=2, help="DAgger rounds after the behaviour cloning")
    ap.add_argument("--iters", type=int, default=3000, help="Adam steps per fit")
    ap.add_argument("--first-seed", type=int, default=1000, help="the first training trace's seed")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--init", default=None, help="a target-size checkpoint to start from (its config is kept, "
                                                 "prior 0)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--every-count", action="store_true",
                    help="every whole count a level (TargetConfig.every_count; the planner gives odd PS counts "
                         "above 8); an --init network on the base levels is widened first (plan_distill.widen)")
    ap.add_argument("--speed-factor", action="store_true",
                    help="the network reads each job's measured speed (TargetConfig.speed_factor); an --init network "
                         "without the column is widened first (plan_distill.widen)")
    ap.add_argument("--view-factor", action="store_true",
                    help="the planner that labels (and is scored) plans on the measured speeds times each job's "
                         "measured speed, the view's job_speed_factor (lp_plan.on_measured_speeds)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--heuristics", default="optimus,optimus-relative",
                    help="registered heuristics scored beside it (the best of them is the bar)")
    ap.add_argument("--no-teacher-score", action="store_true", help="skip scoring the planner itself")
    ap.add_argument("--out", default=None)
    ap.add_argument("--curve-out", default=None)
    args = ap.parse_args()
    presets = args.presets.split(",")
    HEURISTICS = [h for h in args.heuristics.split(",") if h]
    val_seeds, held_seeds = list(range(500, 505)), list(range(0, 5))
    if args.init:
        ck = load_target(args.init)
        tcfg = T.TargetConfig(**{**ck.config.to_dict(), "prior": 0.0})
        params = ck.params
        if args.every_count and not tcfg.every_count:
            tcfg, params = D.widen(tcfg, params, every_count=True)
        if args.speed_factor and not tcfg.speed_factor:
            tcfg, params = D.widen(tcfg, params, speed_factor=True)
    else:
        tcfg = T.TargetConfig(max_workers=16, max_ps=16, hidden=args.hidden, teacher="optimus-relative",
                              every_count=args.every_count, speed_factor=args.speed_factor)
        params = T.init_params(tcfg, jax.random.PRNGKey(0))
    t_start = time.perf_counter()
    curve = []
    net = lambda p: (lambda cfg: T.TargetPolicy(tcfg, p))
    heur = {h: score(presets, val_seeds, lambda cfg, h=h: registry.build(h)) for h in HEURISTICS}
    if not args.no_teacher_score:
        heur["lp-plan-measured"] = score(presets, val_seeds,
                                         lambda cfg: on_measured_speeds(cfg, view_factor=args.view_factor))
    print(json.dumps({"validation_heuristics": {h: {p: float(np.mean(v)) for p, v in r.items()}
                                                for h, r in heur.items()}}), flush=True)
    best_rel = {p: min(np.mean(heur[h][p]) for h in HEURISTICS) for p in presets}
    data = None
    best = None
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
        for rnd in range(args.rounds + 1):
            t0 = time.perf_counter()
            seeds = list(range(args.first_seed + rnd * args.traces, args.first_seed + (rnd + 1) * args.traces))
            new = collect(pool, presets, seeds, tcfg, None if rnd == 0 else params, args.view_factor)
            if data is not None and data.x.shape[1] != new.x.shape[1]:
                raise SystemExit("slots padded to different row counts across rounds")
            data = new if data is None else D.Samples.concat([data, new])
            t1 = time.perf_counter()
            params, loss = D.fit(tcfg, params, data, args.iters, lr=args.lr, batch=args.batch, seed=rnd)
            val = score(presets, val_seeds, net(params))
            # the mean over presets of the JCT against that preset's best heuristic (lower is better)
            rel = float(np.mean([np.mean(val[p]) / best_rel[p] for p in presets]))
            row = {"round": rnd, "slots": len(data), "loss": round(loss, 4),
                   "agreement": round(D.agreement(tcfg, params, new), 4),
                   "validation": {p: round(float(np.mean(v)), 3) for p, v in val.items()},
                   "vs_best_heuristic": round(rel - 1, 4), "collect_s": round(t1 - t0, 1),
                   "fit_s": round(time.perf_counter() - t1, 1)}
            curve.append(row)
            print(json.dumps(row), flush=True)
            if best is None or rel < best[0]:
                best = (rel, rnd, jax.device_get(params), val)
    rel, rnd, params, val = best
    held = score(presets, held_seeds, net(params))
    held_heur = {h: score(presets, held_seeds, lambda cfg, h=h: registry.build(h)) for h in HEURISTICS}
    summary = {"summary": True, "chosen_round": rnd, "validation": val, "held_out": held,
               "held_out_heuristics": held_heur, "validation_heuristics": heur, "curve": curve,
               "minutes": round((time.perf_counter() - t_start) / 60, 1)}
    print(json.dumps(summary), flush=True)
    if args.curve_out:
        with open(args.curve_out, "w") as f:
            json.dump(summary, f, indent=1)
    if args.out:
        first = presets[0]
        setup = setup_of(first)
        meta = {"world": "dl2", "cluster": setup.cluster, "jobs": setup.jobs,
                "teacher": "lp-plan-measured" + "-factor" * args.view_factor,
                "features_teacher": tcfg.teacher, "method": "distilled (behaviour cloning, then DAgger)",
                "chosen": f"round {rnd}", "presets": presets, "train_seeds": [args.first_seed, args.first_seed + (args.rounds + 1) * args.traces - 1],
                "validation_seeds": [500, 504], "held_out_seeds": [0, 4],
                "validation_jct": val[first], "validation_jct_mean": round(float(np.mean(val[first])), 3),
                "held_out_jct_numpy": held[first], "held_out_jct_numpy_mean": round(float(np.mean(held[first])), 3),
                "optimus_held_out_jct_numpy_mean": round(float(np.mean(held_heur["optimus"][first])), 3),
                "heuristics_held_out_jct_numpy_mean": {h: round(float(np.mean(r[first])), 3)
                                                       for h, r in held_heur.items()},
                "per_preset": {p: {"validation_mean": round(float(np.mean(val[p])), 3),
                                   "held_out": held[p], "held_out_mean": round(float(np.mean(held[p])), 3)}
                               for p in presets},
                "command": "python bench/bench_distill.py " + " ".join(
                    f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in vars(args).items()
                    if v not in (None, False) and k not in ("out", "curve_out", "workers", "no_teacher_score")) + f" --out {args.out}"}
        save_target(args.out, TargetCheckpoint(tcfg, params, meta))


if __name__ == "__main__":
    main()
