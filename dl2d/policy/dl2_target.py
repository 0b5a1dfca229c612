"""The target-size policy in the registry (``dl2-target``): a trained checkpoint (`dl2ctl train --policy
dl2-target`, or a pretrained one shipped in dl2d/policy/pretrained/) decides every job's workers and PS,
greedily; tasks are placed on the servers in shortest-remaining-work order (dl2d.policy.target.TargetPolicy).
JAX is imported only when one is built."""
from __future__ import annotations

import logging
from pathlib import Path

from dl2d.policy.registry import PolicyEntry, PolicyOptions, register

log = logging.getLogger("dl2d")

#: The job kinds a checkpoint trained in a world has seen (its meta's ``world``); jobs of other kinds get the
#: teacher's sizes (dl2d.policy.target.TargetPolicy)
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
    import jax

    from dl2d.policy.checkpoint import load_target
    from dl2d.policy.target import TargetConfig, TargetPolicy, init_params

    if options.checkpoint or pretrained(options.world).exists():
        path = options.checkpoint or str(pretrained(options.world))
        ckpt = load_target(path)
        log.info("policy: dl2-target from %s", path)
        kinds = TRAINED_KINDS.get(ckpt.meta.get("world"), ("ps", "allreduce"))
        return TargetPolicy(ckpt.config, ckpt.params, name="dl2-target", kinds=kinds)
    log.warning("policy: dl2-target with UNTRAINED parameters (allow_untrained)")
    cfg = TargetConfig()
    return TargetPolicy(cfg, init_params(cfg, jax.random.PRNGKey(options.seed)), name="dl2-target")


register(PolicyEntry("dl2-target", "DL2 target sizes: a learned (workers, PS) for every job, shortest remaining work "
                     "first; slot-level PPO in the JAX simulator", build, check, learned=True,
                     trained_by="dl2ctl train --policy dl2-target",
                     options=("checkpoint", "seed", "allow_untrained")))
