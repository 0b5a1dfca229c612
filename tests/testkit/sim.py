"""Hand-made traces and slot views for the simulator and policy tests."""
from __future__ import annotations

import numpy as np

from dl2d.core.contract import SlotView
from dl2d.sim.cluster import ClusterSpec
from dl2d.sim.trace import Trace
from dl2d.workload.catalog import view_fields
from dl2d.workload.jobtypes import type_index


def make_trace(jobs, *, speed_factor=None) -> Trace:
    """jobs: [(arrival_slot, type name, est_epochs[, true_epochs])] in arrival order."""
    arrival = np.array([j[0] for j in jobs], int)
    types = np.array([type_index(j[1]) for j in jobs], int)
    est = np.array([float(j[2]) for j in jobs])
    true = np.array([float(j[3]) if len(j) > 3 else float(j[2]) for j in jobs])
    factor = np.ones(len(jobs)) if speed_factor is None else np.asarray(speed_factor, float)
    return Trace(arrival, types, est, true, factor)


def make_view(types, *, servers=4, spec: ClusterSpec | None = None, arrival=None, est=None, done=None,
              free=None, max_workers=16, max_ps=16, slot=0) -> SlotView:
    """A slot view of jobs of the given type names on an idle (or `free`-shaped) cluster."""
    n = len(types)
    spec = spec or ClusterSpec(servers)
    cap = spec.empty()
    return SlotView(
        slot=slot, job_ids=np.arange(n), type_idx=np.array([type_index(t) for t in types], int),
        arrival_slot=np.array(arrival if arrival is not None else range(n), int),
        slots_run=np.zeros(n, int),
        epochs_done=np.array(done if done is not None else [0.0] * n, float),
        est_epochs=np.array(est if est is not None else [10.0] * n, float),
        prev_workers=np.zeros(n, int), prev_ps=np.zeros(n, int),
        free=cap.copy() if free is None else np.array(free, float), capacity=cap,
        max_workers=max_workers, max_ps=max_ps, **view_fields([type_index(t) for t in types], max_ps, max_workers),
    )


def server_usage(view: SlotView, alloc) -> np.ndarray:
    """Resources [servers, 3] the allocation's placed tasks take on each server."""
    used = np.zeros_like(view.capacity)
    for j in range(len(view)):
        for s in alloc.worker_servers[j]:
            used[s] += view.worker_demand[j]
        for s in alloc.ps_servers[j]:
            used[s] += view.ps_demand[j]
    return used


def run_slots(trace: Trace, policy, n: int, config, state=None, seed: int = 0):
    """Run ``policy`` for ``n`` slots of the simulator from the trace's first arrival (or ``state``); returns the
    last state and every slot's (view, allocation)."""
    from dataclasses import replace

    from dl2d.sim import engine as E

    state = state or replace(E.SimState.initial(len(trace)), slot=int(trace.arrival_slot.min()))
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(n):
        view = E.view_of(trace, state, config)
        alloc = policy(view)
        steps.append((view, alloc))
        state, _, _ = E.step(trace, state, alloc, config, rng, view=view)
    return state, steps


def bound_case(world: str):
    """(SimConfig, Trace) on which the bound tests run every policy: today's world, 16 generated Philly jobs at
    4x load on t4-16 with 5-minute slots (contended, short); the DL2 world, 30 DL2 jobs on ``small``."""
    from dl2d.sim import engine as E
    from dl2d.sim import trace as T
    from dl2d.sim.cluster import preset

    if world == "today":
        from dl2d.workload import philly

        config = E.SimConfig(cluster=preset("t4-16"), slot_seconds=300.0, max_workers=64, resize_overhead_s=30.0,
                             shared_node_slowdown=0.1)
        return config, T.from_workload(philly.generate(16, load=4.0, seed=7), 300.0, seed=7)
    return E.SimConfig(cluster=preset("small")), T.generate(T.TraceConfig(num_jobs=30), seed=7)

