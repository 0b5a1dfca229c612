"""Chic and Chic-Pair (IWQoS 2019) trained with the paper's modified cross-entropy method, then compared with
DRF / Tetris / Optimus / FIFO / SRTF on held-out traces (other trace seeds) of the same simulator.

    python bench/bench_chic.py --cluster small --iterations 12 --out docs/bench
    python bench/bench_chic.py --policies chic-pair --iterations 2 --episodes 4   # a quick look

Writes <out>/chic_<cluster>.json (every number, the per-iteration history and the settings) and the trained
checkpoints <out>/chic_<cluster>_<policy>.npz (not meant to be committed), and prints a Markdown table.
`train_with_progress` is the entry point a CLI can call (`dl2ctl train --algo chic`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dl2d.policy.seeds import chic as CH  # noqa: E402
from dl2d.policy.seeds import chic_train as CT  # noqa: E402
from dl2d.sim import cluster as C  # noqa: E402
from dl2d.sim import engine as E  # noqa: E402
from dl2d.sim import trace as T  # noqa: E402
from dl2d.policy.registry import make_heuristic, names as policy_names  # noqa: E402


def train_with_progress(cfg: CH.ChicConfig, train_traces, sim, iterations, val_traces=(), seed=0, log=print,
                        val_every: int = 2) -> CT.TrainResult:
    """`chic_train.train` under a rich progress bar (iterations, and episodes of the current iteration)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    cols = (TextColumn("{task.description:>22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"))
    with Progress(*cols, transient=False) as prog:
        it_task = prog.add_task(f"{cfg.name} iterations", total=iterations, info="")
        ep_task = prog.add_task("episodes", total=cfg.episodes + 1, info="")

        def on_episode(done, total):
            prog.update(ep_task, completed=done, total=total)

        def on_iteration(h: CT.IterationLog):
            val = f" val JCT {h.val_jct:.2f}" if h.val_jct is not None else ""
            info = f"xi {h.xi:.0f} mean R {h.mean_return:.0f} elites {h.elites}{val}"
            prog.update(it_task, advance=1, info=info)
            prog.update(ep_task, completed=0)
            log(f"{cfg.name} iteration {h.iteration}: {info} ({h.seconds:.1f}s)")

        return CT.train(cfg, train_traces, sim, iterations, val_traces=val_traces, val_every=val_every, seed=seed,
                        on_episode=on_episode, on_iteration=on_iteration)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", default="small")
    ap.add_argument("--jobs", type=int, default=30, help="jobs per trace (the paper's W = 30)")
    ap.add_argument("--max-arrivals", type=int, default=3)
    ap.add_argument("--policies", default="chic,chic-pair")
    ap.add_argument("--num-jobs", type=int, default=8, help="I, the first I jobs Chic schedules")
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--episodes", type=int, default=35, help="N per iteration (the paper: 35)")
    ap.add_argument("--fit-steps", type=int, default=50)
    ap.add_argument("--alpha", type=float, default=0.8, help="smoothing of the parameter update")
    ap.add_argument("--lr", type=float, default=0.01, help="Adam (the paper: 0.01)")
    ap.add_argument("--dropout", type=float, default=0.5, help="on the first hidden layer (the paper: 0.5)")
    ap.add_argument("--paper-traces", action="store_true",
                    help="a random training trace per episode (the paper) instead of one per iteration")
    ap.add_argument("--train-traces", type=int, default=8, help="training trace seeds 1..n")
    ap.add_argument("--val-traces", type=int, default=3, help="validation seeds 5000..")
    ap.add_argument("--test-traces", type=int, default=5, help="held-out test seeds 10000..")
    ap.add_argument("--train-max-slots", type=int, default=1500, help="episodes longer than this score as failed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/bench")
    ap.add_argument("--name", default=None, help="result file stem (default chic_<cluster>)")
    ap.add_argument("--skip-baselines", action="store_true")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="only combine result files of separate runs (same traces) into <out>/<name>.json")
    args = ap.parse_args()
    if args.merge:
        return merge(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)

    sim = E.SimConfig(cluster=C.preset(args.cluster))
    train_sim = replace(sim, max_slots=args.train_max_slots)
    tc = T.TraceConfig(num_jobs=args.jobs, max_arrivals_per_slot=args.max_arrivals)
    train = [T.generate(tc, seed=s) for s in range(1, args.train_traces + 1)]
    val = [T.generate(tc, seed=5000 + s) for s in range(args.val_traces)]
    test = [T.generate(tc, seed=10_000 + s) for s in range(args.test_traces)]
    res = {"args": {k: v for k, v in vars(args).items() if k not in ("out", "merge")}, "trace_config": {k: v for k, v in vars(tc).items()}, "cluster": vars(sim.cluster),
           "test_seeds": [10_000 + s for s in range(args.test_traces)], "policies": {}, "training": {}}

    def score(name, make):
        runs = [E.run(tr, make(), sim, seed=i) for i, tr in enumerate(test)]
        jct = [r.avg_jct_slots for r in runs]
        res["policies"][name] = {
            "avg_jct_slots": round(float(np.mean(jct)), 3), "per_trace_avg_jct_slots": [round(x, 3) for x in jct],
            "avg_jct_hours": round(float(np.mean(jct)) * sim.slot_seconds / 3600, 3),
            "makespan_slots": round(float(np.mean([r.makespan_slots for r in runs])), 2),
            "gpu_util": round(float(np.mean([np.mean(r.gpu_util) for r in runs])), 4),
            "decision_ms": round(float(np.mean([r.decision_ms for r in runs])), 3),
        }
        log(f"{name}: held-out avg JCT {np.mean(jct):.2f} slots {[round(x, 1) for x in jct]}")

    for name in () if args.skip_baselines else policy_names(heuristic=True):
        score(name, lambda name=name: make_heuristic(name))

    for pol in [p.strip() for p in args.policies.split(",") if p.strip()]:
        cfg = CH.ChicConfig(pair=(pol == "chic-pair"), num_jobs=args.num_jobs, episodes=args.episodes,
                            fit_steps=args.fit_steps, alpha=args.alpha, lr=args.lr,
                            dropout=args.dropout, common_trace=not args.paper_traces)
        t1 = time.time()
        tr_res = train_with_progress(cfg, train, train_sim, args.iterations, val, seed=args.seed, log=log)
        secs = time.time() - t1
        ckpt = out / f"chic_{args.cluster}_{pol}.npz"
        CH.save_checkpoint(ckpt, cfg, tr_res.params, {"best_val_jct": tr_res.best_val_jct, "iterations": args.iterations})
        res["training"][pol] = {"config": cfg.to_dict(), "seconds": round(secs, 1), "best_val_jct": tr_res.best_val_jct,
                                "history": [vars(h) for h in tr_res.history]}
        score(pol, lambda ckpt=ckpt: CH.load_scheduler(ckpt))

    path = out / f"{args.name or 'chic_' + args.cluster}.json"
    path.write_text(json.dumps(res, indent=1, default=float))
    log(f"wrote {path}")
    table(res)


def merge(args):
    docs = [json.loads(Path(f).read_text()) for f in args.merge]
    seeds = {tuple(d["test_seeds"]) for d in docs}
    if len(seeds) != 1 or len({json.dumps(d["trace_config"], sort_keys=True) for d in docs}) != 1:
        raise SystemExit("the result files were not measured on the same test traces")
    drop = ("out", "merge")  # local paths stay out of committed results
    res = {"runs": [{k: v for k, v in d["args"].items() if k not in drop} for d in docs], "trace_config": docs[0]["trace_config"], "cluster": docs[0]["cluster"],
           "test_seeds": docs[0]["test_seeds"], "policies": {}, "training": {}}
    for d in docs:
        res["policies"].update(d["policies"])
        res["training"].update(d["training"])
    path = Path(args.out) / f"{args.name or 'chic_' + args.cluster}.json"
    path.write_text(json.dumps(res, indent=1, default=float))
    print(f"wrote {path}")
    table(res)


def table(res):
    print("\n| policy | held-out avg JCT (slots) | avg JCT (h) | makespan (slots) | GPU util |")
    print("|---|---|---|---|---|")
    for name, r in res["policies"].items():
        print(f"| {name} | {r['avg_jct_slots']:.2f} | {r['avg_jct_hours']:.2f} | {r['makespan_slots']:.1f} | "
              f"{r['gpu_util']:.3f} |")


if __name__ == "__main__":
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    main()
