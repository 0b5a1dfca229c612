"""Shared constants and helpers of the DL2 policy tests: a small policy config, its simulator setting, tiny
traces."""
from __future__ import annotations

import numpy as np

from dl2d.policy.dl2.config import PolicyConfig
from dl2d.sim.cluster import preset
from dl2d.sim.engine import SimConfig
from dl2d.sim.trace import TraceConfig, generate

MAX_W = MAX_P = 4
CFG = PolicyConfig(max_jobs=8, hidden=32, max_workers=MAX_W, max_ps=MAX_P, sl_batch=128, minibatch=32,
                   replay_size=1024)
SIM = SimConfig(cluster=preset("tiny"), max_workers=MAX_W, max_ps=MAX_P)


def tiny_trace(num_jobs: int = 8, seed: int = 1, max_epochs: float | None = None):
    """A short trace of `num_jobs` arriving together-ish; `max_epochs` caps the job lengths (fast episodes)."""
    tr = generate(TraceConfig(num_jobs=num_jobs, max_arrivals_per_slot=4, arrival_pattern="uniform"), seed=seed)
    if max_epochs is not None:
        from dataclasses import replace
        est = np.minimum(tr.est_epochs, max_epochs)
        tr = replace(tr, est_epochs=est, true_epochs=np.minimum(tr.true_epochs, max_epochs))
    return tr


def build_any(name: str):
    """Any registered policy; a learned one with random parameters (for tests where what it decides does not
    matter, only that it keeps the contract)."""
    from dl2d.policy import registry
    if name in ("chic", "chic-pair"):
        from dl2d.policy.seeds import chic as CH
        cfg = CH.ChicConfig(pair=name == "chic-pair")
        return CH.ChicScheduler(cfg, CH.init_params(cfg, 0))
    return registry.build(name, registry.PolicyOptions(allow_untrained=True, world=world_for(name)))


def world_for(name: str) -> str:
    """The world a registered policy is built in by the tests: the DL2 paper's for the planning room's policies
    (the only ones with a ``world`` option: they refuse any other), today's for the rest."""
    from dl2d.policy import registry
    return "dl2" if "world" in registry.get(name).options else "today"
