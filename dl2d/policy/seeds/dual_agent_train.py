"""Training the dual-agent scheduler's ordering agent in the simulator (the documented simpler learning rule:
a cross-entropy method over theta). The scheduler itself (dl2d.policy.seeds.dual_agent) needs no simulator."""
from __future__ import annotations

import numpy as np

from dl2d.policy.seeds.dual_agent import SRTF_THETA, DualAgent
from dl2d.sim.engine import SimConfig, run


def train_ordering_cem(traces, cfg: SimConfig, iters: int = 4, population: int = 8, elite: int = 2,
                       sigma: float = 0.5, seed: int = 0, theta0=SRTF_THETA, on_iter=None, **agent_kw):
    """Cross-entropy method over the ordering agent's theta: sample a population around the mean, run each
    on the training traces, refit mean and std to the `elite` lowest average JCTs. Returns
    (best theta seen, its average JCT in slots, history of (iteration, best, mean of elites))."""
    rng = np.random.default_rng(seed)
    mean = np.asarray(theta0, float).copy()
    std = np.full_like(mean, sigma)
    best = (np.inf, mean.copy())
    hist = []

    def score(theta):
        return float(np.mean([run(t, DualAgent(theta, **agent_kw), cfg, seed=k).avg_jct_slots
                              for k, t in enumerate(traces)]))

    for it in range(iters):
        pop = [mean.copy()] + [mean + std * rng.standard_normal(len(mean)) for _ in range(population - 1)]
        scores = np.array([score(th) for th in pop])
        idx = np.argsort(scores)[:elite]
        elites = np.stack([pop[i] for i in idx])
        mean, std = elites.mean(axis=0), elites.std(axis=0) + 0.05
        if scores[idx[0]] < best[0]:
            best = (float(scores[idx[0]]), pop[idx[0]].copy())
        hist.append((it, float(scores[idx[0]]), float(scores[idx].mean())))
        if on_iter:
            on_iter(hist[-1])
    return best[1], best[0], hist
