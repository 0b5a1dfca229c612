"""Slot-level PPO of the target-size policy (dl2d/policy/ppo.py) on the JAX environment: training throughput
and a learning curve on held-out traces.

Training traces: DL2 traces of --jobs jobs, seeds 1000.. (one per parallel cluster; every cluster restarts its
trace when it finishes). Held-out traces: seeds 0..--eval-traces-1, never trained on. Every --eval-every
iterations the greedy policy (argmax) runs each held-out trace to its end in the same environment; the
teacher (the elastic heuristic's efficient sizes through the same fill) runs there too. For reference the
NumPy simulator's heuristics (Optimus, elastic, DRF) run the same held-out traces (their own placement and
allocation), and so does the final learned policy (dl2d.policy.target.TargetPolicy: the same parameters, its
tasks placed on the servers). One JSON line per evaluation, then a summary line.

    python bench/bench_ppo.py                          # RL only, DL2 world, small preset, J = 40
    python bench/bench_ppo.py --sl-iters 30            # supervised warm-up from the teacher first
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

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
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--sl-iters", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--ent-coef", type=float, default=0.003)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-traces", type=int, default=5)
    ap.add_argument("--eval-slots", type=int, default=2000)
    ap.add_argument("--credit", choices=("job", "slot"), default="job")
    ap.add_argument("--out", default="", help="write the final policy here (a dl2d-target-policy checkpoint whose "
                    "meta records how it was made and its held-out JCT in the NumPy simulator)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heuristics", default="optimus,elastic,drf")
    args = ap.parse_args()

    cfg = world("dl2").sim_config(args.cluster)
    pc = P.PPOConfig(clusters=args.clusters, slots=args.slots, lr=args.lr, ent_coef=args.ent_coef,
                     credit=args.credit)
    tc = T.TargetConfig(max_workers=cfg.max_workers, max_ps=cfg.max_ps)
    train = [TR.generate(TR.TraceConfig(num_jobs=args.jobs), seed=1000 + s) for s in range(args.clusters)]
    held = [TR.generate(TR.TraceConfig(num_jobs=args.jobs), seed=s) for s in range(args.eval_traces)]
    env, states = X.from_traces(train, cfg, args.jobs, placement=False)
    _, held_states = X.from_traces(held, cfg, args.jobs, placement=False)

    def score(final) -> tuple[list[float], int]:
        """Average JCT per held-out trace; a job unfinished after --eval-slots counts as running until then
        (a lower bound on its JCT), and how many were is returned beside."""
        fin = np.asarray(final.finished)
        arrival = np.asarray(final.jobs.arrival_slot, float)
        jct = np.where(fin, np.asarray(jax.vmap(X.jct)(final)), args.eval_slots - arrival)
        valid = np.asarray(final.jobs.valid)
        per = [round(float(jct[i][valid[i]].mean()), 3) for i in range(len(held))]
        return per, int((~fin & valid).sum())

    teacher, _ = score(P.evaluate_teacher(tc, env, held_states, args.eval_slots))
    reference = {}
    for name in [n for n in args.heuristics.split(",") if n]:
        reference[name] = [round(float(E.run(t, registry.make_heuristic(name), cfg, seed=s).jct_slots.mean()), 3)
                           for s, t in enumerate(held)]
    runner = P.init_runner(tc, pc, states, jax.random.PRNGKey(args.seed))
    curve, t_train, slots_done = [], 0.0, 0

    def evaluate(phase: str, it: int) -> None:
        jcts, unfinished = score(P.evaluate(tc, env, runner[0], held_states, args.eval_slots))
        row = {"phase": phase, "iter": it, "cluster_slots": slots_done, "train_s": round(t_train, 1),
               "held_out_jct": jcts, "mean": round(float(np.mean(jcts)), 3), "unfinished_jobs": unfinished}
        curve.append(row)
        print(json.dumps(row), flush=True)

    for phase, iters, fn in (("sl", args.sl_iters, P.sl_step), ("rl", args.iters, P.train_step)):
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
    timed = slots_done - pc.clusters * pc.slots * (int(args.sl_iters > 0) + int(args.iters > 0))
    learned = curve[-1]["held_out_jct"]
    policy = T.TargetPolicy(tc, jax.device_get(runner[0]))  # the same parameters, in the NumPy simulator
    runs = [E.run(t, policy, cfg, seed=s) for s, t in enumerate(held)]
    learned_numpy = [round(float(r.jct_slots.mean()), 3) for r in runs]
    if args.out:
        save_target(args.out, TargetCheckpoint(tc, jax.device_get(runner[0]), meta={
            "world": "dl2", "cluster": args.cluster, "jobs": args.jobs, "train_seeds": [1000, 1000 + args.clusters - 1],
            "held_out_seeds": list(range(args.eval_traces)), "held_out_jct_numpy": learned_numpy,
            "held_out_jct_numpy_mean": round(float(np.mean(learned_numpy)), 3),
            "command": "python bench/bench_ppo.py " + " ".join(sys.argv[1:]), "dl2d_version": dl2d.__version__}))
    print(json.dumps({
        "summary": True, "cluster": args.cluster, "J": args.jobs, "clusters": pc.clusters, "slots": pc.slots,
        "sl_iters": args.sl_iters, "rl_iters": args.iters, "credit": args.credit, "lr": args.lr, "train_cluster_slots_per_s": round(timed / t_train),
        "learned": learned, "learned_mean": round(float(np.mean(learned)), 3), "learned_numpy_engine": learned_numpy,
        "learned_numpy_engine_mean": round(float(np.mean(learned_numpy)), 3),
        "learned_decision_ms": round(float(np.mean([r.decision_ms for r in runs])), 2), "teacher_same_env": teacher,
        "teacher_mean": round(float(np.mean(teacher)), 3),
        "numpy_engine": {k: {"per_trace": v, "mean": round(float(np.mean(v)), 3)} for k, v in reference.items()},
        "device": jax.devices()[0].platform, "cores": os.cpu_count(), "load_avg": round(os.getloadavg()[0], 2)}),
        flush=True)


if __name__ == "__main__":
    main()
