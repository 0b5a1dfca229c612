"""Distil a teacher on the measured speeds into the target-size network (dl2d.policy.planning.plan_distill) in the DL2
world: behaviour cloning on the teacher's own runs, then DAgger rounds (the network drives, the teacher labels,
all slots kept), choosing the round (and, with ``--iters A,B,..``, the number of Adam steps in it) by the
validation traces (NumPy simulator), and scoring the chosen network on the held-out traces.

    python bench/bench_distill.py --presets small:40,testbed:30 --traces 32 --rounds 2 --iters 3000 \
        --init dl2d/policy/target/pretrained/target-dl2.msgpack --out FILE.msgpack --curve-out FILE.json

The teacher: ``--teacher plan``, the planner on the measured speeds (dl2d.policy.planning.lp_plan.on_measured_speeds);
``--teacher lookahead``, its one-slot lookahead over roundings (dl2d.policy.planning.lp_lookahead; ``--candidates``,
``--horizon``; 4-12 minutes a `testbed` trace on the 2-core development CPU). ``--in-bucket N``: either's
program with the bound's in-bucket term. ``--presets`` are collected on, ``--score-presets`` (default: the same)
validated and scored on.
``--cache DIR``: each trace's slots saved there as it is collected (npz, named by preset, teacher, seed and, for
a DAgger round, the driving network's digest) and read back instead of collected again, so a long run that
stops picks up where it was.

Seeds: training traces from ``--first-seed`` (1000, as bench_ppo's; the same seeds for each preset), validation
500-504, held out 0-4 (never trained on or chosen by). Collecting runs in ``--workers`` processes.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor

import jax
import numpy as np

from dl2d.policy.planning import plan_distill as D
from dl2d.policy import registry
from dl2d.policy.target import policy as T
from dl2d.policy.target import view as TV
from dl2d.policy.target import train as TT
from dl2d.policy.checkpoint import TargetCheckpoint, load_target, save_target
from dl2d.policy.planning.lp_lookahead import Lookahead
from dl2d.policy.planning.lp_plan import on_measured_speeds
from dl2d.sim import engine as E
from dl2d.workload.speed import speed_table



def setup_of(preset: str) -> TT.TrainSetup:
    """A preset, CLUSTER:JOBS (testbed:30), as the DL2 world's setup; a malformed one stops the run."""
    cluster, sep, jobs = preset.partition(":")
    if not sep or not jobs.isdigit() or int(jobs) < 1:
        raise SystemExit(f"a preset is CLUSTER:JOBS (testbed:30), got {preset!r}")
    return TT.TrainSetup(world="dl2", cluster=cluster, jobs=int(jobs))


def teacher_name(spec: dict) -> str:
    """The teacher's name in the meta and the cache: ``lp-plan-measured[-factor][-ib8]`` or
    ``lp-plan-lookahead-c8-h3[-s4-k3[-g3][-r3]][-ib8]`` (with local moves: starts, shrinks, grows; rounds of
    them)."""
    ib = f"-ib{spec['in_bucket']}" * bool(spec["in_bucket"])
    moves = f"-s{spec.get('starts', 0)}-k{spec.get('shrinks', 0)}" * bool(spec.get("starts") or spec.get("shrinks"))
    moves += f"-g{spec.get('grows', 0)}" * bool(spec.get("grows"))
    moves += f"-r{spec.get('move_rounds', 1)}" * (spec.get("move_rounds", 1) > 1)
    if spec["kind"] == "lookahead":
        return f"lp-plan-lookahead-c{spec['candidates']}-h{spec['horizon']}{moves}{ib}"
    return "lp-plan-measured" + "-factor" * spec["view_factor"] + ib


def make_teacher(spec: dict, cfg: E.SimConfig):
    """seed -> the teacher's policy for that seed's trace (plan_distill.collect's ``teacher``)."""
    if spec["kind"] == "lookahead":
        table = speed_table(cfg.speed_model)
        return lambda seed: Lookahead(table, spec["candidates"], spec["horizon"], None, seed, spec["in_bucket"],
                                      spec.get("starts", 0), spec.get("shrinks", 0), spec.get("grows", 0),
                                      spec.get("move_rounds", 1))
    return lambda seed: on_measured_speeds(cfg, view_factor=spec["view_factor"], in_bucket=spec["in_bucket"])


def digest(params) -> str:
    """The first 12 hex digits of the SHA-256 of the network's weights (names a DAgger round's cache files)."""
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(jax.device_get(params)):
        h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()[:12]


def _collect(args):
    """One worker process: (preset, seed, tcfg dict, params or None, teacher spec, cache dir or None) -> Samples
    of that trace, from the cache where it holds them."""
    preset, seed, tcfg_dict, params, spec, cache = args
    path = None
    if cache:
        driver = "" if params is None else f"-net{digest(params)}"
        path = os.path.join(cache, f"{preset.replace(':', '-')}-{teacher_name(spec)}{driver}-s{seed}.npz")
        if os.path.exists(path):
            with np.load(path) as f:
                return D.Samples(f["x"], f["active"], f["allreduce"], f["label"])
    setup = setup_of(preset)
    cfg = TT.sim_config(setup)
    tcfg = T.TargetConfig.from_dict(tcfg_dict)
    out = D.collect(tcfg, cfg, [TT.make_trace(setup, cfg, seed)], [seed], params, teacher=make_teacher(spec, cfg))
    if path:
        np.savez_compressed(path + ".part.npz", x=out.x, active=out.active, allreduce=out.allreduce, label=out.label)
        os.replace(path + ".part.npz", path)
    return out


def collect(pool, presets, seeds, tcfg, params, spec: dict, cache: str | None) -> D.Samples:
    work = [(p, s, tcfg.to_dict(), None if params is None else jax.device_get(params), spec, cache)
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


def stages_of(text: str) -> list[int]:
    """``--iters``: the Adam steps of a round, each a point the round is validated at ("300,1000": 300 steps,
    then 700 more)."""
    try:
        stages = [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"--iters must be whole numbers of Adam steps, comma-separated, got {text!r}")
    if not stages or stages[0] < 1 or any(b <= a for a, b in zip(stages, stages[1:])):
        raise SystemExit(f"--iters must rise from at least 1, got {text!r}")
    return stages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="small:40,testbed:30", help="the presets collected on")
    ap.add_argument("--score-presets", default=None,
                    help="the presets validated (the choice: the mean over them of the JCT against each one's best "
                         "heuristic) and scored on; default: --presets")
    ap.add_argument("--teacher", choices=("plan", "lookahead"), default="plan",
                    help="plan: the planner on the measured speeds; lookahead: its one-slot lookahead over "
                         "roundings (dl2d.policy.planning.lp_lookahead)")
    ap.add_argument("--candidates", type=int, default=8, help="the lookahead's roundings a slot")
    ap.add_argument("--horizon", type=int, default=3, help="the slots the lookahead simulates")
    ap.add_argument("--starts", type=int, default=0,
                    help="the lookahead's local moves: start each of the first N jobs the planner leaves waiting")
    ap.add_argument("--shrinks", type=int, default=0,
                    help="the lookahead's local moves: each of the N jobs with the most tasks one size smaller")
    ap.add_argument("--grows", type=int, default=0,
                    help="the lookahead's local moves: each of the first N jobs the planner runs one size larger")
    ap.add_argument("--move-rounds", type=int, default=1,
                    help="the lookahead's local moves of its best move in turn, while one is better (at most N-1)")
    ap.add_argument("--in-bucket", type=int, default=0,
                    help="the teacher's program with the bound's in-bucket term, its tangent lines (0: without)")
    ap.add_argument("--traces", type=int, default=32, help="training traces per preset and round")
    ap.add_argument("--dagger-traces", type=int, default=None,
                    help="training traces per preset in each DAgger round (default: --traces)")
    ap.add_argument("--rounds", type=int, default=2, help="DAgger rounds after the behaviour cloning")
    ap.add_argument("--iters", default="3000", help="Adam steps per round; A,B,..: validated after A, B, .. steps")
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
    ap.add_argument("--cache", default=None, help="a folder for each trace's collected slots (made if absent)")
    ap.add_argument("--heuristics", default="optimus,optimus-relative",
                    help="registered heuristics scored beside it (the best of them is the bar)")
    ap.add_argument("--no-teacher-score", action="store_true", help="skip scoring the teacher itself")
    ap.add_argument("--out", default=None)
    ap.add_argument("--curve-out", default=None)
    args = ap.parse_args()
    stages = stages_of(args.iters)
    dagger_traces = args.traces if args.dagger_traces is None else args.dagger_traces
    if args.traces < 1 or dagger_traces < 1 or args.rounds < 0:
        raise SystemExit("--traces and --dagger-traces must be at least 1, --rounds at least 0")
    presets = args.presets.split(",")
    scored = args.score_presets.split(",") if args.score_presets else presets
    for p in {*presets, *scored}:
        setup_of(p)
    if (args.candidates < 1 or args.horizon < 1 or args.move_rounds < 1
            or min(args.in_bucket, args.starts, args.shrinks, args.grows) < 0):
        raise SystemExit("--candidates, --horizon and --move-rounds must be at least 1, "
                         "--in-bucket, --starts, --shrinks and --grows at least 0")
    if (args.starts or args.shrinks or args.grows or args.move_rounds > 1) and args.teacher != "lookahead":
        raise SystemExit("--starts, --shrinks, --grows and --move-rounds are the lookahead's moves: "
                         "add --teacher lookahead")
    if args.teacher == "lookahead" and args.view_factor:
        raise SystemExit("--view-factor is the planner's; the lookahead plans on the table as it stands")
    spec = {"kind": args.teacher, "candidates": args.candidates, "horizon": args.horizon,
            "in_bucket": args.in_bucket, "view_factor": args.view_factor, "starts": args.starts,
            "shrinks": args.shrinks, "grows": args.grows, "move_rounds": args.move_rounds}
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
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
    net = lambda p: (lambda cfg: TV.TargetPolicy(tcfg, p))
    heur = {h: score(scored, val_seeds, lambda cfg, h=h: registry.build(h)) for h in HEURISTICS}
    if not args.no_teacher_score:
        heur[teacher_name(spec)] = score(scored, val_seeds, lambda cfg: make_teacher(spec, cfg)(0))
    print(json.dumps({"validation_heuristics": {h: {p: float(np.mean(v)) for p, v in r.items()}
                                                for h, r in heur.items()}}), flush=True)
    best_rel = {p: min(np.mean(heur[h][p]) for h in HEURISTICS) for p in scored}
    val = score(scored, val_seeds, net(params))
    rel = float(np.mean([np.mean(val[p]) / best_rel[p] for p in scored]))
    # the start (an --init network) is a candidate too: a round that makes it worse is not chosen
    best = (rel, "start", jax.device_get(params), val)
    print(json.dumps({"start": {p: round(float(np.mean(v)), 3) for p, v in val.items()},
                      "vs_best_heuristic": round(rel - 1, 4)}), flush=True)
    data = None
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
        for rnd in range(args.rounds + 1):
            t0 = time.perf_counter()
            lo = args.first_seed + (rnd > 0) * args.traces + max(rnd - 1, 0) * dagger_traces
            seeds = list(range(lo, lo + (args.traces if rnd == 0 else dagger_traces)))
            new = collect(pool, presets, seeds, tcfg, None if rnd == 0 else params, spec, args.cache)
            data = new if data is None else D.Samples.concat([data, new])
            t1 = time.perf_counter()
            done, start_rel = 0, None
            for k, it in enumerate(stages):
                params, loss = D.fit(tcfg, params, data, it - done, lr=args.lr, batch=args.batch,
                                     seed=rnd * len(stages) + k)
                done = it
                val = score(scored, val_seeds, net(params))
                # the mean over presets of the JCT against that preset's best heuristic (lower is better)
                rel = float(np.mean([np.mean(val[p]) / best_rel[p] for p in scored]))
                row = {"round": rnd, "iters": it, "slots": len(data), "loss": round(loss, 4),
                       "agreement": round(D.agreement(tcfg, params, new), 4),
                       "validation": {p: round(float(np.mean(v)), 3) for p, v in val.items()},
                       "vs_best_heuristic": round(rel - 1, 4), "collect_s": round(t1 - t0, 1),
                       "fit_s": round(time.perf_counter() - t1, 1)}
                curve.append(row)
                print(json.dumps(row), flush=True)
                if start_rel is None or rel < start_rel[0]:
                    start_rel = (rel, jax.device_get(params))
                if rel < best[0]:
                    best = (rel, f"round {rnd}, {it} Adam steps", jax.device_get(params), val)
            params = start_rel[1]  # the next round's network: this round's best stage
    rel, chosen, params, val = best
    held = score(scored, held_seeds, net(params))
    held_heur = {h: score(scored, held_seeds, lambda cfg, h=h: registry.build(h)) for h in HEURISTICS}
    summary = {"summary": True, "chosen": chosen, "validation": val, "held_out": held,
               "held_out_heuristics": held_heur, "validation_heuristics": heur, "curve": curve,
               "minutes": round((time.perf_counter() - t_start) / 60, 1)}
    print(json.dumps(summary), flush=True)
    if args.curve_out:
        with open(args.curve_out, "w") as f:
            json.dump(summary, f, indent=1)
    if args.out:
        first = scored[0]
        setup = setup_of(first)
        meta = {"world": "dl2", "cluster": setup.cluster, "jobs": setup.jobs, "teacher": teacher_name(spec),
                "features_teacher": tcfg.teacher, "method": "distilled (behaviour cloning, then DAgger)",
                "chosen": chosen, "presets": presets, "score_presets": scored,
                "train_seeds": [args.first_seed, args.first_seed + args.traces + args.rounds * dagger_traces - 1],
                "validation_seeds": [500, 504], "held_out_seeds": [0, 4],
                "validation_jct": val[first], "validation_jct_mean": round(float(np.mean(val[first])), 3),
                "held_out_jct_numpy": held[first], "held_out_jct_numpy_mean": round(float(np.mean(held[first])), 3),
                "optimus_held_out_jct_numpy_mean": round(float(np.mean(held_heur["optimus"][first])), 3),
                "heuristics_held_out_jct_numpy_mean": {h: round(float(np.mean(r[first])), 3)
                                                       for h, r in held_heur.items()},
                "per_preset": {p: {"validation_mean": round(float(np.mean(val[p])), 3),
                                   "held_out": held[p], "held_out_mean": round(float(np.mean(held[p])), 3)}
                               for p in scored},
                "command": "python bench/bench_distill.py " + " ".join(
                    f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in vars(args).items()
                    if v not in (None, False) and k not in ("out", "curve_out", "workers", "no_teacher_score", "cache"))
                    + f" --out {args.out}"}
        save_target(args.out, TargetCheckpoint(tcfg, params, meta))


if __name__ == "__main__":
    main()
