"""DL2 Fig. 9 / Fig. 10 on the simulator: DL2 (SL+RL) vs the baselines, and learning curves.

Trains on traces with seeds 1.., validates on a held-out trace (another seed), all at the given scale
(default: the paper's, 500 servers and 200 jobs). Writes a JSON of every number, a PNG of the learning
curves, and prints a Markdown table. The budget (episodes) is a flag: say what was run when quoting.

    python bench/bench_dl2.py --episodes 6 --out docs/bench
    python bench/bench_dl2.py --teacher optimus --n-step 10 --entropy-weight 0.01 --out docs/bench
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

from dl2d.policy.dl2 import train as TR
from dl2d.policy.dl2 import learn as LN
from dl2d.policy.checkpoint import Checkpoint, make_optimizer, save
from dl2d.policy.dl2.config import PolicyConfig
from dl2d.policy.dl2.nets import init_params
from dl2d.sim import cluster as C
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.policy.registry import make_heuristic, names as policy_names


def curve(cfg, params, sim, tc, val, episodes, seed0, label, log):
    st = LN.RLState(params, make_optimizer(cfg.rl_lr).init(params), LN.Replay(cfg, seed=seed0))
    points = [(0, TR.validate(cfg, st.params, val, sim).avg_jct_slots)]
    log(f"{label}: step 0 val JCT {points[-1][1]:.2f} slots")
    for ep in range(episodes):
        TR.rl_episode(cfg, st, T.generate(tc, seed=seed0 + ep), sim, seed=seed0 + ep)
        points.append((st.steps, TR.validate(cfg, st.params, val, sim).avg_jct_slots))
        log(f"{label}: episode {ep + 1} updates {st.steps} val JCT {points[-1][1]:.2f} slots")
    return st.params, points


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", default="dl2")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--teacher", default="drf",
                    help="SL teacher: a baseline (drf, tetris, optimus, fifo, srtf) or oracle (the simulator's speed "
                         "oracle, which knows the true speeds: an ablation, not a real teacher)")
    ap.add_argument("--sl-traces", type=int, default=2)
    ap.add_argument("--sl-slots", type=int, default=120, help="slots of each teacher trace used for SL")
    ap.add_argument("--sl-epochs", type=int, default=20)
    ap.add_argument("--episodes", type=int, default=6, help="RL episodes (one training trace each)")
    ap.add_argument("--rl-only-episodes", type=int, default=None,
                    help="episodes of the RL-only curve [default: --episodes]; 0 skips it")
    ap.add_argument("--n-step", type=int, default=PolicyConfig.n_step, help="RL: n-step return of the critic target")
    ap.add_argument("--entropy-weight", type=float, default=PolicyConfig.entropy_weight)
    ap.add_argument("--updates-per-slot", type=int, default=PolicyConfig.updates_per_slot)
    ap.add_argument("--epsilon", type=float, default=PolicyConfig.epsilon, help="RL: job-aware exploration")
    ap.add_argument("--rl-lr", type=float, default=PolicyConfig.rl_lr)
    ap.add_argument("--advantage", choices=("critic", "greedy"), default=PolicyConfig.advantage,
                    help="RL: value-network advantage (DL2) or self-critical over the greedy policy's slot reward")
    ap.add_argument("--val-seed", type=int, default=10_000)
    ap.add_argument("--out", default="docs/bench")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)

    cfg = PolicyConfig(n_step=args.n_step, entropy_weight=args.entropy_weight, updates_per_slot=args.updates_per_slot,
                       epsilon=args.epsilon, rl_lr=args.rl_lr, advantage=args.advantage)
    sim = E.SimConfig(cluster=C.preset(args.cluster))
    tc = T.TraceConfig(num_jobs=args.jobs)
    val = T.generate(tc, seed=args.val_seed)
    res = {"args": vars(args), "baselines": {}}
    for name in policy_names(heuristic=True):
        r = E.run(val, make_heuristic(name), sim)
        res["baselines"][name] = r.summary()
        log(f"{name}: avg JCT {r.avg_jct_slots:.2f} slots")

    init = init_params(cfg, jax.random.PRNGKey(0))
    data = [TR.teacher_samples(cfg, init, T.generate(tc, seed=s), sim, args.teacher, seed=s, max_slots=args.sl_slots)
            for s in range(1, args.sl_traces + 1)]
    data = tuple(np.concatenate(x) for x in zip(*data))
    log(f"SL: {len(data[2])} samples from {args.teacher}")
    sl_curve = []

    def on_epoch(ep, loss, params):
        if ep % 5 == 4 or ep == args.sl_epochs - 1:
            sl_curve.append((ep + 1, loss, TR.validate(cfg, params, val, sim).avg_jct_slots))
            log(f"SL epoch {ep + 1}: loss {loss:.3f} val JCT {sl_curve[-1][2]:.2f}")

    sl_params, _ = LN.supervised(cfg, init, data, args.sl_epochs, on_epoch=on_epoch)
    res["sl"] = {"curve": sl_curve, "accuracy": LN.imitation_accuracy(cfg, sl_params, data)}
    slrl_params, slrl = curve(cfg, sl_params, sim, tc, val, args.episodes, 1000, "SL+RL", log)
    rl_eps = args.episodes if args.rl_only_episodes is None else args.rl_only_episodes
    rl_only = curve(cfg, init, sim, tc, val, rl_eps, 1000, "RL only", log)[1] if rl_eps > 0 else []
    res["sl_rl_curve"], res["rl_only_curve"] = slrl, rl_only
    final = TR.validate(cfg, slrl_params, val, sim)
    res["dl2"] = final.summary()
    save(out / "dl2-bench.ckpt", Checkpoint(cfg, slrl_params, meta={"bench": vars(args)}))
    res["wall_s"] = time.time() - t0
    (out / "dl2_bench.json").write_text(json.dumps(res, indent=1, default=float))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s for s, _ in slrl], [j for _, j in slrl], "-o", label="SL + RL")
    if rl_only:
        ax.plot([s for s, _ in rl_only], [j for _, j in rl_only], "-o", label="RL only")
    ax.axhline(sl_curve[-1][2], color="C2", ls="--", label=f"SL only ({args.teacher})")
    for name, c in (("drf", "C3"), ("optimus", "C4")):
        ax.axhline(res["baselines"][name]["avg_jct_slots"], color=c, ls=":", label=name.upper() if name == "drf" else "Optimus")
    ax.set_xlabel(f"RL updates ({args.updates_per_slot} per slot)")
    ax.set_ylabel("avg JCT on validation trace (slots)")
    ax.set_title(f"Learning curves, {args.cluster} cluster, {args.jobs} jobs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "dl2_learning_curves.png", dpi=110)

    rows = [(n, s["avg_jct_slots"], s["avg_jct_hours"], s["makespan_slots"], s["gpu_util"]) for n, s in res["baselines"].items()]
    rows.append(("dl2 (SL+RL)", final.avg_jct_slots, final.avg_jct_hours, final.makespan_slots, float(np.mean(final.gpu_util))))
    print("| policy | avg JCT (slots) | avg JCT (h) | makespan (slots) | GPU util |\n|---|---|---|---|---|")
    for n, a, h, m, g in rows:
        print(f"| {n} | {a:.2f} | {h:.2f} | {m:.1f} | {g:.3f} |")
    log("done")


if __name__ == "__main__":
    main()
