"""Presets of today's world: named sets of the twin's frictions and rules, each of which can also be set alone.

``dl2d`` (the default) is today's world as dl2d models a real cluster (dl2d.sim.worlds): a hidden per-job speed
factor (sigma 0.27), +-10 % slot noise, two multi-node jobs sharing a node 10 % slower, new workers packed on the
fewest nodes (a job re-placed when it restarts anyway or a move buys fewer nodes), a total batch split evenly
over the GPUs, off-table placements by Pollux's fit, work as the measured runs' iterations.

``reference`` is the Pollux artifact's simulator (OSDI'21, its results at job load 1.0 are packaged, credit in
dl2d/workload/data/pollux/README.md), so that dl2d's twin can be compared with it job by job
(bench/bench_reference.py): no interference of any kind, a job keeping its servers while its size is unchanged
and new ones filled from the node with the most free GPUs ("spread"), each GPU's batch capped with gradient
accumulation beyond it and a one-GPU job accumulating over two passes beyond its model's initial batch
(dl2d.workload.batching), off-table placements interpolated between the measurements, work counted as
statistical-efficiency progress (dl2d.workload.efficiency), a job that adapts its batch choosing its own at every
epoch in place (as AdaptDL does), and the artifact's own rules for the two baselines it ran (Tiresias: two queues
at 16 GPU-hours, no starvation guard; Optimus+Oracle: replicas capped at the batch over the smallest local batch).
The cluster (16 x 4 T4), the 60 s slot and the 30 s restart are today's already.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from dl2d.sim.engine import SimConfig
from dl2d.sim.worlds import WORLDS, World
from dl2d.workload.catalog import SpeedRules

#: --accumulate: (the per-GPU cap with accumulation beyond it, a one-GPU job accumulating beyond the initial batch)
ACCUMULATE = {"none": (False, False), "cap": (True, False), "artifact": (True, True)}
BASELINE_RULES = ("dl2d", "reference")
#: "restart": an adaptive job takes a new batch when it restarts (dl2d's job contract); "in-place": it chooses its
#: own, the goodput-optimal one, at every epoch (an AdaptDL job, the artifact's)
BATCH_CHANGES = ("restart", "in-place")


@dataclass(frozen=True)
class Preset:
    """One setting of each friction and rule; None: the world's own (``dl2ctl sim``'s defaults)."""

    name: str
    interference: float | None = None  # sigma of each job's hidden log-normal speed factor
    slot_noise: float | None = None
    shared_node_slowdown: float | None = None
    allreduce_placement: str | None = None
    accumulate: str | None = None  # ACCUMULATE
    off_table: str | None = None  # dl2d.workload.throughput.OFF_TABLE
    work: str | None = None  # dl2d.workload.catalog.WORK_RULES
    baseline_rules: str | None = None  # BASELINE_RULES (dl2d.policy.registry.PolicyOptions.baseline_rules)
    batch_change: str | None = None  # BATCH_CHANGES: when an adaptive job's batch changes


#: what each setting is when neither a preset nor its own option says otherwise (the shared-node slowdown: the
#: world's, dl2d.sim.worlds)
DEFAULTS = Preset("dl2d", interference=0.27, slot_noise=0.1, allreduce_placement="pack", accumulate="none",
                  off_table="fit", work="iterations", baseline_rules="dl2d", batch_change="restart")
PRESETS = {
    "dl2d": Preset("dl2d"),
    "reference": Preset("reference", interference=0.0, slot_noise=0.0, shared_node_slowdown=0.0,
                        allreduce_placement="spread", accumulate="artifact", off_table="interpolate", work="progress",
                        baseline_rules="reference", batch_change="in-place"),
}
SETTINGS = tuple(k for k in asdict(DEFAULTS) if k != "name")


def resolve(preset: str, given: dict, world: World = WORLDS["today"]) -> dict:
    """Every setting (:data:`SETTINGS`): the option's where ``given`` holds it (not None), else the preset's, else
    the default (:data:`DEFAULTS`, the world's shared-node slowdown)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    chosen = PRESETS[preset]
    defaults = replace(DEFAULTS, shared_node_slowdown=world.shared_node_slowdown)
    out = {}
    for key in SETTINGS:
        for source in (given.get(key), getattr(chosen, key), getattr(defaults, key)):
            if source is not None:
                out[key] = source
                break
    return out


def speed_rules(settings: dict) -> SpeedRules:
    """The dl2d.workload.catalog.SpeedRules of resolved settings."""
    accumulate, one_gpu = ACCUMULATE[settings["accumulate"]]
    return SpeedRules(accumulate=accumulate, one_gpu_accumulates=one_gpu, off_table=settings["off_table"],
                      work=settings["work"])


def sim_config(settings: dict, base: SimConfig) -> SimConfig:
    """``base`` with the engine's share of resolved settings (the trace's interference and the baselines' rules
    are not the engine's)."""
    return replace(base, slot_noise=settings["slot_noise"], shared_node_slowdown=settings["shared_node_slowdown"],
                   allreduce_placement=settings["allreduce_placement"], speed_rules=speed_rules(settings),
                   batch_in_place=settings["batch_change"] == "in-place")
