"""The daemon's side of the node agents, one poll round at a time: the samples go to the database; a node whose
agent went silent is marked stale (an event, a warning, the ``dl2d_stale_nodes`` metric, ``stale`` in
``dl2ctl nodes`` and the status file) and one whose agent answers again is marked recovered.

A silent agent never drains its node. The agent's port is reachable from the cluster network, so silence is
something anyone there can cause (a flood of connections, a firewall rule, the agent crashing), while the node
may run its jobs perfectly well; whether it can take work is Slurm's own node state (slurmd's health, an
admin's drain), which the backend reports and the policy's view follows."""
from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Callable

from dl2d.agents.sample import sample_to_row
from dl2d.db import events as db_events
from dl2d.db import samples as db_samples
from dl2d.db.engine import session_scope
from dl2d.db.models import EventKind, utcnow

log = logging.getLogger("dl2d")


def poll_round(poller, engine, backend, metrics, clock: Callable[[], datetime],
               retention: bool = False) -> tuple[int, list[dict[str, Any]]]:
    """Poll every agent once: (samples stored, the samples), recording nodes whose agent went stale or
    recovered. ``backend`` is not touched: a silent agent changes nothing of its node (module doc)."""

    def on_stale(node: str, reason: str) -> None:
        with session_scope(engine) as s:
            db_events.record_event(s, EventKind.NODE_STALE, None, {"node": node, "reason": reason}, ts=clock())
        log.warning("agent of node %s is stale: %s; the node is left as Slurm has it", node, reason)

    def on_recover(node: str) -> None:
        with session_scope(engine) as s:
            db_events.record_event(s, EventKind.NODE_RECOVERED, None, {"node": node}, ts=clock())
        log.info("agent of node %s answers again", node)

    poller.on_stale, poller.on_recover = on_stale, on_recover
    rnd = poller.poll_round()
    samples = list(rnd.samples.values())
    with session_scope(engine) as s:
        n = db_samples.insert_node_samples(s, [sample_to_row(x) for x in samples])
        if retention:
            db_samples.apply_retention(s, utcnow())
    metrics.stale_nodes.set(len(poller.stale_nodes))
    for node, err in rnd.errors.items():
        log.debug("agent %s: %s", node, err)
    return n, samples
