"""Slot-level PPO of the target-size policy (dl2d/policy/ppo.py) on the JAX environment: training throughput
and learning curves on held-out traces.

Training traces: DL2 traces of --jobs jobs, seeds 1000.. (one per parallel cluster; every cluster restarts its
trace when it finishes). Validation traces: seeds 500.. (--val-traces): the policy kept is the one with the
lowest validation JCT among the evaluations. Held-out test traces: seeds 0.. (--eval-traces), never trained on
nor used to choose: they are what is reported. Every --eval-every iterations the greedy policy (argmax) runs
each validation and test trace to its end in the same environment; the teacher (Optimus's allocation through
the same fill) runs there too. For reference the NumPy simulator's heuristics run the test traces (their own
placement and allocation), and so does the chosen learned policy (dl2d.policy.target.TargetPolicy: the same
parameters, its tasks placed on the servers). One JSON line per evaluation, then a summary line.

    python bench/bench_ppo.py                              # RL only, DL2 world, small preset, J = 40
    python bench/bench_ppo.py --sl-iters 30 --lr 1e-4      # supervised warm-up towards Optimus first
    python bench/bench_ppo.py ... --out FILE --curve-out FILE.json   # keep the chosen policy and the curve
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import dl2d
from dl2d.policy import ppo as P
from dl2d.policy import registry
from dl2d.policy import target as T
from dl2d.policy.checkpoint import TargetCheckpoint, save_target
from dl2d.sim import engine as E
from dl2d.sim import jaxenv as X
from dl2d.sim import trace as TR
from dl2d.sim.worlds import world


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", default="small")
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--clusters", type=int, default=64)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--iters", type=int, default=300, help="RL iterations")
    ap.add_argument("--sl-iters", type=int, default=0, help="supervised warm-up iterations (towards Optimus) first")
    ap.add_argument("--lr", type=float, default=1e-3, help="RL learning rate")
    ap.add_argument("--sl-lr", type=float, default=1e-3)
    ap.add_argument("--ent-coef", type=float, default=0.003)
    ap.add_argument("--credit", choices=("job", "slot"), default="job")
    ap.add_argument("--team-weight", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--val-traces", type=int, default=5, help="validation traces (seeds 500..): pick the policy")
    ap.add_argument("--eval-traces", type=int, default=5, help="held-out test traces (seeds 0..): report it")
    ap.add_argument("--eval-slots", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heuristics", default="optimus,elastic,drf")
    ap.add_argument("--out", default="", help="write the chosen policy here (a dl2d-target-policy checkpoint whose "
                    "meta records how it was made and its held-out JCT in the NumPy simulator)")
    ap.add_argument("--curve-out", default="", help="write the evaluations as JSON (bench/plot_ppo_curves.py)")
    args = ap.parse_args()

    cfg = world("dl2").sim_config(args.cluster)
    rl = P.PPOConfig(clusters=args.clusters, slots=args.slots, lr=args.lr, ent_coef=args.ent_coef,
                     credit=args.credit, team_weight=args.team_weight)
    sl = dataclasses.replace(rl, lr=args.sl_lr)
    tc = T.TargetConfig(max_workers=cfg.max_workers, max_ps=cfg.max_ps)
    gen = lambda seeds: [TR.generate(TR.TraceConfig(num_jobs=args.jobs), seed=s) for s in seeds]  # noqa: E731
    train, val, held = (gen(range(1000, 1000 + args.clusters)), gen(range(500, 500 + args.val_traces)),
                        gen(range(args.eval_traces)))
    env, states = X.from_traces(train, cfg, args.jobs, placement=False)
    _, val_states = X.from_traces(val, cfg, args.jobs, placement=False)
    _, held_states = X.from_traces(held, cfg, args.jobs, placement=False)

    def score(final) -> tuple[list[float], int]:
        """Average JCT per trace; a job unfinished after --eval-slots counts as running until then (a lower
        bound on its JCT), and how many were is returned beside."""
        fin = np.asarray(final.finished)
        arrival = np.asarray(final.jobs.arrival_slot, float)
        jct = np.where(fin, np.asarray(jax.vmap(X.jct)(final)), args.eval_slots - arrival)
        valid = np.asarray(final.jobs.valid)
        per = [round(float(jct[i][valid[i]].mean()), 3) for i in range(len(fin))]
        return per, int((~fin & valid).sum())

    teacher, _ = score(P.evaluate_teacher(tc, env, held_states, args.eval_slots))
    teacher_val, _ = score(P.evaluate_teacher(tc, env, val_states, args.eval_slots))
    reference = {}
    for name in [n for n in args.heuristics.split(",") if n]:
        reference[name] = [round(float(E.run(t, registry.make_heuristic(name), cfg, seed=s).jct_slots.mean()), 3)
                           for s, t in enumerate(held)]
    runner = P.init_runner(tc, sl if args.sl_iters else rl, states, jax.random.PRNGKey(args.seed))
    curve, t_train, slots_done = [], 0.0, 0
    best = {"val": np.inf}

    def evaluate(phase: str, it: int) -> None:
        jcts, unfinished = score(P.evaluate(tc, env, runner[0], held_states, args.eval_slots))
        val_jcts, _ = score(P.evaluate(tc, env, runner[0], val_states, args.eval_slots))
        row = {"phase": phase, "iter": it, "cluster_slots": slots_done, "train_s": round(t_train, 1),
               "val_mean": round(float(np.mean(val_jcts)), 3), "held_out_jct": jcts,
               "mean": round(float(np.mean(jcts)), 3), "unfinished_jobs": unfinished}
        curve.append(row)
        print(json.dumps(row), flush=True)
        if row["val_mean"] < best["val"]:
            best.update(val=row["val_mean"], params=jax.device_get(runner[0]), row=row)

    for phase, iters, fn, pc in (("sl", args.sl_iters, P.sl_step, sl), ("rl", args.iters, P.train_step, rl)):
        if not iters:
            continue
        runner, _ = jax.block_until_ready(fn(tc, pc, env, runner))  # compiles; its slots count too
        slots_done += pc.clusters * pc.slots
        evaluate(phase, 1)
        for it in range(2, iters + 1):
            t0 = time.perf_counter()
            runner, stats = fn(tc, pc, env, runner)
            jax.block_until_ready(stats)
            t_train += time.perf_counter() - t0
            slots_done += pc.clusters * pc.slots
            if it % args.eval_every == 0 or it == iters:
                evaluate(phase, it)
    timed = slots_done - rl.clusters * rl.slots * (int(args.sl_iters > 0) + int(args.iters > 0))
    chosen = best["row"]
    policy = T.TargetPolicy(tc, best["params"])  # the chosen parameters, in the NumPy simulator
    runs = [E.run(t, policy, cfg, seed=s) for s, t in enumerate(held)]
    learned_numpy = [round(float(r.jct_slots.mean()), 3) for r in runs]
    command = "python bench/bench_ppo.py " + " ".join(sys.argv[1:])
    if args.out:
        save_target(args.out, TargetCheckpoint(tc, best["params"], meta={
            "world": "dl2", "cluster": args.cluster, "jobs": args.jobs, "train_seeds": [1000, 999 + args.clusters],
            "validation_seeds": [500, 499 + args.val_traces], "chosen": f"{chosen['phase']} iteration {chosen['iter']}",
            "held_out_seeds": list(range(args.eval_traces)), "held_out_jct_numpy": learned_numpy,
            "held_out_jct_numpy_mean": round(float(np.mean(learned_numpy)), 3),
            "optimus_held_out_jct_numpy": reference.get("optimus"),
            "optimus_held_out_jct_numpy_mean": round(float(np.mean(reference["optimus"])), 3)
            if "optimus" in reference else None, "command": command,
            "dl2d_version": dl2d.__version__}))
    summary = {
        "summary": True, "command": command, "cluster": args.cluster, "J": args.jobs, "clusters": rl.clusters,
        "slots": rl.slots, "sl_iters": args.sl_iters, "rl_iters": args.iters, "credit": args.credit,
        "train_cluster_slots_per_s": round(timed / t_train) if t_train else None,
        "chosen": {"phase": chosen["phase"], "iter": chosen["iter"], "val_mean": chosen["val_mean"]},
        "learned": chosen["held_out_jct"], "learned_mean": chosen["mean"], "learned_numpy_engine": learned_numpy,
        "learned_numpy_engine_mean": round(float(np.mean(learned_numpy)), 3),
        "learned_decision_ms": round(float(np.mean([r.decision_ms for r in runs])), 2), "teacher_same_env": teacher,
        "teacher_mean": round(float(np.mean(teacher)), 3), "teacher_val_mean": round(float(np.mean(teacher_val)), 3),
        "numpy_engine": {k: {"per_trace": v, "mean": round(float(np.mean(v)), 3)} for k, v in reference.items()},
        "device": jax.devices()[0].platform, "cores": os.cpu_count(), "load_avg": round(os.getloadavg()[0], 2)}
    print(json.dumps(summary), flush=True)
    if args.curve_out:
        Path(args.curve_out).write_text(json.dumps({"summary": summary, "curve": curve}, indent=1) + "\n")


if __name__ == "__main__":
    main()
