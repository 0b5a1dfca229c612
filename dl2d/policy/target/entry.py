"""The target-size policy in the registry (``dl2-target``): a trained checkpoint (`dl2ctl train --policy
dl2-target`, or a pretrained one shipped in dl2d/policy/target/pretrained/) decides every job's workers and PS,
greedily; tasks are placed on the servers in shortest-remaining-work order (dl2d.policy.target.view.TargetPolicy).
JAX is imported only when one is built."""
from __future__ import annotations

import logging
from pathlib import Path

from dl2d.policy.registry import PolicyOptions

log = logging.getLogger("dl2d")

#: The job kinds a checkpoint trained in a world has seen (its meta's ``world``); jobs of other kinds get the
#: teacher's sizes (dl2d.policy.target.view.TargetPolicy)
TRAINED_KINDS = {"today": ("allreduce",), "dl2": ("ps",)}
#: The pretrained checkpoints inside the package (docs/BENCHMARKS.md says how each was made and how it scores).
PRETRAINED_DIR = Path(__file__).with_name("pretrained")


def pretrained(world: str) -> Path:
    """The shipped checkpoint of ``world`` (it may not exist: then no policy of that world ships)."""
    return PRETRAINED_DIR / f"target-{world}.msgpack"


def check(options: PolicyOptions) -> list[tuple[str, str]]:
    if not options.checkpoint and not options.allow_untrained and not pretrained(options.world).exists():
        return [("checkpoint", f"policy dl2-target ships no pretrained policy for the {options.world} world: give a "
                 "trained checkpoint (dl2ctl train --policy dl2-target --out FILE)")]
    return []


def build(options: PolicyOptions):
    """The shipped or given checkpoint, greedy; with ``online_rl`` an OnlineTargetLearner (from the online
    checkpoint ``resume`` when it exists), measured against the fallback heuristic ``options.fallback``."""
    from dl2d.policy.checkpoint import load_target
    from dl2d.policy.target.view import TargetPolicy

    path = options.checkpoint or (str(pretrained(options.world)) if pretrained(options.world).exists() else "")
    if options.online_rl:
        return _learner(options, path)
    if path:
        ckpt = load_target(path)
        log.info("policy: dl2-target from %s", path)
        return TargetPolicy(ckpt.config, ckpt.params, name="dl2-target", kinds=trained_kinds(ckpt.meta),
                            whole_nodes=options.whole_nodes)
    log.warning("policy: dl2-target with UNTRAINED parameters (allow_untrained)")
    return TargetPolicy(*_untrained(options), name="dl2-target", whole_nodes=options.whole_nodes)


def _untrained(options: PolicyOptions):
    """(config, random parameters) of a policy without a checkpoint (``allow_untrained``)."""
    import jax

    from dl2d.policy.target.policy import TargetConfig, init_params

    cfg = TargetConfig()
    return cfg, init_params(cfg, jax.random.PRNGKey(options.seed))


def trained_kinds(meta: dict) -> tuple[str, ...]:
    """The job kinds a checkpoint learned to size (from its meta's world; both when it does not say)."""
    return TRAINED_KINDS.get(meta.get("world"), ("ps", "allreduce"))


def _learner(options: PolicyOptions, path: str):
    from dl2d.policy import registry
    from dl2d.policy.target.online import OnlineTargetLearner

    fallback = registry.build(options.fallback)
    common = {"fallback": fallback, "window": options.online_window, "margin": options.revert_margin,
              "temperature": options.online_temperature, "explore": options.online_explore, "seed": options.seed,
              "whole_nodes": options.whole_nodes}
    if options.resume and Path(options.resume).exists():
        path = options.resume
        log.info("policy: dl2-target learning online, from its online checkpoint %s", path)
    elif path:
        log.info("policy: dl2-target from %s, learning online", path)
    if path:
        return OnlineTargetLearner.from_checkpoint(path, **common)
    log.warning("policy: dl2-target with UNTRAINED parameters (allow_untrained), learning online")
    return OnlineTargetLearner(*_untrained(options), **common)

