"""The daemon's Prometheus metrics (prometheus_client, its own registry, text format over HTTP)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

SLOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


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
        self.stale_nodes = Gauge("dl2d_stale_nodes", "Nodes whose agent is silent (drained)", registry=r)
        self.policy_version = Gauge("dl2d_policy_version", "Online-RL updates applied to the policy", registry=r)
        self.heartbeat = Gauge("dl2d_last_slot_timestamp_seconds", "Wall time the last slot finished", registry=r)
        self.server = None

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint (/metrics) in a thread; returns the bound port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self.server = server
        return server.server_address[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
