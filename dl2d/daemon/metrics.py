"""The daemon's Prometheus metrics (prometheus_client, its own registry, text format over HTTP)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

NODE_STATES = ("idle", "mixed", "allocated", "drained")
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
        self.policy_reverts = Counter("dl2d_policy_reverts", "Online policy put back to its last good parameters",
                                      registry=r)
        self.heartbeat = Gauge("dl2d_last_slot_timestamp_seconds", "Wall time the last slot finished", registry=r)
        self.capacity = Gauge("dl2d_cluster_capacity", "What the usable (not drained) nodes hold, by resource "
                              "(gpus, cpus, mem_gb)", ["resource"], registry=r)
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
                    cap[k] += float(n[k])
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
        """Start the HTTP endpoint (/metrics) in a thread; returns the bound port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self.server = server
        return server.server_address[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
