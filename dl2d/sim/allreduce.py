"""How fast placed all-reduce jobs train, and what moving them costs: pure functions of a slot's placement.

A job's speed is the measured lookup for the GPUs it holds on each server (dl2d.workload.catalog, packed and
spread placements both measured), times what only the cluster knows: its persistent interference factor,
the slot's noise and, for a job spread over several servers, ``shared_node_slowdown`` when one of its
servers also holds another multi-server job (the two share the server's network link for their gradient
synchronisation). These are what make a scheduler's speed model wrong on a real cluster.

A site's speed model (``dl2ctl calibrate``'s file, ``dl2ctl sim --speed-model FILE``) replaces the measured lookup
for the models it holds.

An all-reduce job whose worker count or servers change restarts from its checkpoint (the elastic
launchers of PyTorch and JAX restart every rank on a membership change), so it loses the restart time.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from dl2d.workload import catalog, efficiency, throughput


#: GPUs per server of a job whose workers are on the given servers (one entry per worker); None without workers
gpu_placement = throughput.placement_on


def multi_server(servers: Sequence[int]) -> bool:
    return len(set(int(s) for s in servers)) > 1


def shares_a_server(worker_servers: Sequence[Sequence[int]]) -> np.ndarray:
    """[jobs] True for a multi-server job one of whose servers holds another multi-server job."""
    spread = [multi_server(s) for s in worker_servers]
    count: Counter = Counter()
    for j, servers in enumerate(worker_servers):
        if spread[j]:
            count.update(set(int(s) for s in servers))
    return np.array([spread[j] and any(count[int(s)] > 1 for s in set(worker_servers[j]))
                     for j in range(len(worker_servers))], bool)


def epoch_rates(models, batch_size, worker_servers, gpus_per_worker, site=None, per_node: int | None = None,
                rules: catalog.SpeedRules = catalog.DEFAULT_RULES) -> np.ndarray:
    """[jobs] epochs per second of each all-reduce job on its placement, before interference and noise.
    ``models``: each job's model or class name (dl2d.sim.trace.Trace.speed_names). ``site`` (a
    dl2d.workload.speedfit.SiteSpeeds): a site's calibrated curves, which replace the measured lookup for the
    classes it holds (by GPU count), slowed by a class's spread slowdown where its job spans more nodes than
    the fewest of ``per_node`` GPUs that hold it; a class the catalog does not hold has no other speed.
    ``rules``: how the measured lookup turns a placement and batch into a speed (dl2d.workload.catalog.SpeedRules)."""
    out = np.zeros(len(worker_servers))
    for j, servers in enumerate(worker_servers):
        placement = gpu_placement(servers, gpus_per_worker[j])
        if placement is None:
            continue
        model = str(models[j])
        rate = site.epochs_per_s(model, sum(placement)) if site is not None else None
        if rate is not None and per_node and len(placement) > len(catalog.packed(sum(placement), per_node)):
            rate /= 1.0 + site.spread_slowdown(model)
        out[j] = rate if rate is not None else catalog.allreduce_epoch_rate(model, float(batch_size[j]), placement,
                                                                            rules)
    return out


def progress_rates(models, batch_size, worker_servers, gpus_per_worker, epochs_done, seconds, rules, site=None,
                   in_place=None) -> tuple[np.ndarray, np.ndarray]:
    """([jobs] epochs each job trains in its ``seconds`` (already slowed by its interference) under the progress
    rule, [jobs] the batch it trains at by the slot's end). NaN epochs for a job without workers or with a site's
    own curve (its epochs are the curve's). ``in_place`` [jobs] True: the job chooses its own batch at every
    epoch, the goodput-optimal one for its GPUs, without a restart (as an AdaptDL job does)."""
    from dl2d.workload import goodput  # noqa: PLC0415

    out = np.full(len(worker_servers), np.nan)
    batch_out = np.asarray(batch_size, float).copy()
    for j, servers in enumerate(worker_servers):
        placement = gpu_placement(servers, gpus_per_worker[j])
        model = str(models[j])
        if placement is None or (site is not None and model in site.names()) or model not in catalog.ALLREDUCE_MODELS:
            continue
        choose = None
        if in_place is not None and in_place[j]:
            def choose(epoch, model=model, placement=placement):
                best, _ = goodput.best_batch(model, placement, epoch, None, None, rules.off_table,
                                             rules.one_gpu_accumulates)
                return best, catalog.iteration_seconds(model, best, placement, rules)
        step, trained = catalog.iteration_seconds(model, float(batch_size[j]), placement, rules)
        if choose is None:
            out[j] = progress_epochs(model, trained, step, float(epochs_done[j]), float(seconds[j]))
            continue
        out[j], chosen = progress_epochs(model, trained, step, float(epochs_done[j]), float(seconds[j]), choose)
        if chosen is not None and chosen > 0:
            batch_out[j] = chosen
    return out, batch_out


def progress_epochs(model: str, trained_batch: float, iteration_s: float, epochs_done: float, seconds: float,
                    choose=None):
    """Epochs a job of ``model`` training at total batch ``trained_batch``, ``iteration_s`` seconds an iteration,
    trains in ``seconds`` from ``epochs_done``, under the progress rule (dl2d.workload.efficiency): epoch by epoch,
    each at its own gain, as the Pollux artifact's simulator steps a job. Where it finishes within ``seconds`` the
    epochs it would train at the same pace over all of them (the engine reads the finish moment from that).
    ``choose(epoch) -> (batch, (seconds an iteration, batch trained))``: the job's own batch for each epoch it
    enters (and the one it is in); then (epochs, the last batch chosen), else just the epochs."""
    r = efficiency.runs(model)
    starts, last = r.epoch_starts, r.epochs
    k = min(int(epochs_done), last)
    p = starts[k] + (epochs_done - k) * (starts[k + 1] - starts[k]) if k < last else starts[last]
    left = seconds
    chosen = None
    while left > 0 and k < last:
        if choose is not None:
            chosen, (iteration_s, trained_batch) = choose(k)
        rate = efficiency.gain(r, trained_batch, k) / iteration_s  # progress per second in epoch k
        need = starts[k + 1] - p
        if rate * left < need:
            p += rate * left
            left = 0.0
        else:
            left -= need / rate
            p, k = starts[k + 1], k + 1
    now = k + (p - starts[k]) / (starts[k + 1] - starts[k]) if k < last else float(last)
    trained = now - epochs_done
    if k >= last and left > 0:  # done after seconds - left of them
        trained = trained * seconds / max(seconds - left, 1e-12)
    return (trained, chosen) if choose is not None else trained


def moved(prev: Sequence[Sequence[int]], now: Sequence[Sequence[int]]) -> np.ndarray:
    """[jobs] True where a job's multiset of worker servers changed (a restart for an all-reduce job)."""
    return np.array([sorted(a) != sorted(b) for a, b in zip(prev, now)], bool)
