"""Pollux (Qiao et al., OSDI'21): each job's GPUs chosen by a cluster-wide genetic search over its goodput, and its
batch with them.

What it optimises (the paper's section 4, its artifact's simulator): every job's SPEEDUP on an allocation of r GPUs
over k nodes is its best goodput there (throughput x statistical efficiency over its candidate batches,
dl2d.workload.goodput) over its goodput at a fair share (``ceil(GPUs / jobs)`` GPUs on one node); a job whose
allocation changes has it scaled by ``max(age - restarts x 30 s, 0) / (age + 30 s)`` (the restart penalty); the
FITNESS of a cluster allocation is the power mean, p = -1, of the jobs' speedups scaled to a node's share. A
genetic search (population 100, 100 generations, elitist, from the last slot's population) over the replicas of
every job on every node maximises it, each candidate repaired as the artifact repairs it: at most one job spread
over several nodes on a node, no job above its replica cap or on more than 16 nodes, no node above its GPUs (jobs
served in order of least attained service). A job's cap is twice the most GPUs it has run on (Pollux explores),
at most 64 and its largest batch over its smallest local batch; NCF one GPU (as the artifact has it).

The goodput it believes is Pollux's throughput model fitted to all of the model's measurements
(dl2d.workload.throughput.PolluxFit: what the real Pollux fits from a job's own profile, given here at once) and
the gradient statistics the job reports at its batch and epoch (its model's measured ones in the twin). A job
that lets the scheduler choose its batch takes the goodput-optimal batch for its GPUs when it restarts, or when
one trains 20 % faster (dl2d.policy.elastic.goodput); one that does not keeps its batch, and Pollux sizes it for
that batch.

What differs from the artifact: the search is an elitist single-objective genetic algorithm, not pymoo's NSGA-II
(whose second objective, cluster utility, only serves autoscaling, off in the artifact's runs); the batch Pollux
gives a job takes effect at a restart (dl2d's job contract: a job reads its batch when it starts), unless the
twin lets jobs choose their own in place between epochs as AdaptDL's do (``--batch-change in-place``, the
reference preset's). Simulator only (it reads the measured tables): not for the daemon.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.core.placement import fit_counts
from dl2d.policy.baselines.heuristics import AllocationBuilder
from dl2d.policy.baselines.slurm_fifo import asked
from dl2d.policy.elastic.goodput import goodput_batches
from dl2d.policy.registry import IgnoresFeedback, PolicyOptions
from dl2d.workload import batching, efficiency, throughput
from dl2d.workload.catalog import ALLREDUCE_MODELS, MODEL_NAMES
from dl2d.workload.goodput import CANDIDATES

POPULATION = 100
GENERATIONS = 100
RESTART_S = 30.0
MAX_NODES = 16
POWER = -1.0


def goodput_table(model: str, batch: float, adaptive: bool, stats: tuple[float, float], max_replicas: int,
                  max_nodes: int) -> np.ndarray:
    """[max_nodes + 1, max_replicas + 1] the best goodput (progress per second) of ``model`` on r GPUs over k nodes
    (0 where k > r or none), over its candidate batches (just ``batch`` when it is not adaptive), by Pollux's fit."""
    lim = batching.limits(model)
    fit = throughput.throughput_model(model).fit
    r = np.arange(max_replicas + 1, dtype=float)[None, :, None]
    k = np.arange(max_nodes + 1, dtype=float)[:, None, None]
    if adaptive:
        m = np.geomspace(lim.init, lim.max_total, CANDIDATES)[None, None, :]
    else:
        m = np.array([float(batch)])[None, None, :]
    rr = np.maximum(r, 1.0)
    local = np.ceil(m / rr - 1e-8)
    accum = np.ceil(local / lim.max_local - 1e-8) - 1
    accum = np.where((rr == 1) & (m > lim.init + 1e-8) & adaptive, np.maximum(accum, 1), accum)
    atomic = np.ceil(local / (accum + 1) - 1e-8)
    atomic = np.minimum(atomic, np.floor(lim.max_total / (rr * (accum + 1))))
    trained = rr * atomic * (accum + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        step = fit.step_time(rr, np.maximum(k, 1.0), np.maximum(atomic, 1.0)) \
            + accum * (fit.alpha_grad + fit.beta_grad * atomic)
        gain = efficiency.gain_of(stats, trained, lim.init)
        good = np.where((atomic >= lim.min_local) | ~adaptive, gain / step, 0.0)
    good = np.where((k >= 1) & (k <= r) & (r >= 1), good, 0.0)
    return good.max(axis=2)


def power_mean(x: np.ndarray, p: float = POWER) -> np.ndarray:
    """Over the last axis, of ``x + 1e-3`` (the artifact's guard against a zero)."""
    return (np.mean((x + 1e-3) ** p, axis=-1)) ** (1.0 / p)


class Search:
    """One slot's genetic search (module docstring); pure given its generator."""

    def __init__(self, speedup: np.ndarray, caps: np.ndarray, node_gpus: np.ndarray, base: np.ndarray,
                 penalty: np.ndarray, share: float, rng: np.random.Generator):
        self.speedup, self.caps, self.node_gpus, self.base = speedup, caps, node_gpus, base
        self.penalty, self.share, self.rng = penalty, share, rng
        self.jobs, self.nodes = base.shape

    def fitness(self, states: np.ndarray) -> np.ndarray:
        r = states.sum(axis=2)
        k = np.minimum(np.count_nonzero(states, axis=2), self.speedup.shape[1] - 1)
        r = np.minimum(r, self.speedup.shape[2] - 1)
        s = self.speedup[np.arange(self.jobs)[None, :], k, r] * self.share * self.nodes
        restart = np.any(states != self.base[None], axis=2)
        s = np.where(restart, s * self.penalty[None, :], s)
        return power_mean(s)

    def repair(self, states: np.ndarray) -> np.ndarray:
        states = states.copy()
        spread = np.count_nonzero(states, axis=2) > 1  # at most one job over several nodes on a node
        mask = (states * spread[..., None] > 0).cumsum(axis=1) > 1
        states[mask] = 0
        shuffle = np.argsort(self.rng.random(states.shape), axis=2)
        states = np.take_along_axis(states, shuffle, axis=2)
        states = np.diff(np.minimum(np.cumsum(states, axis=2), self.caps[None, :, None]), axis=2, prepend=0)
        keep = np.diff(np.minimum(np.cumsum(states > 0, axis=2), MAX_NODES), axis=2, prepend=0) > 0
        states = np.where(keep, states, 0)
        states = np.take_along_axis(states, np.argsort(shuffle, axis=2), axis=2)
        states = np.diff(np.minimum(np.cumsum(states, axis=1), self.node_gpus[None, None, :]), axis=1, prepend=0)
        return np.maximum(states, 0)

    def mutate(self, states: np.ndarray) -> np.ndarray:
        rng = self.rng
        states = states.copy()
        reset = rng.random(states.shape[:2]) < 0.1
        states = np.where(reset[..., None], self.base[None], states)
        zero_rows = rng.random(states.shape[:2]) < 0.1
        states[(rng.random(states.shape) < 0.1) & zero_rows[..., None]] = 0
        free = self.node_gpus[None, :] - states.sum(axis=1)  # [P, N]
        fits = np.broadcast_to((free >= 1)[:, None, :], states.shape)
        p1 = fits / np.maximum(fits.sum(axis=2, keepdims=True), 1)
        held = (states > 0) & fits
        p2 = held / np.maximum(held.sum(axis=2, keepdims=True), 1)
        grow = rng.random(states.shape) < p1 + p2 - p1 * p2
        high = np.minimum(self.node_gpus[None, None, :], self.caps[None, :, None])
        new = rng.integers(np.minimum(states, high), high + 1)
        return np.where(grow, new, states)

    def crossover(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        point = self.rng.integers(0, self.jobs + 1, size=(len(a), 1, 1))
        first = np.arange(self.jobs)[None, :, None] < point
        return np.concatenate([np.where(first, a, b), np.where(first, b, a)])

    def run(self, start: np.ndarray, generations: int = GENERATIONS, population: int = POPULATION) -> np.ndarray:
        pop = self.repair(start)
        while len(pop) < population:
            pop = np.concatenate([pop, self.repair(self.mutate(pop[: population - len(pop)]))])
        fit = self.fitness(pop)
        for _ in range(generations):
            pick = self.rng.integers(0, len(pop), size=(2, population // 2, 2))
            win = np.where(fit[pick[..., 0]] >= fit[pick[..., 1]], pick[..., 0], pick[..., 1])  # tournaments
            kids = self.repair(self.mutate(self.crossover(pop[win[0]], pop[win[1]])))
            both = np.concatenate([pop, kids])
            both_fit = np.concatenate([fit, self.fitness(kids)])
            best = np.argsort(-both_fit, kind="stable")[:population]
            pop, fit = both[best], both_fit[best]
        return pop


class Pollux(IgnoresFeedback):
    """The policy (module docstring): what it remembers of each job id, its last population, its generator."""

    name = "pollux"

    def __init__(self, seed: int = 0, generations: int = GENERATIONS, population: int = POPULATION):
        self.rng = np.random.default_rng(seed)
        self.generations, self.population = generations, population
        self.most_gpus: dict[int, int] = {}
        self.restarts: dict[int, int] = {}
        self.attained: dict[int, float] = {}
        self._pop: tuple[list[int], np.ndarray] | None = None  # job ids, [P, jobs, nodes]

    def _account(self, view: SlotView) -> None:
        live = set()
        for j, job in enumerate(view.job_ids.tolist()):
            live.add(job)
            w = int(view.prev_workers[j])
            self.most_gpus[job] = max(self.most_gpus.get(job, 0), w)
            self.attained[job] = self.attained.get(job, 0.0) + w * view.slot_seconds
            self.restarts.setdefault(job, 0)
        for gone in set(self.attained) - live:
            for d in (self.most_gpus, self.restarts, self.attained):
                d.pop(gone, None)

    def caps(self, view: SlotView, order: np.ndarray, known: np.ndarray) -> np.ndarray:
        out = np.zeros(len(order), int)
        for i, j in enumerate(order):
            top = view.max_workers
            if known[j]:
                model = MODEL_NAMES[int(view.type_idx[j])]
                lim = batching.limits(model)
                top = 1 if model == "ncf" else min(int(lim.max_total // lim.min_local), view.max_workers)
            out[i] = min(max(2 * self.most_gpus.get(int(view.job_ids[j]), 0), 1), 64, top)
        return out

    def __call__(self, view: SlotView) -> Allocation:
        n = len(view)
        if not n:
            return Allocation.empty(0)
        self._account(view)
        b = AllocationBuilder(view)
        # a job Pollux does not size (a PS job, a worker of several GPUs) gets what it asked for, first
        ours = view.allreduce & np.isclose(view.worker_demand[:, 0], 1.0)
        workers, ps = asked(view)
        for j in np.argsort(view.arrival_slot, kind="stable"):
            if not ours[j]:
                b.add_gang(int(j), int(workers[j]), int(ps[j]))
        jobs = np.flatnonzero(ours)
        if len(jobs):
            self._size(view, b, jobs)
        alloc = b.allocation()
        adaptive = np.zeros(n, bool) if view.adaptive is None else np.asarray(view.adaptive, bool)
        if adaptive.any():
            alloc = replace(alloc, batch_size=goodput_batches(view, alloc))
        return alloc

    def _size(self, view: SlotView, b: AllocationBuilder, jobs: np.ndarray) -> None:
        """The search over the all-reduce jobs of one-GPU workers ``jobs`` on what the others left."""
        ids = view.job_ids.tolist()
        known = np.array([int(t) < len(MODEL_NAMES) and MODEL_NAMES[int(t)] in ALLREDUCE_MODELS
                          for t in view.type_idx])
        order = np.array(sorted(jobs.tolist(), key=lambda j: (self.attained[ids[j]], view.arrival_slot[j], j)), int)
        room = fit_counts(b.placer.free, view.worker_demand[order[0]])
        nodes = len(room)
        caps = self.caps(view, order, known)
        adaptive = np.zeros(len(view), bool) if view.adaptive is None else np.asarray(view.adaptive, bool)
        fair = max(math.ceil(view.capacity[:, 0].sum() / len(view)), 1)
        speedup = np.zeros((len(order), MAX_NODES + 1, int(caps.max()) + 1))
        for i, j in enumerate(order):
            width = max(int(caps[i]), fair)
            if known[j]:
                model = MODEL_NAMES[int(view.type_idx[j])]
                stats = efficiency.grad_stats(efficiency.runs(model), float(view.batch_size[j]),
                                              int(view.epochs_done[j]))
                t = goodput_table(model, float(view.batch_size[j]), bool(adaptive[j]), stats, width, MAX_NODES)
                base = t[1, fair] if t[1, fair] > 0 else t.max()
                t = t / max(base, 1e-12)
            else:  # nothing known of it: speedup linear in its GPUs, 1 at a fair share (the artifact's)
                r = np.arange(width + 1, dtype=float)
                k = np.arange(MAX_NODES + 1)[:, None]
                t = np.where((k >= 1) & (k <= r[None, :]), r[None, :] / fair, 0.0)
            cols = min(t.shape[1], speedup.shape[2])
            speedup[i, :, :cols] = t[:, :cols]
        base = np.zeros((len(order), nodes), int)
        prev = view.prev_worker_servers or ((),) * len(view)
        for i, j in enumerate(order):
            for srv in prev[j]:
                base[i, int(srv)] += 1
        age = np.array([view.slots_run[j] * view.slot_seconds for j in order], float)
        restarts = np.array([self.restarts[ids[j]] for j in order], float)
        penalty = np.maximum(age - restarts * RESTART_S, 0.0) / (age + RESTART_S)
        search = Search(speedup, caps, room.astype(int), np.minimum(base, room[None, :]), penalty,
                        1.0 / max(view.capacity[:, 0].sum(), 1), self.rng)
        best = self.run_search(search, [ids[j] for j in order], search.base)[0]  # best first
        for i, j in enumerate(order):
            servers = [srv for srv in range(nodes) for _ in range(int(best[i, srv]))]
            if servers and prev[j] and sorted(servers) != sorted(prev[j]):
                self.restarts[ids[j]] += 1
            for srv in servers:
                if b.placer.fits_on(srv, view.worker_demand[j]):
                    b.placer.add_at(srv, view.worker_demand[j])
                    b.worker_servers[j].append(srv)

    def run_search(self, search: Search, ids: list[int], base: np.ndarray) -> np.ndarray:
        """The search from the last slot's population (its jobs' rows where they are still here) and this slot's
        allocation; the population kept for the next slot."""
        start = [base[None]]
        if self._pop is not None:
            old_ids, old = self._pop
            where = {job: i for i, job in enumerate(old_ids)}
            carried = np.zeros((len(old), len(ids), base.shape[1]), int)
            for i, job in enumerate(ids):
                if job in where and old.shape[2] == base.shape[1]:
                    carried[:, i] = old[:, where[job]]
            start.append(carried)
        pop = search.run(np.concatenate(start)[: self.population], self.generations, self.population)
        self._pop = (ids, pop)
        return pop


def build(options: PolicyOptions) -> Pollux:
    return Pollux(seed=options.seed)
