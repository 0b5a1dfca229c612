"""Train the network that reads the planner's plan (dl2d.policy.planning.plan_net; ``dl2-plan-checked`` checks its
departures) in the DL2 world: the lookahead on the learned speed table (lp_lookahead.REGISTERED) drives training
traces and labels every slot, the network starts as the planner (the shipped DL2 network's trunk, pair logits and
relative head at 0, ``--prior``) and learns the lookahead's pairs, its departures from the planner weighing
``--departure-weight``; it is then run on the validation traces (500-504), the planner beside it, and, with
``--held-out``, on held-out ones: the network alone, as its checkpoint's meta records it (the registered
``dl2-plan-checked`` adds the check).

    python bench/bench_plan_net.py --train-seeds 2000-2023 --cache DIR --out FILE.msgpack

A saved network without training: ``--evaluate NET.msgpack`` scores it as ``dl2-plan-checked`` (each departure
kept only where ``--check`` slots, 3 as registered, simulated on the learned table say it helps), on
``--validation`` and ``--held-out``.

DAgger: ``--dagger NET.msgpack=SEEDS`` (repeatable) adds the slots of the traces of SEEDS driven by that
network (a checkpoint of this bench), labelled by the lookahead as before: the states the network itself reaches,
which the lookahead's own runs do not show it.

Collecting is the long part (the lookahead: 4-15 minutes a `testbed` trace on the 2-core development CPU, in
``--workers`` processes); ``--cache DIR`` keeps each trace's slots (npz, by seed and the table's digest) and reads
them back, so a run that stops picks up where it was. Prints a JSON line per trace and one at the end.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from dl2d.policy.planning import learned_speeds as LS
from dl2d.policy.planning import plan_distill as D
from dl2d.policy.planning import plan_net as PN
from dl2d.policy.target import train as TT
from dl2d.policy.checkpoint import TargetCheckpoint, load_target, save_target
from dl2d.workload.seeds import seed_list


INIT = "dl2d/policy/target/pretrained/target-dl2.msgpack"


def setup(cluster: str, jobs: int):
    s = TT.TrainSetup(world="dl2", cluster=cluster, jobs=jobs)
    return s, TT.sim_config(s)


def file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def collect_one(args) -> tuple[int, str | None, D.Samples, float, float]:
    """One worker: (seed, driver, its Samples, the run's JCT, seconds), from the cache where it holds them; the
    run is driven by the lookahead or, with ``driver`` (a checkpoint's path), by that network."""
    seed, cluster, jobs, tcfg_dict, table_path, cache, driver = args
    from dl2d.policy.target import policy as T
    tcfg = T.TargetConfig.from_dict(tcfg_dict)
    table, _, meta = LS.load(table_path)
    kind = "lookahead" if driver is None else f"dagger-{file_digest(driver)[:12]}"
    path = os.path.join(cache, f"{cluster}-{jobs}-{kind}-{meta['sha256'][:12]}-s{seed}.npz") if cache else None
    if path and os.path.exists(path):
        z = np.load(path)
        return seed, driver, D.Samples(z["x"], z["active"], z["allreduce"], z["label"]), float(z["jct"]), 0.0
    s, cfg = setup(cluster, jobs)
    drive = None if driver is None else PN.load(driver, table_path)
    data, jct, secs = PN.collect(tcfg, cfg, TT.make_trace(s, cfg, seed), seed, table, drive)
    if path:
        tmp = path + ".tmp.npz"
        np.savez_compressed(tmp, x=data.x, active=data.active, allreduce=data.allreduce, label=data.label, jct=jct)
        os.replace(tmp, path)
    return seed, driver, data, jct, secs


def command_arg(arg: str, args) -> str:
    """``arg`` as the checkpoint's meta records the command: the cache folder as CACHE, a DAgger driver by its
    file's name (its digest is in the meta), so that no path of the machine it ran on is kept."""
    if args.cache and arg == args.cache:
        return "CACHE"
    if arg in args.dagger:
        net, _, part = arg.rpartition("=")
        return f"{os.path.basename(net)}={part}"
    return arg


def run_policy(policy, cluster: str, jobs: int, seed: int) -> float:
    from dl2d.sim import engine as E

    s, cfg = setup(cluster, jobs)
    return float(E.run(TT.make_trace(s, cfg, seed), policy, cfg, seed=seed).jct_slots.mean())


def score_row(pol, table, cluster: str, jobs: int, seed: int, planner: bool) -> dict:
    """One trace's JSON row: the network's JCT and how often it departed (with its check: how many departures
    the model kept and turned down), and the planner's beside it where ``planner``."""
    from dl2d.policy.planning import lp_plan as LP
    t0 = time.perf_counter()
    row = {"seed": seed, "network": round(run_policy(pol, cluster, jobs, seed), 3),
           "departures": round(pol.departures / max(pol.jobs, 1), 4), "seconds": round(time.perf_counter() - t0, 1)}
    if pol.check:
        row.update(check=pol.check, kept=pol.kept, rejected=pol.rejected)
    if planner:
        row["planner"] = round(run_policy(LP.on_table(table, in_bucket=PN.IN_BUCKET), cluster, jobs, seed), 3)
    print(json.dumps(row), flush=True)
    return row


def score(tcfg, params, table, cluster, jobs, seeds, planner: bool, check: int = 0) -> list[dict]:
    return [score_row(PN.PlanNetPolicy(tcfg, params, table, check=check), table, cluster, jobs, seed, planner)
            for seed in seeds]


def score_saved(job) -> dict:
    """score_row of a saved network (a process of the pool: ``job`` is (network, table, check, cluster, jobs,
    seed, planner))."""
    net, table_path, check, cluster, jobs, seed, planner = job
    pol = PN.load(net, table_path, check=check)
    return score_row(pol, pol.table, cluster, jobs, seed, planner)


def evaluate(args, table_path: str) -> None:
    """``--evaluate``: a saved network, checked as ``dl2-plan-checked``, on the validation traces, the planner beside
    it, and on the held-out ones, in ``--workers`` processes; a JSON line per trace and one at the end, nothing
    written."""
    try:
        PN.load(args.evaluate, table_path)
    except Exception as e:  # noqa: BLE001 - a bad file stops the run, named
        raise SystemExit(f"--evaluate: {e}") from None
    sets = {"validation": (seed_list(args.validation), True)}
    if args.held_out:
        sets["held_out"] = (seed_list(args.held_out), False)
    summary = {"evaluate": os.path.basename(args.evaluate), "check": args.check}
    with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
        for name, (seeds, planner) in sets.items():
            rows = list(pool.map(score_saved, [(args.evaluate, table_path, args.check, args.cluster, args.jobs, s,
                                                planner) for s in seeds]))
            summary[f"{name}_mean"] = round(float(np.mean([r["network"] for r in rows])), 3)
            if planner:
                summary[f"planner_{name}_mean"] = round(float(np.mean([r["planner"] for r in rows])), 3)
    print(json.dumps(summary), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="testbed")
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--train-seeds", default="2000-2023", help="training traces' seeds, LO-HI[,LO-HI...]")
    ap.add_argument("--dagger", action="append", default=[], metavar="NET=SEEDS",
                    help="also the traces of SEEDS (LO-HI[,LO-HI...]) driven by the network NET; repeatable")
    ap.add_argument("--validation", default="500-504", help="validation seeds, LO-HI")
    ap.add_argument("--held-out", default=None, help="held-out seeds, LO-HI, scored after training")
    ap.add_argument("--table", default=None, help="the learned speed table (default: the package's)")
    ap.add_argument("--init", default=INIT, help="the trained target network whose trunk it starts from")
    ap.add_argument("--prior", type=float, default=3.0)
    ap.add_argument("--departure-weight", type=float, default=3.0)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--check", type=int, default=None,
                    help=f"--evaluate: each departure checked by this many slots simulated (default "
                         f"{PN.CHECK_SLOTS}, dl2-plan-checked's)")
    ap.add_argument("--evaluate", default=None, metavar="NET",
                    help="train nothing: score the saved network NET on the validation and held-out traces")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.workers < 1:
        raise SystemExit("--workers must be at least 1")
    if args.evaluate:
        args.check = PN.CHECK_SLOTS if args.check is None else args.check
        if args.check < 1:
            raise SystemExit("--check must be at least 1 (the network unchecked is not a registered policy)")
        if not os.path.isfile(args.evaluate):
            raise SystemExit(f"--evaluate: no network file {args.evaluate!r}")
        return evaluate(args, args.table or str(LS.SHIPPED))
    if not args.out:
        raise SystemExit("--out FILE is needed to train (or --evaluate NET to score a saved network)")
    if args.check is not None:
        raise SystemExit("--check is for --evaluate: training scores the network itself, as its checkpoint records")
    args.check = 0
    try:
        seeds = seed_list(args.train_seeds)
    except ValueError:
        raise SystemExit(f"--train-seeds: LO-HI[,LO-HI...], got {args.train_seeds!r}") from None
    dagger = []
    for spec in args.dagger:
        net, _, part = spec.rpartition("=")
        try:
            dagger.append((net, seed_list(part)))
        except ValueError:
            raise SystemExit(f"--dagger: NET=LO-HI[,LO-HI...], got {spec!r}") from None
        if not net or not os.path.isfile(net):
            raise SystemExit(f"--dagger {spec!r}: no network file {net!r}")
    used = set(seeds).union(*(set(d[1]) for d in dagger))
    if not seeds or used & (set(range(20)) | set(seed_list(args.validation))):
        raise SystemExit("--train-seeds and --dagger must be some seeds, none of them held out (0-19) or validation")
    if args.iters < 1 or args.workers < 1 or args.batch < 1:
        raise SystemExit("--iters, --workers and --batch must be at least 1")
    if not 0 <= args.prior <= 50 or args.departure_weight <= 0:
        raise SystemExit("--prior must be in [0, 50], --departure-weight above 0")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise SystemExit(f"--out: folder {out_dir} does not exist")
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
    table_path = args.table or str(LS.SHIPPED)
    try:
        table, _, table_meta = LS.load(table_path)
        init = load_target(args.init)
    except Exception as e:  # noqa: BLE001 - a bad file stops the run, named
        raise SystemExit(str(e)) from None
    tcfg, params = PN.start_from(init.config, init.params, args.prior)

    for net, _ in dagger:
        try:
            PN.load(net, table_path)
        except Exception as e:  # noqa: BLE001 - a bad driver stops the run before hours of collecting
            raise SystemExit(f"--dagger: {e}") from None
    runs = [(s, None) for s in seeds] + [(s, net) for net, ss in dagger for s in ss]
    work = [(s, args.cluster, args.jobs, tcfg.to_dict(), table_path, args.cache, net) for s, net in runs]
    parts, t0 = {}, time.perf_counter()
    with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
        for seed, net, data, jct, secs in pool.map(collect_one, work):
            parts[seed, net] = data
            print(json.dumps({"collected": seed, "driver": net and os.path.basename(net), "slots": len(data),
                              "jct": round(jct, 3), "seconds": round(secs, 1)}), flush=True)
    data = D.Samples.concat([parts[r] for r in runs])
    print(json.dumps({"slots": len(data), "collect_s": round(time.perf_counter() - t0, 1)}), flush=True)

    params, loss = D.fit(tcfg, params, data, args.iters, lr=args.lr, batch=args.batch,
                         departure_weight=args.departure_weight)
    validation = score(tcfg, params, table, args.cluster, args.jobs, seed_list(args.validation), True, args.check)
    mean = lambda rows, k: round(float(np.mean([r[k] for r in rows])), 3)
    meta = {"world": "dl2", "cluster": args.cluster, "jobs": args.jobs, "teacher": "lp-lookahead",
            "method": "distilled: the lookahead's pairs on its own runs, departures from the planner weighted",
            "command": "python " + " ".join(command_arg(a, args) for a in sys.argv),
            "table_sha256": table_meta["sha256"],
            "init": args.init, "train_seeds": seeds, "slots": len(data), "loss": round(loss, 4),
            "dagger": [{"driver_sha256": file_digest(net), "seeds": ss} for net, ss in dagger],
            "validation_seeds": [r["seed"] for r in validation],
            "validation_jct": [r["network"] for r in validation], "validation_jct_mean": mean(validation, "network"),
            "planner_validation_jct_mean": mean(validation, "planner")}
    save_target(args.out, TargetCheckpoint(tcfg, params, meta))
    summary = {k: meta[k] for k in ("validation_jct_mean", "planner_validation_jct_mean")}
    if args.held_out:  # the network alone (the planner's held-out JCTs: bench_plan_lookahead.py --table)
        held = score(tcfg, params, table, args.cluster, args.jobs, seed_list(args.held_out), False, args.check)
        summary["held_out_mean"] = mean(held, "network")
    print(json.dumps({"out": args.out, **summary}), flush=True)


if __name__ == "__main__":
    main()
