"""Slot-level PPO of the target-size policy (dl2d/policy/target/ppo.py) on the JAX environment: training throughput
and learning curves on held-out traces.

The training itself is dl2d.policy.target.train's (what `dl2ctl train --policy dl2-target` runs). Training
traces: traces of the --world of --jobs jobs, seeds 1000.. (one per parallel cluster; every cluster restarts its
trace when it finishes). Validation traces: seeds 500.. (--val-traces): the policy kept is the one with the
lowest validation JCT among the evaluations. Held-out test traces: seeds 0.. (--eval-traces), never trained on
nor used to choose: they are what is reported. Every --eval-every iterations the greedy policy (argmax) runs
each validation and test trace to its end in the same environment; the teacher (Optimus's allocation through
the same fill) runs there too. For reference the NumPy simulator's heuristics run the test traces (their own
placement and allocation), and so does the chosen learned policy (dl2d.policy.target.view.TargetPolicy: the same
parameters, its tasks placed on the servers). One JSON line per evaluation, then a summary line.

    python bench/bench_ppo.py                              # RL only, DL2 world, small preset, J = 40
    python bench/bench_ppo.py --sl-iters 30 --lr 1e-4      # supervised warm-up towards Optimus first
    python bench/bench_ppo.py --teacher optimus-relative --sl-iters 30 ...   # ... towards the relative Optimus
    python bench/bench_ppo.py ... --out FILE --curve-out FILE.json   # keep the chosen policy and the curve
    python bench/bench_ppo.py --world today --cluster t4-16 --jobs 40 ...   # today's all-reduce world
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import jax
import numpy as np

from dl2d.policy.target import ppo as P
from dl2d.policy import registry
from dl2d.policy.target import policy as T
from dl2d.policy.target import view as TV
from dl2d.policy.target import train as TT
from dl2d.policy.checkpoint import TargetCheckpoint, save_target
from dl2d.sim import engine as E
from dl2d.sim import jaxenv as X


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="dl2", choices=("dl2", "today"))
    ap.add_argument("--cluster", default="small")
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--load", type=float, default=1.0, help="today: the Philly workload's load")
    ap.add_argument("--clusters", type=int, default=64)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--iters", type=int, default=300, help="RL iterations")
    ap.add_argument("--sl-iters", type=int, default=0, help="supervised warm-up iterations (towards the teacher) first")
    ap.add_argument("--teacher", default="optimus", choices=T.TargetConfig.TEACHERS,
                    help="the heuristic whose pair the features show and the warm-up imitates (dl2d.policy.target.teachers)")
    ap.add_argument("--prior", type=float, default=0.0, help="added to the teacher's pair's logit")
    ap.add_argument("--lr", type=float, default=1e-3, help="RL learning rate")
    ap.add_argument("--sl-lr", type=float, default=1e-3)
    ap.add_argument("--ent-coef", type=float, default=0.003)
    ap.add_argument("--credit", choices=("job", "slot"), default="job")
    ap.add_argument("--team-weight", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--val-traces", type=int, default=5, help="validation traces (seeds 500..): pick the policy")
    ap.add_argument("--eval-traces", type=int, default=5, help="held-out test traces (seeds 0..): report it")
    ap.add_argument("--eval-slots", type=int, default=20000, help="an evaluation episode is cut here")
    ap.add_argument("--seed", type=int, default=0, help="the network's initialisation and the rollouts' sampling")
    ap.add_argument("--heuristics", default="optimus,optimus-relative,elastic,drf")
    ap.add_argument("--out", default="", help="write the chosen policy here (a dl2d-target-policy checkpoint whose "
                    "meta records how it was made and its held-out JCT in the NumPy simulator)")
    ap.add_argument("--curve-out", default="", help="write the evaluations as JSON (bench/plot_ppo_curves.py)")
    args = ap.parse_args()

    setup = TT.TrainSetup(world=args.world, cluster=args.cluster, jobs=args.jobs, load=args.load,
                          clusters=args.clusters, slots=args.slots, teacher=args.teacher, prior=args.prior,
                          sl_iters=args.sl_iters, rl_iters=args.iters,
                          sl_lr=args.sl_lr, lr=args.lr, ent_coef=args.ent_coef, credit=args.credit,
                          team_weight=args.team_weight, eval_every=args.eval_every,
                          seed=1000, rng=args.seed, val_seed=500, val_traces=args.val_traces,
                          max_eval_slots=args.eval_slots)
    cfg = TT.sim_config(setup)
    tc = TT.target_config(cfg, args.teacher, args.prior)
    held = [TT.make_trace(setup, cfg, s) for s in range(args.eval_traces)]
    env, held_states = X.from_traces(held, cfg, args.jobs, placement=False)

    def held_out(episodes):
        final, reached = TT.run_to_end(episodes, held_states, args.eval_slots)
        return TT.average_jcts(final, reached)

    teacher, _ = held_out(lambda s, n: P.evaluate_teacher(tc, env, s, n))
    reference = {}
    for name in [n for n in args.heuristics.split(",") if n]:
        reference[name] = [round(float(E.run(t, registry.make_heuristic(name), cfg, seed=s).jct_slots.mean()), 3)
                           for s, t in enumerate(held)]

    def extra_eval(net) -> dict:
        jcts, unfinished = held_out(lambda s, n: P.evaluate(tc, env, net, s, n))
        return {"held_out_jct": [round(x, 3) for x in jcts], "mean": round(float(np.mean(jcts)), 3),
                "unfinished_jobs": unfinished}

    result = TT.train(setup, on_eval=lambda row: print(json.dumps(row), flush=True), extra_eval=extra_eval)
    chosen = result.chosen
    policy = TV.TargetPolicy(tc, result.params)  # the chosen parameters, in the NumPy simulator
    runs = [E.run(t, policy, cfg, seed=s) for s, t in enumerate(held)]
    learned_numpy = [round(float(r.jct_slots.mean()), 3) for r in runs]
    command = "python bench/bench_ppo.py " + " ".join(sys.argv[1:])
    if args.out:
        save_target(args.out, TargetCheckpoint(tc, result.params, meta=TT.checkpoint_meta(
            setup, result, command, held_out_seeds=list(range(args.eval_traces)),
            held_out_jct_numpy=learned_numpy, held_out_jct_numpy_mean=round(float(np.mean(learned_numpy)), 3),
            optimus_held_out_jct_numpy=reference.get("optimus"),
            optimus_held_out_jct_numpy_mean=round(float(np.mean(reference["optimus"])), 3)
            if "optimus" in reference else None,
            heuristics_held_out_jct_numpy_mean={k: round(float(np.mean(v)), 3) for k, v in reference.items()})))
    summary = {
        "summary": True, "command": command, "world": args.world, "cluster": args.cluster, "J": args.jobs,
        "clusters": args.clusters, "slots": args.slots, "teacher": args.teacher, "prior": args.prior,
        "sl_iters": args.sl_iters, "rl_iters": args.iters,
        "credit": args.credit,
        "train_cluster_slots_per_s": round(result.cluster_slots_per_s) if result.cluster_slots_per_s else None,
        "chosen": {"phase": chosen["phase"], "iter": chosen["iter"], "val_mean": chosen["val_mean"]},
        "learned": chosen["held_out_jct"], "learned_mean": chosen["mean"], "learned_numpy_engine": learned_numpy,
        "learned_numpy_engine_mean": round(float(np.mean(learned_numpy)), 3),
        "learned_decision_ms": round(float(np.mean([r.decision_ms for r in runs])), 2),
        "teacher_same_env": [round(x, 3) for x in teacher], "teacher_mean": round(float(np.mean(teacher)), 3),
        "teacher_val_mean": round(result.teacher_val_jct, 3),
        "numpy_engine": {k: {"per_trace": v, "mean": round(float(np.mean(v)), 3)} for k, v in reference.items()},
        "device": jax.devices()[0].platform, "cores": os.cpu_count(), "load_avg": round(os.getloadavg()[0], 2)}
    print(json.dumps(summary), flush=True)
    if args.curve_out:
        Path(args.curve_out).write_text(json.dumps({"summary": summary, "curve": result.curve}, indent=1) + "\n")


if __name__ == "__main__":
    main()
