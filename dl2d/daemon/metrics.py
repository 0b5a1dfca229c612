"""The daemon's Prometheus metrics (prometheus_client, its own registry, text format over HTTP).

The endpoint is served by dl2d's bounded HTTP server (:mod:`dl2d.core.listener`), not prometheus_client's
``start_http_server``, whose thread per connection let 500 slow connections grow the daemon by 200 threads:
here a scrape's whole request and answer share one deadline (:data:`SCRAPE_TIMEOUT_S`), at most
:data:`MAX_SCRAPES` connections are served at once and :data:`MAX_SCRAPES_PER_PEER` from one address (a
refused one is answered 503 by the accepting thread), and a connection that has not sent its request after a
second yields its place to a newer one: a scraper is answered while strangers hold connections, and the
endpoint never holds more than ``2 * MAX_SCRAPES`` threads. The body is prometheus_client's own exposition
(text format, or OpenMetrics when the scraper asks for it).
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from dl2d.core.listener import BoundedHTTPHandler, BoundedHTTPServer, Limits

NODE_STATES = ("idle", "mixed", "allocated", "drained")
SLOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Seconds for a scrape's whole request and answer (Prometheus's own scrape timeout is 10 s by default).
SCRAPE_TIMEOUT_S = 10.0
#: Connections served at once (a Prometheus server or two scrape every 15 s or so).
MAX_SCRAPES = 8
#: Of them, from one address.
MAX_SCRAPES_PER_PEER = 4


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.tick = Histogram("dl2d_slot_tick_seconds", "Time of one slot's work (poll, reconcile, decide, plan, "
                              "apply), without waiting for the slot to end", buckets=SLOT_BUCKETS, registry=r)
        self.decide = Histogram("dl2d_decision_seconds", "Policy decision time per slot", buckets=SLOT_BUCKETS,
                                registry=r)
        self.decisions = Counter("dl2d_decisions", "Slot decisions by source", ["source"], registry=r)
        self.fallbacks = Counter("dl2d_fallbacks", "Guardrail fallbacks to the heuristic", registry=r)
        self.resizes = Counter("dl2d_resizes", "Backend actions carried out, by method", ["method"], registry=r)
        self.intent_failures = Counter("dl2d_intent_failures", "Intents the backend could not carry out", registry=r)
        self.backend_errors = Counter("dl2d_backend_errors", "Slots skipped because the backend was unavailable",
                                      registry=r)
        self.replayed = Counter("dl2d_intents_replayed", "Journal intents replayed at start", registry=r)
        self.jobs = Gauge("dl2d_jobs", "Jobs by state", ["state"], registry=r)
        self.slot = Gauge("dl2d_slot", "Number of the last slot", registry=r)
        self.reward = Gauge("dl2d_slot_reward", "Reward of the last slot (DL2 eq. 1)", registry=r)
        self.stale_nodes = Gauge("dl2d_stale_nodes", "Nodes whose agent is silent (stale; dl2d does not drain "
                                 "them for it: Slurm's own node state decides)", registry=r)
        self.policy_version = Gauge("dl2d_policy_version", "Online-RL updates applied to the policy", registry=r)
        self.policy_reverts = Counter("dl2d_policy_reverts", "Online policy put back to its last good parameters",
                                      registry=r)
        self.heartbeat = Gauge("dl2d_last_slot_timestamp_seconds", "Wall time the last slot finished", registry=r)
        self.capacity = Gauge("dl2d_cluster_capacity", "What the usable (not drained) nodes hold for dl2d, by "
                              "resource (gpus, cpus, mem_gb; less the GPUs Slurm jobs not dl2d's hold)", ["resource"],
                              registry=r)
        self.allocated = Gauge("dl2d_cluster_allocated", "What the last slot's allocation uses, by resource "
                               "(gpus, cpus, mem_gb)", ["resource"], registry=r)
        self.nodes = Gauge("dl2d_nodes", "Nodes by state (idle, mixed, allocated, drained), as dl2ctl nodes lists "
                           "them", ["state"], registry=r)
        self.job_workers = Gauge("dl2d_job_workers", "Workers of each active job after the last slot's decision",
                                 ["job", "name"], registry=r)
        self.job_ps = Gauge("dl2d_job_ps", "Parameter servers of each active job after the last slot's decision",
                            ["job", "name"], registry=r)
        self._job_labels: set[tuple[str, str]] = set()
        self.server = None

    def set_cluster(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """Capacity, allocation and node states from the node report (dl2d.daemon.plan.node_report)."""
        cap = {"gpus": 0.0, "cpus": 0.0, "mem_gb": 0.0}
        used = dict.fromkeys(cap, 0.0)
        states = dict.fromkeys(NODE_STATES, 0)
        for n in nodes:
            states[n["state"]] = states.get(n["state"], 0) + 1
            for k in cap:
                used[k] += float(n[f"{k}_alloc"])
                if n["state"] != "drained":
                    cap[k] += float(n[k]) - (float(n.get("gpus_other", 0)) if k == "gpus" else 0.0)
        for k in cap:
            self.capacity.labels(k).set(cap[k])
            self.allocated.labels(k).set(used[k])
        for state, count in states.items():
            self.nodes.labels(state).set(count)

    def set_jobs(self, sizes: Mapping[int, tuple[int, int]], names: Mapping[int, str]) -> None:
        """Each active job's workers and PS; the series of jobs no longer active are removed (one series per job
        while it lives, not forever)."""
        current = {(str(j), names.get(j, "")) for j in sizes}
        for labels in self._job_labels - current:
            self.job_workers.remove(*labels)
            self.job_ps.remove(*labels)
        for j, (w, p) in sizes.items():
            labels = (str(j), names.get(j, ""))
            self.job_workers.labels(*labels).set(w)
            self.job_ps.labels(*labels).set(p)
        self._job_labels = current

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint (/metrics) in a thread; returns the bound port (OSError if it cannot bind)."""
        server = make_metrics_server(self.registry, addr, port)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="dl2d-metrics",
                         daemon=True).start()
        self.server = server
        return server.server_address[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def make_metrics_server(registry: CollectorRegistry, addr: str, port: int,
                        timeout: float | None = None) -> BoundedHTTPServer:
    """The bounded HTTP server (not yet serving) of ``registry``: ``GET /metrics`` (and ``/``) answers the
    exposition the scraper's ``Accept`` header asks for; anything else is 404. ``timeout``: the whole-request
    deadline, :data:`SCRAPE_TIMEOUT_S` by default."""

    class Handler(BoundedHTTPHandler):
        server_version = "dl2d-metrics"

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.split("?", 1)[0] not in ("/", "/metrics"):
                self._send(404, b"not found\n", "text/plain; charset=utf-8")
                return
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(registry), content_type)

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Server(BoundedHTTPServer):
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    limits = Limits(total=MAX_SCRAPES, per_peer=MAX_SCRAPES_PER_PEER)
    return Server((addr, port), Handler, limits=limits,
                  deadline_s=SCRAPE_TIMEOUT_S if timeout is None else timeout)
