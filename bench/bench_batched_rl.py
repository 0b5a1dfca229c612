"""Batched online RL (dl2d/policy/batched.py) after imitation of a heuristic, on the small preset.

SL from the teacher (traces seeds 0..sl_traces-1, bench_dagger's SL), optionally DAgger iterations, then rounds
of batched RL: K clusters in lockstep (training traces seeds 100..), one vmapped slot loop per slot,
--updates-per-slot updates after each. Greedy validation avg JCT (seed 10000) after every stage; one JSON line each.

    python bench/bench_batched_rl.py --k 8 --rounds 3 --slots 40
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from dl2d.policy import batched as B
from dl2d.policy import dagger as D
from dl2d.policy import train as TR
from dl2d.policy import learn as LN
from dl2d.policy.checkpoint import make_optimizer
from dl2d.policy.config import PolicyConfig
from dl2d.policy.nets import init_params
from dl2d.sim import cluster as C
from dl2d.sim import engine as E
from dl2d.sim import trace as T


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", default="optimus")
    ap.add_argument("--sl-traces", type=int, default=2)
    ap.add_argument("--sl-epochs", type=int, default=20)
    ap.add_argument("--dagger", type=int, default=0, help="DAgger iterations before RL")
    ap.add_argument("--k", type=int, default=8, help="clusters per batched slot")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slots", type=int, default=40, help="batched slots per round")
    ap.add_argument("--updates-per-slot", type=int, default=1)
    ap.add_argument("--rl-lr", type=float, default=1e-4)
    ap.add_argument("--n-step", type=int, default=10)
    ap.add_argument("--entropy-weight", type=float, default=0.0)
    ap.add_argument("--epsilon", type=float, default=0.0, help="job-aware exploration probability")
    ap.add_argument("--poor-skew", choices=("both", "workers", "none"), default="both",
                    help="which w/u skew is a poor state for job-aware exploration")
    ap.add_argument("--val-seed", type=int, default=10_000)
    args = ap.parse_args()
    t0 = time.time()

    def emit(**kw):
        print(json.dumps({**kw, "t_s": round(time.time() - t0, 1)}), flush=True)

    cfg = PolicyConfig(rl_lr=args.rl_lr, n_step=args.n_step, entropy_weight=args.entropy_weight,
                       epsilon=args.epsilon, poor_skew=args.poor_skew, updates_per_slot=args.updates_per_slot)
    sim = E.SimConfig(cluster=C.preset("small"), max_workers=cfg.max_workers, max_ps=cfg.max_ps)
    tc = T.TraceConfig(num_jobs=40)
    val = T.generate(tc, seed=args.val_seed)

    def val_jct(p):
        return round(TR.validate(cfg, p, val, sim).avg_jct_slots, 4)

    emit(args=vars(args))
    params = init_params(cfg, jax.random.PRNGKey(0))
    parts = [D.collect(cfg, params, T.generate(tc, seed=i), sim, args.teacher, seed=i, driver="teacher")
             for i in range(args.sl_traces)]
    data = tuple(np.concatenate(x) for x in zip(*parts))
    params, opt_state, _ = D.fit(cfg, params, data, args.sl_epochs, labels="action")
    emit(stage="sl", val_jct=val_jct(params))
    for it in range(args.dagger):
        s = args.sl_traces + it
        new = D.collect(cfg, params, T.generate(tc, seed=s), sim, args.teacher, seed=s)
        data = tuple(np.concatenate([a, b]) for a, b in zip(data, new))
        params, opt_state, _ = D.fit(cfg, params, data, 10, labels="action", seed=s, opt_state=opt_state)
        emit(stage=f"dagger{it + 1}", val_jct=val_jct(params))
    st = LN.RLState(params, make_optimizer(cfg.rl_lr).init(params), LN.Replay(cfg, seed=0))
    for r in range(args.rounds):
        traces = [T.generate(tc, seed=100 + r * args.k + k) for k in range(args.k)]
        totals = B.rl_batch(cfg, st, traces, sim, seed=100 + r * args.k, max_slots=args.slots)
        emit(stage=f"rl{r + 1}", updates=st.steps, mean_reward=round(float(np.mean(totals)), 4),
             val_jct=val_jct(st.params))


if __name__ == "__main__":
    main()
