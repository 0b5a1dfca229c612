"""The DL2 policy in the registry: a trained checkpoint (`dl2ctl train`) decides greedily, or samples and learns
online from the daemon's rewards (dl2d.policy.dl2.online). JAX is imported only when one is built."""
from __future__ import annotations

import logging
from pathlib import Path

from dl2d.policy.registry import PolicyOptions

log = logging.getLogger("dl2d")


def check(options: PolicyOptions) -> list[tuple[str, str]]:
    if not options.checkpoint and not options.allow_untrained:
        return [("checkpoint", "policy dl2 needs a trained checkpoint (dl2ctl train ... --out FILE)")]
    return []


def build(options: PolicyOptions):
    """An OnlineLearner: from the online checkpoint ``resume`` when learning and it exists, else from
    ``checkpoint``, else (``allow_untrained``) with random initial parameters."""
    from dl2d.policy.dl2.online import OnlineLearner

    if options.online_rl and options.resume and Path(options.resume).exists():
        learner = OnlineLearner.from_checkpoint(options.resume, learn=True, seed=options.seed)
        log.info("policy: online checkpoint %s (version %d)", options.resume, learner.version)
    elif options.checkpoint:
        learner = OnlineLearner.from_checkpoint(options.checkpoint, learn=options.online_rl, seed=options.seed)
        log.info("policy: dl2 from %s%s", options.checkpoint, ", learning online" if options.online_rl else "")
    else:
        learner = OnlineLearner.untrained(learn=options.online_rl, seed=options.seed)
        log.warning("policy: dl2 with UNTRAINED parameters (allow_untrained)")
    return learner

