"""A lower bound on the average JCT any scheduler can reach on a trace, so every figure can be read against
what is possible. Pure functions of the trace and the simulator's settings; it reads the hidden truth (true
epochs, interference factors) that no scheduler sees.

Two bounds, each valid for every scheduler; the result is the larger:

* **No contention**: a job cannot finish before its arrival plus the time it needs at its fastest size and
  placement, trained at the slot noise's upper end (1 + noise) from its very first second, plus the restart
  it pays when it starts (``resize_overhead_s``). All-reduce jobs: the fastest over every worker count and
  every placement the cluster holds (whole workers on a node, no more nodes than its servers); PS jobs: the
  fastest (PS, workers) of the true table.
* **Capacity** (the cluster as one machine): a job needs at least its GPU work, the fewest GPU-seconds any
  size trains it in (at that same best speed), and the cluster does at most its GPU count of GPU-seconds per
  second. Shortest-remaining-processing-time on one machine of that speed, with the jobs' arrivals, minimises
  the sum of completion times among all schedules that respect only those two facts, so its average is a
  bound too. (Jobs without GPUs, DL2's CPU-only types, have no GPU work and only the first bound.)

A job whose batch the scheduler chooses (the trace's ``adaptive``) is bounded at its best batch as well, at every
moment (:func:`adaptive_allreduce`). Neither bound knows placement contention or the shared-server slowdown, so
the gap to a real policy is what those and the cluster's shape cost, plus the schedule's own inefficiency (and
what the contention the time-indexed program of dl2d.sim.lp_bound counts adds).
"""
from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass

import numpy as np

from dl2d.sim.engine import SimConfig
from dl2d.sim.trace import Trace
from dl2d.workload import catalog, throughput
from dl2d.workload.jobtypes import BATCHES_PER_EPOCH, WORKER_DEMAND
from dl2d.workload.speed import lookup, speed_table


@dataclass(frozen=True)
class Bound:
    avg_jct_slots: float  # the larger of the two
    no_contention_slots: float
    capacity_slots: float
    min_seconds: np.ndarray  # [N] each job's fastest time (before the restart)
    gpu_seconds: np.ndarray  # [N] each job's least GPU work


def placements(workers: int, gpus_per_worker: int, per_node: int, nodes: int = 0):
    """The packed placement of ``workers`` and its even spreads over more nodes, whole workers on each node (a
    worker's GPUs are on one server) and at most ``nodes`` nodes (the cluster's servers; 0: no limit)."""
    g = max(int(gpus_per_worker), 1)
    per_node_workers = max(int(per_node) // g, 1)
    fewest = -(-workers // per_node_workers)
    packed = throughput.canonical(x * g for x in catalog.packed(workers, per_node_workers))
    yield packed
    for spread in range(fewest, (workers if nodes <= 0 else min(workers, nodes)) + 1):
        even = throughput.canonical(x * g for x in throughput.even_spread(workers, spread))
        if even != packed:
            yield even


def holdable(placement, gpus_per_worker: int, per_node: int, nodes: int = 0) -> bool:
    """Whether a cluster of ``nodes`` nodes (0: any number) of ``per_node`` GPUs can hold ``placement`` (GPUs per
    node) with whole workers of ``gpus_per_worker`` GPUs on each node."""
    g = max(int(gpus_per_worker), 1)
    return (all(x % g == 0 and x <= per_node for x in placement) and (nodes <= 0 or len(placement) <= nodes))


def _node_splits(workers: int, most: int, parts: int):
    """Every way to split ``workers`` over at most ``parts`` nodes of at most ``most`` workers each, largest first."""
    if workers == 0:
        yield ()
        return
    if parts == 0:
        return
    for first in range(min(most, workers), 0, -1):
        for rest in _node_splits(workers - first, first, parts - 1):
            yield (first,) + rest


def fastest_placement_rate(model: str, batch: float, workers: int, gpus_per_worker: int, per_node: int,
                           nodes: int = 0, rules: catalog.SpeedRules = catalog.DEFAULT_RULES) -> float:
    """Epochs per second of ``workers`` workers at the fastest placement a cluster of ``nodes`` nodes holds, by
    the measured lookup (dl2d.workload.throughput). A placement's speed is its measurement where it was measured
    and the fit's otherwise, and the fit reads only the GPU count and whether the job spans nodes; so the
    fastest is among the packed placement, the even spreads (:func:`placements`), the measured placements of
    that many GPUs and any one unmeasured placement over several nodes (under ``rules`` that interpolate
    off-table placements, which read the node count as well: one for each node count). Enumerating every placement
    instead (thousands at 64 GPUs) gives the same figure (a test compares them)."""
    return max(catalog.allreduce_epoch_rate(model, batch, p, rules)
               for p in candidate_placements(model, workers, gpus_per_worker, per_node, nodes, rules))


@functools.lru_cache(maxsize=4096)
def candidate_placements(model: str, workers: int, gpus_per_worker: int, per_node: int, nodes: int = 0,
                         rules: catalog.SpeedRules = catalog.DEFAULT_RULES) -> tuple[throughput.Placement, ...]:
    """The placements of ``workers`` among which the fastest is (:func:`fastest_placement_rate`)."""
    g = max(int(gpus_per_worker), 1)
    gpus = workers * g
    measured = throughput.throughput_model(model).measured(gpus)
    candidates = set(placements(workers, g, per_node, nodes))
    candidates.update(p for p in measured if holdable(p, g, per_node, nodes))
    known = set(measured)
    most = max(int(per_node) // g, 1)
    spans: set[int] = set()  # node counts of the unmeasured placements taken
    for split in _node_splits(workers, most, workers if nodes <= 0 else int(nodes)):
        p = throughput.canonical(x * g for x in split)
        if len(p) > 1 and p not in known and len(p) not in spans:  # the off-table figure of a job over nodes
            candidates.add(p)
            spans.add(len(p))
            if rules.off_table == "fit":  # the fit reads only whether it spans nodes
                break
    return tuple(sorted(candidates))


def allreduce_rates(model: str, batch: float, max_workers: int, gpus_per_worker: int, per_node: int,
                    site=None, nodes: int = 0, rules: catalog.SpeedRules = catalog.DEFAULT_RULES) -> np.ndarray:
    """[max_workers] epochs per second on 1..max_workers workers, each at its fastest placement on at most
    ``nodes`` nodes (:func:`fastest_placement_rate`), before interference (``site``: a site's calibrated curves,
    which replace the measured lookup for the models they hold)."""
    rates = []
    for w in range(1, max_workers + 1):
        own = site.epochs_per_s(model, w * gpus_per_worker) if site is not None else None
        rates.append(own if own is not None else fastest_placement_rate(model, batch, w, gpus_per_worker, per_node,
                                                                        nodes, rules))
    return np.array(rates, float)


def best_allreduce(model: str, batch: float, max_workers: int, gpus_per_worker: int, per_node: int, site=None,
                   nodes: int = 0, rules: catalog.SpeedRules = catalog.DEFAULT_RULES):
    """(highest epochs per second, fewest GPU-seconds per epoch) over sizes and placements, before interference
    (:func:`allreduce_rates`)."""
    rates = allreduce_rates(model, batch, max_workers, gpus_per_worker, per_node, site, nodes, rules)
    gpus = np.arange(1, max_workers + 1) * gpus_per_worker
    with np.errstate(divide="ignore"):
        return float(rates.max()), float(np.min(gpus / rates))


def adaptive_allreduce(model: str, own_batch: float, epochs: float, max_workers: int, gpus_per_worker: int,
                       per_node: int, nodes: int = 0, rules: catalog.SpeedRules = catalog.DEFAULT_RULES
                       ) -> tuple[float, float]:
    """(fewest seconds, fewest GPU-seconds) in which a job of ``model`` whose batch the scheduler chooses trains
    ``epochs`` epochs: at its best size, placement and batch at every moment, paying nothing to change them, the
    batches those a scheduler tries at each size (dl2d.workload.goodput.candidates, Pollux's 50, and the job's
    own). Under the iterations rule at the best constant rate; under the progress rule epoch by epoch, each at its
    own best (the gradients get noisier: a later epoch's best batch is larger)."""
    key = (model, int(max_workers), max(int(gpus_per_worker), 1), int(per_node), int(nodes), rules)
    tried, own = _best_over(*key, None), _best_over(*key, float(own_batch))
    best_rate, best_gpu = np.maximum(tried[0], own[0]), np.minimum(tried[1], own[1])
    if rules.work != "progress":
        return float(epochs / best_rate[0]), float(epochs * best_gpu[0])
    work = epoch_progress(model, epochs)
    return float(np.sum(work / best_rate)), float(np.sum(work * best_gpu))


def epoch_progress(model: str, epochs: float) -> np.ndarray:
    """[E] the progress a job of ``model`` ``epochs`` long makes in each of its model's epochs (the progress rule:
    each epoch's width, the last one the job trains in part)."""
    from dl2d.workload import efficiency  # noqa: PLC0415

    widths = np.diff(efficiency.runs(model).epoch_starts)
    return np.clip(float(epochs) - np.arange(len(widths)), 0.0, 1.0) * widths


@functools.lru_cache(maxsize=1024)
def _best_over(model: str, max_workers: int, g: int, per_node: int, nodes: int, rules: catalog.SpeedRules,
               batch: float | None) -> tuple[np.ndarray, np.ndarray]:
    """([E] the highest rate, [E] the fewest GPU-seconds per unit) over sizes, placements and ``batch`` (None: the
    goodput candidates of each size): epochs under the iterations rule (E = 1), progress per epoch under the
    progress one."""
    rates = adaptive_rates(model, max_workers, g, per_node, nodes, rules, batch)
    gpus = (np.arange(1, max_workers + 1) * g)[:, None]
    with np.errstate(divide="ignore"):
        return rates.max(axis=0), np.min(np.where(rates > 0, gpus / rates, np.inf), axis=0)


@functools.lru_cache(maxsize=1024)
def adaptive_rates(model: str, max_workers: int, g: int, per_node: int, nodes: int, rules: catalog.SpeedRules,
                   batch: float | None = None) -> np.ndarray:
    """[max_workers, E] the highest rate of a job of ``model`` on 1..max_workers workers of ``g`` GPUs, over the
    placements the cluster holds and ``batch`` (None: the goodput candidates of each size): epochs a second under
    the iterations rule (E = 1), progress a second in each of its model's epochs under the progress one (0: a size
    the cluster does not hold). Read-only."""
    from dl2d.workload import efficiency, goodput  # noqa: PLC0415

    progress = rules.work == "progress"
    r = efficiency.runs(model) if progress else None
    out = np.zeros((max_workers, r.epochs if progress else 1))
    for w in range(1, max_workers + 1):
        where = candidate_placements(model, w, g, per_node, nodes, rules)
        if not where:  # more workers than the cluster holds
            continue
        for b in (goodput.candidates(model, w * g) if batch is None else (batch,)):
            if progress:
                step, trained = min(catalog.iteration_seconds(model, float(b), p, rules) for p in where)
                stats = efficiency.grad_stats_by_epoch(r, trained)
                rate = efficiency.gain_of(stats, trained, r.init) / step  # progress a second
            else:
                rate = np.array([max(catalog.allreduce_epoch_rate(model, float(b), p, rules) for p in where)])
            out[w - 1] = np.maximum(out[w - 1], rate)
    out.setflags(write=False)
    return out


def ps_rates(type_idx: int, table: np.ndarray, max_ps: int, max_workers: int) -> np.ndarray:
    """[max_ps + 1, max_workers + 1] epochs per second at (PS, workers) of the speed table (counts clamped to it)."""
    p, w = np.meshgrid(np.arange(max_ps + 1), np.arange(max_workers + 1), indexing="ij")
    return lookup(table, type_idx, p, w) / BATCHES_PER_EPOCH[type_idx]


def best_ps(type_idx: int, table: np.ndarray, max_ps: int, max_workers: int):
    speed = ps_rates(type_idx, table, max_ps, max_workers)
    rate = float(speed.max())
    gpus = np.arange(max_workers + 1)[None, :] * WORKER_DEMAND[type_idx, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        work = np.where(speed > 0, gpus / speed, np.inf)
    return rate, float(work.min())


def srpt_completions(release: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Completion times of preemptive shortest-remaining-processing-time on one machine of speed 1."""
    order = np.argsort(release, kind="stable")
    done = np.empty(len(release))
    heap: list[tuple[float, int]] = []
    t, k = 0.0, 0
    while k < len(order) or heap:
        if not heap:
            t = max(t, release[order[k]])
        while k < len(order) and release[order[k]] <= t:
            heapq.heappush(heap, (float(size[order[k]]), int(order[k])))
            k += 1
        left, j = heapq.heappop(heap)
        until = release[order[k]] if k < len(order) else np.inf
        if t + left <= until:
            t += left
            done[j] = t
        else:
            heapq.heappush(heap, (left - (until - t), j))
            t = until
    return done


def batch_adapting(trace: Trace, cfg: SimConfig) -> np.ndarray:
    """Indices of the jobs bounded at their best batch: adaptive all-reduce jobs of a measured model (a site's own
    curve, which replaces the measured one, has no batch to choose)."""
    names = trace.speed_names()
    site = cfg.site_speeds.names() if cfg.site_speeds is not None else ()
    return np.array([i for i in np.flatnonzero(trace.adaptive & trace.allreduce)
                     if names[i] in catalog.ALLREDUCE_MODELS and names[i] not in site], int)


def lower_bound(trace: Trace, cfg: SimConfig) -> Bound:
    """The bound of the module docstring for ``trace`` under ``cfg``."""
    trace.check_site(cfg.site_speeds)
    n = len(trace)
    table = speed_table(cfg.speed_model)
    per_node = max(int(cfg.cluster.gpus), 1)
    rate, work = np.zeros(n), np.zeros(n)
    cache: dict = {}
    names = trace.speed_names()
    for i in range(n):
        t = int(trace.type_idx[i])
        if trace.allreduce[i]:
            g = max(int(round(catalog.WORKER_DEMAND[t, 0])), 1)
            key = (names[i], float(trace.batch_size[i]))
            if key not in cache:
                cache[key] = best_allreduce(names[i], key[1], cfg.max_workers, g, per_node, cfg.site_speeds,
                                             cfg.cluster.num_servers, cfg.speed_rules)
            rate[i], work[i] = cache[key]
        else:
            rate[i], work[i] = best_ps(t, table, cfg.max_ps, cfg.max_workers)
    fastest = trace.speed_factor * (1 + cfg.slot_noise)
    min_seconds = trace.true_epochs / (rate * fastest)
    gpu_seconds = np.where(np.isfinite(work), trace.true_epochs * work / fastest, 0.0)
    for i in batch_adapting(trace, cfg):  # the scheduler chooses its batch too
        g = max(int(round(catalog.WORKER_DEMAND[int(trace.type_idx[i]), 0])), 1)
        secs, gpu_s = adaptive_allreduce(names[i], float(trace.batch_size[i]), float(trace.true_epochs[i]),
                                         cfg.max_workers, g, per_node, cfg.cluster.num_servers, cfg.speed_rules)
        min_seconds[i], gpu_seconds[i] = secs / fastest[i], gpu_s / fastest[i]
    release = trace.arrival_slot * cfg.slot_seconds  # the slot boundary a job is first seen at
    waited = trace.arrival_slot - trace.submitted  # slots from its submission to that boundary, in its JCT
    alone = (min_seconds + cfg.resize_overhead_s) / cfg.slot_seconds + waited
    gpus = float(cfg.cluster.capacity[0])
    packed_end = srpt_completions(release, gpu_seconds / gpus) if gpus > 0 else release
    capacity = (packed_end - release) / cfg.slot_seconds + waited
    no_contention, cap = float(alone.mean()), float(capacity.mean())
    return Bound(max(no_contention, cap), no_contention, cap, min_seconds, gpu_seconds)
