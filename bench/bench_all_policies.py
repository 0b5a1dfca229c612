"""Every policy of the project on the same held-out traces, in one table: DRF, Tetris, Optimus, FIFO,
SRTF, DL2, Chic and Chic-Pair, each with its own placement and re-placed by DLTAP, and the dual-agent
scheduler, with the cross-node communication model and heterogeneous, fluctuating servers on (the setting
of bench/bench_placement.py). Reports average JCT, makespan, cross-node traffic and GPU utilisation, and the
papers' headline comparisons computed from these rows.

The learned policies are trained here on training trace seeds (never the test seeds), in the same simulator
setting, unless a checkpoint is given:

    # everything in one process (trains DL2, Chic, Chic-Pair briefly, then evaluates)
    python bench/bench_all_policies.py --out docs/bench/all_policies.json
    # or: train separately (in parallel), then evaluate with the checkpoints
    python bench/bench_all_policies.py --train-only dl2 --ckpt-dir runs
    python bench/bench_all_policies.py --train-only chic --ckpt-dir runs
    python bench/bench_all_policies.py --train-only chic-pair --ckpt-dir runs
    python bench/bench_all_policies.py --dl2-checkpoint runs/all_dl2.ckpt --chic-checkpoint runs/all_chic.npz \\
        --chic-pair-checkpoint runs/all_chic-pair.npz --out docs/bench/all_policies.json

Checkpoints carry their training budget in their meta, which the result JSON and the table notes repeat.
A run that cannot finish (a policy that starves, over --max-slots) or breaks is a row with its error, not
a dropped row.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import bench_placement as BP  # noqa: E402  (metrics of a run)
from bench_chic import train_with_progress  # noqa: E402
from dl2d.sim import engine as E  # noqa: E402
from dl2d.sim import hetero  # noqa: E402
from dl2d.policy.registry import make_heuristic, names as policy_names  # noqa: E402
from dl2d.sim.cluster import ClusterSpec, preset  # noqa: E402
from dl2d.policy.seeds.dltap import with_dltap  # noqa: E402
from dl2d.sim.trace import TraceConfig, generate  # noqa: E402

LEARNED = ("dl2", "chic", "chic-pair")
TRAIN_HETERO_SEED = 1  # the server speed map of every training run (test runs: hetero_seed = trace seed)


def sim_config(args, hetero_seed: int, max_slots: int) -> E.SimConfig:
    spec = ClusterSpec(args.servers) if args.servers else preset(args.cluster)
    return E.SimConfig(cluster=spec, cross_node_comm=True, server_speed_classes=hetero.THREE_GENERATIONS,
                       speed_walk_sigma=args.walk_sigma, hetero_seed=hetero_seed, max_slots=max_slots)


def trace_config(args) -> TraceConfig:
    return TraceConfig(num_jobs=args.jobs, max_arrivals_per_slot=args.arrivals)


# ---------------------------------------------------------------- training

def train_dl2(args, path: Path, log) -> dict:
    """SL from `args.dl2_teacher` on training traces, then online RL, in the benchmark's simulator setting."""
    import jax
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dl2d.policy.dl2 import train as TR
    from dl2d.policy.dl2 import learn as LN
    from dl2d.policy.checkpoint import Checkpoint, make_optimizer, save
    from dl2d.policy.dl2.config import PolicyConfig
    from dl2d.policy.dl2.nets import init_params

    t0 = time.time()
    cfg = PolicyConfig(max_jobs=max(40, args.jobs))
    sim = sim_config(args, TRAIN_HETERO_SEED, args.train_max_slots)
    tc = trace_config(args)
    val = generate(tc, seed=args.val_seed)
    params = init_params(cfg, jax.random.PRNGKey(0))
    cols = (TextColumn("{task.description:>22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"))
    info: dict = {"teacher": args.dl2_teacher, "sl_traces": list(range(1, args.dl2_sl_traces + 1)),
                  "sl_slots_per_trace": args.dl2_sl_slots, "sl_epochs": args.dl2_sl_epochs,
                  "rl_slots": args.dl2_rl_slots, "val_seed": args.val_seed, "config": cfg.to_dict()}
    with Progress(*cols, transient=False) as prog:
        task = prog.add_task(f"DL2 SL samples ({args.dl2_teacher})", total=args.dl2_sl_traces, info="")
        data = TR.sl_data(cfg, params, ((generate(tc, seed=s), s) for s in range(1, args.dl2_sl_traces + 1)), sim,
                          args.dl2_teacher, max_slots=args.dl2_sl_slots, on_trace=lambda: prog.advance(task))
        task = prog.add_task("DL2 SL epochs", total=args.dl2_sl_epochs, info="")
        params, losses = LN.supervised(cfg, params, data, args.dl2_sl_epochs,
                                       on_epoch=lambda ep, loss, _p: prog.update(task, advance=1,
                                                                                 info=f"loss {loss:.3f}"))
        info["sl_samples"] = int(len(data[2]))
        info["sl_final_loss"] = round(losses[-1], 4) if losses else None
        info["imitation_accuracy"] = round(LN.imitation_accuracy(cfg, params, data), 4)
        info["val_jct_slots_sl"] = round(TR.validate(cfg, params, val, sim).avg_jct_slots, 3)
        log(f"DL2 SL: {info['sl_samples']} samples, accuracy {info['imitation_accuracy']}, "
            f"val JCT {info['val_jct_slots_sl']} slots")
        st = LN.RLState(params, make_optimizer(cfg.rl_lr).init(params), LN.Replay(cfg, seed=0))
        task = prog.add_task("DL2 RL slots", total=args.dl2_rl_slots, info="")

        def on_slot(_n, reward):
            prog.update(task, advance=1, info=f"updates {st.steps} reward {reward:.3f}")

        # RL training traces 100, 101, ...
        info["rl_traces"] = TR.rl_slots(cfg, st, sim, args.dl2_rl_slots,
                                        lambda k: (generate(tc, seed=100 + k), 100 + k), on_slot)
        done = args.dl2_rl_slots
        info["rl_updates"] = st.steps
        info["val_jct_slots_sl_rl"] = round(TR.validate(cfg, st.params, val, sim).avg_jct_slots, 3)
        log(f"DL2 RL: {done} slots, {st.steps} updates, val JCT {info['val_jct_slots_sl_rl']} slots")
    info["seconds"] = round(time.time() - t0, 1)
    save(path, Checkpoint(cfg, st.params, st.opt_state, meta={"bench_all_policies": info}))
    return info


def train_chic(args, pol: str, path: Path, log) -> dict:
    from dl2d.policy.seeds import chic as CH
    t0 = time.time()
    cfg = CH.ChicConfig(pair=(pol == "chic-pair"), num_jobs=args.chic_num_jobs, episodes=args.chic_episodes,
                        fit_steps=args.chic_fit_steps, lr=args.chic_lr, dropout=args.chic_dropout, common_trace=True)
    tc = trace_config(args)
    train = [generate(tc, seed=s) for s in range(1, args.chic_train_traces + 1)]
    val = [generate(tc, seed=args.val_seed)]
    res = train_with_progress(cfg, train, sim_config(args, TRAIN_HETERO_SEED, args.train_max_slots),
                              args.chic_iterations, val, seed=0, log=log, val_every=1)
    info = {"config": cfg.to_dict(), "iterations": args.chic_iterations,
            "episodes": args.chic_iterations * (cfg.episodes + 1),
            "train_traces": list(range(1, args.chic_train_traces + 1)), "val_seed": args.val_seed,
            "best_val_jct_slots": res.best_val_jct, "history": [vars(h) for h in res.history],
            "seconds": round(time.time() - t0, 1)}
    CH.save_checkpoint(path, cfg, res.params, {"bench_all_policies": info})
    return info


def checkpoint_meta(pol: str, path: Path) -> dict:
    if pol == "dl2":
        from dl2d.policy.checkpoint import load
        meta = load(path).meta
    else:
        from dl2d.policy.seeds.chic import load_checkpoint
        meta = load_checkpoint(path)[2]
    return meta.get("bench_all_policies", {"note": "checkpoint not trained by this script", "meta": meta})


def make_learned(pol: str, path: Path):
    from dl2d.policy import registry
    return registry.build(pol, registry.PolicyOptions(checkpoint=str(path)))


# ---------------------------------------------------------------- evaluation

def headline(rows: list[dict]) -> dict:
    """Paper-style comparisons from the mean over test seeds of finished rows."""
    def mean(policy, placement, key="avg_jct_hours"):
        v = [r[key] for r in rows if r["policy"] == policy and r["placement"] == placement and "error" not in r]
        return float(np.mean(v)) if v and len(v) == len({r["seed"] for r in rows}) else None

    def pct(a, b):
        return None if a is None or b is None else round(100 * (a - b) / b, 1)

    out = {}
    for pol in ("dl2", "chic", "chic-pair"):
        out[f"{pol}_vs_drf_jct_pct"] = pct(mean(pol, "own"), mean("drf", "own"))
        out[f"{pol}_vs_optimus_jct_pct"] = pct(mean(pol, "own"), mean("optimus", "own"))
    for pol in (*policy_names(heuristic=True), *LEARNED):
        gb = "cross_node_gb_total"
        out[f"dltap_{pol}_traffic_pct"] = pct(mean(pol, "dltap", gb), mean(pol, "own", gb))
        out[f"dltap_{pol}_jct_pct"] = pct(mean(pol, "dltap"), mean(pol, "own"))
    tr = [out[f"dltap_{p}_traffic_pct"] for p in (*policy_names(heuristic=True), *LEARNED) if out[f"dltap_{p}_traffic_pct"] is not None]
    jc = [out[f"dltap_{p}_jct_pct"] for p in (*policy_names(heuristic=True), *LEARNED) if out[f"dltap_{p}_jct_pct"] is not None]
    out["dltap_mean_traffic_pct"] = round(float(np.mean(tr)), 1) if tr else None
    out["dltap_mean_jct_pct"] = round(float(np.mean(jc)), 1) if jc else None
    heur = {p: mean(p, "own") for p in policy_names(heuristic=True)}
    heur = {p: v for p, v in heur.items() if v is not None}
    if heur:
        best = min(heur, key=heur.get)
        out["best_heuristic"] = best
        out["dual_agent_vs_best_heuristic_jct_pct"] = pct(mean("dual-agent", "rwgp"), heur[best])
    return out


def evaluate(args, ckpts: dict, log) -> list[dict]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dl2d.policy.seeds.dual_agent import DualAgent

    tc = trace_config(args)
    policies = [p for p in args.policies.split(",") if p]
    runs = []
    for seed in args.test_seeds:
        for pol in policies:
            if pol == "dual-agent":
                runs.append((seed, pol, "rwgp"))
            else:
                runs += [(seed, pol, "own"), (seed, pol, "dltap")]
    rows = []
    cols = (TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"))
    with Progress(*cols, transient=False) as prog:
        task = prog.add_task("evaluate", total=len(runs), info="")
        for seed, pol, placement in runs:
            prog.update(task, info=f"seed {seed} {pol} {placement}")
            trace = generate(tc, seed=seed)
            cfg = sim_config(args, seed, args.max_slots)
            if pol == "dual-agent":
                sched = DualAgent()
            elif pol in LEARNED:
                sched = make_learned(pol, ckpts[pol])
            else:
                sched = make_heuristic(pol)
            if placement == "dltap":
                sched = with_dltap(sched)
            row = {"seed": seed, "policy": pol, "placement": placement}
            t = time.time()
            try:
                r = E.run(trace, sched, cfg, seed=seed)
                row.update(BP.metrics(r))
                row["makespan_slots"] = round(r.makespan_slots, 2)
                row["avg_jct_slots"] = round(r.avg_jct_slots, 3)
                row["decision_ms"] = round(r.decision_ms, 3)
                if pol == "dual-agent" and sched.errors:
                    err = np.array(sched.errors)
                    row["rwgp_mae"] = round(float(err[:, 0].mean()), 4)
                    row["last_value_mae"] = round(float(err[:, 1].mean()), 4)
            except (RuntimeError, ValueError) as e:  # a starving policy (max_slots) or a capacity error
                row["error"] = f"{type(e).__name__}: {e}"
                row["wall_s"] = round(time.time() - t, 1)
            rows.append(row)
            short = {k: row.get(k) for k in ("avg_jct_hours", "makespan_hours", "cross_node_gb_total", "gpu_util",
                                             "unplaced_tasks", "error")}
            log(f"seed {seed} {pol:>10} {placement:>5}: {short} ({time.time() - t:.1f}s)")
            prog.advance(task)
    return rows


def aggregate(rows: list[dict]) -> list[dict]:
    keys = ("avg_jct_hours", "makespan_hours", "cross_node_gb_total", "cross_node_fraction", "gpu_util",
            "unplaced_tasks", "decision_ms")
    out, seen = [], []
    for r in rows:
        if (r["policy"], r["placement"]) not in seen:
            seen.append((r["policy"], r["placement"]))
    order = [*policy_names(heuristic=True), *LEARNED, "dual-agent"]
    seen.sort(key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k[1] != "own"))
    for pol, pl in seen:
        sel = [r for r in rows if r["policy"] == pol and r["placement"] == pl]
        ok = [r for r in sel if "error" not in r]
        agg = {"policy": pol, "placement": pl, "seeds": len(sel), "finished": len(ok)}
        if ok:
            agg.update({k: round(float(np.mean([r[k] for r in ok])), 4) for k in keys})
        errs = sorted({r["error"] for r in sel if "error" in r})
        if errs:
            agg["errors"] = errs
        out.append(agg)
    return out


def table(agg: list[dict]) -> str:
    lines = ["| policy | placement | avg JCT (h) | makespan (h) | cross-node traffic (PiB) | cross-node share | "
             "GPU util | unplaced tasks | decision ms/slot |", "|---|---|---|---|---|---|---|---|---|"]
    for a in agg:
        if not a["finished"]:
            lines.append(f"| {a['policy']} | {a['placement']} | did not finish: {'; '.join(a['errors'])} |||||||")
            continue
        note = f" ({a['finished']}/{a['seeds']} seeds)" if a["finished"] < a["seeds"] else ""
        lines.append(f"| {a['policy']}{note} | {a['placement']} | {a['avg_jct_hours']:.1f} | "
                     f"{a['makespan_hours']:.1f} | {a['cross_node_gb_total'] / 1024 ** 2:.2f} | "
                     f"{a['cross_node_fraction']:.3f} | {a['gpu_util']:.3f} | "
                     f"{a['unplaced_tasks']:.0f} | {a['decision_ms']:.1f} |")
    return "\n".join(lines)


def merge(files, out_path):
    docs = [json.loads(Path(f).read_text()) for f in files]
    if len({json.dumps(d["setting"], sort_keys=True) for d in docs}) != 1:
        raise SystemExit("the result files were not measured in the same setting (traces, cluster, seeds)")
    rows = [r for d in docs for r in d["rows"]]
    out = {"commands": [d["command"] for d in docs], "machine": docs[0]["machine"], "setting": docs[0]["setting"],
           "checkpoints": {k: v for d in docs for k, v in d["checkpoints"].items()},
           "training": {k: v for d in docs for k, v in d["training"].items()},
           "wall_s": [d["wall_s"] for d in docs], "summary": aggregate(rows), "headline": headline(rows), "rows": rows}
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {out_path}")
    print(table(out["summary"]))
    print(json.dumps(out["headline"], indent=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", default="small", help="cluster preset (small: 40 servers of 2 GPUs)")
    ap.add_argument("--servers", type=int, default=None, help="servers (overrides --cluster)")
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--arrivals", type=int, default=3, help="max arrivals per slot")
    ap.add_argument("--walk-sigma", type=float, default=0.1, help="per-server log-speed random walk")
    ap.add_argument("--test-seeds", type=lambda s: [int(x) for x in s.split(",")], default=[10000, 10001],
                    help="held-out trace seeds (training uses 1.., 100.., validation --val-seed)")
    ap.add_argument("--val-seed", type=int, default=5000)
    ap.add_argument("--max-slots", type=int, default=8000,
                    help="a test run longer than this is reported as not finished")
    ap.add_argument("--train-max-slots", type=int, default=4000)
    ap.add_argument("--policies", default=",".join((*policy_names(heuristic=True), *LEARNED, "dual-agent")))
    ap.add_argument("--train-only", choices=LEARNED, help="train this learned policy into --ckpt-dir and stop")
    ap.add_argument("--ckpt-dir", default="runs")
    for pol in LEARNED:
        ap.add_argument(f"--{pol}-checkpoint", default=None, help=f"reuse this {pol} checkpoint instead of training")
    ap.add_argument("--dl2-teacher", default="optimus", help="SL teacher (optimus: the strongest baseline here)")
    ap.add_argument("--dl2-sl-traces", type=int, default=2)
    ap.add_argument("--dl2-sl-slots", type=int, default=150)
    ap.add_argument("--dl2-sl-epochs", type=int, default=10)
    ap.add_argument("--dl2-rl-slots", type=int, default=300)
    ap.add_argument("--chic-iterations", type=int, default=3)
    ap.add_argument("--chic-episodes", type=int, default=6)
    ap.add_argument("--chic-train-traces", type=int, default=4)
    ap.add_argument("--chic-num-jobs", type=int, default=8)
    ap.add_argument("--chic-fit-steps", type=int, default=60)
    ap.add_argument("--chic-lr", type=float, default=0.02)
    ap.add_argument("--chic-dropout", type=float, default=0.0)
    ap.add_argument("--out", default="docs/bench/all_policies.json")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="only combine result files of separate runs (same setting and test seeds) into --out")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)
    if args.val_seed in args.test_seeds:
        ap.error("the validation seed must not be a test seed")
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)

    ckdir = Path(args.ckpt_dir)
    ckdir.mkdir(parents=True, exist_ok=True)
    wanted = [p for p in args.policies.split(",") if p]
    ckpts, training = {}, {}
    for pol in LEARNED:
        if args.train_only and pol != args.train_only:
            continue
        if pol not in wanted and not args.train_only:
            continue
        given = getattr(args, f"{pol.replace('-', '_')}_checkpoint")
        if given and not args.train_only:
            ckpts[pol] = Path(given)
        else:
            ckpts[pol] = ckdir / (f"all_{pol}.ckpt" if pol == "dl2" else f"all_{pol}.npz")
            log(f"training {pol} -> {ckpts[pol]}")
            (train_dl2(args, ckpts[pol], log) if pol == "dl2" else train_chic(args, pol, ckpts[pol], log))
        training[pol] = checkpoint_meta(pol, ckpts[pol])
    if args.train_only:
        log(f"trained {args.train_only}: {ckpts[args.train_only]}")
        return
    rows = evaluate(args, ckpts, log)
    agg = aggregate(rows)
    spec = ClusterSpec(args.servers) if args.servers else preset(args.cluster)
    out = {
        "command": "python bench/bench_all_policies.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "setting": {"cluster": args.servers and f"{args.servers} servers" or args.cluster,
                    "servers": spec.num_servers, "jobs": args.jobs, "max_arrivals_per_slot": args.arrivals,
                    "test_seeds": args.test_seeds, "val_seed": args.val_seed, "cross_node_comm": True,
                    "speed_classes": list(hetero.THREE_GENERATIONS), "walk_sigma": args.walk_sigma,
                    "hetero_seed": "test: the trace seed; training: %d" % TRAIN_HETERO_SEED,
                    "max_slots": args.max_slots, "dltap": "with_dltap(scheduler), weight 1, interleaved"},
        "checkpoints": {p: Path(c).name for p, c in ckpts.items()},  # names only: no local paths
        "training": training,
        "wall_s": round(time.time() - t0, 1),
        "summary": agg,
        "headline": headline(rows),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    log(f"wrote {args.out}")
    print(table(agg))
    print(json.dumps(out["headline"], indent=1))


if __name__ == "__main__":
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    main()
