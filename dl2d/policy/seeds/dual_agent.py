"""The dual-agent scheduler (DAS) of Xing et al., "A Dual-Agent Scheduler for Distributed Deep Learning Jobs
on Public Cloud via Reinforcement Learning" (KDD 2023), for the dl2d simulator, kept small.

What is the paper's, and what differs (read this before quoting a figure):

- Structure (paper section 3): an *ordering agent* gives every pending job a priority, a *placement agent*
  gives every (job, machine) pair an affinity; jobs are served in priority order and each job's tasks go
  to machines in descending affinity. Same here.
- Placement agent, Random Walk Gaussian Process (section 4.2), as the paper defines it:
  machine graph  P_t = k_Matern52(S_t, S_t) over machine feature rows (Eq. 11), the stacked random walk
  graph kernel  k_RW(G1, G2) = sum_ik [exp(beta P_x)]_ik  with P_x = P1 (x) P2 (Eq. 12 in the closed form of
  Proposition 2), and the GP posterior mean and covariance (Eq. 1, 2, 13, 14) over the last tau cluster
  graphs (Eq. 9, 10; tau = 8, the paper's best). Differences: (1) the GP's targets Y are the machines'
  *realised* speeds in the slot after each graph, not the agent's earlier actions, so the posterior mean
  is a one-step-ahead prediction of every machine's performance (the paper learns what Y means through
  RL); (2) P is divided by the number of machines (so its spectrum stays in [0, 1]) and k_RW is used
  normalised, k(G1,G2)/sqrt(k(G1,G1) k(G2,G2)), which keeps a PSD kernel and avoids exp overflow;
  (3) Matern52 on the Euclidean distance r = sqrt(g) (the paper's g is the squared scaled distance,
  written where the usual Matern uses r); (4) the job-aware Kronecker step (4.2.1) is left out: the
  performance being predicted is per machine, so the graphs are job-agnostic. The affinity of machine k
  for a job's next task is  mu_k + eta * (share of the job's tasks already on k)  (the second term is
  the "topological communication" part, as DLTAP's aggregation degree), sampled from N(mu, Sigma) when
  exploring. A worker is added only while the job's predicted speed (the view's speed estimate, as
  Optimus believes it, times the slowest predicted machine among its workers) still grows. An all-reduce
  job gets workers only.
- Ordering agent (section 4.1): priority = tanh(theta . phi_j) on job features (remaining-time estimate,
  waiting time, GPU demand, model size) and the squeezed cluster message (the mean predicted machine speed,
  entering as a product with the remaining time in place of the paper's learned gate). The paper's
  Transformer encoder, the FFN features and MAPPO training are NOT implemented: theta is learned with the
  cross-entropy method on training traces (`dl2d.policy.seeds.dual_agent_train.train_ordering_cem`, objective: average JCT), the documented
  simpler learning rule. Default theta = shortest-remaining-time-first.
- The paper's jobs run to completion on fixed gangs; here, as for every policy of this simulator, the
  allocation is re-decided every slot.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.seeds.dltap import aggregation_degree, default_scores
from dl2d.policy.baselines.heuristics import AllocationBuilder, remaining_time_estimate
from dl2d.policy.registry import PolicyOptions
from dl2d.workload.catalog import MODEL_SIZE_MB

EPS = 1e-9


# ---------------------------------------------------------------- RWGP, pure functions

def matern52(x1: np.ndarray, x2: np.ndarray, lengthscale=1.0) -> np.ndarray:
    """Matern-5/2 kernel matrix between the rows of x1 and x2: (1 + s + s^2/3) exp(-s), s = sqrt(5) r / rho."""
    x1 = np.atleast_2d(np.asarray(x1, float)) / lengthscale
    x2 = np.atleast_2d(np.asarray(x2, float)) / lengthscale
    r = np.sqrt(np.maximum(((x1[:, None, :] - x2[None, :, :]) ** 2).sum(-1), 0.0))
    s = np.sqrt(5.0) * r
    return (1.0 + s + s * s / 3.0) * np.exp(-s)


def machine_graph(features: np.ndarray, lengthscale=1.0) -> np.ndarray:
    """Adjacency of the cluster graph: Matern52 similarity of machines, divided by the number of machines."""
    f = np.asarray(features, float)
    return matern52(f, f, lengthscale) / len(f)


@dataclass(frozen=True)
class Spectrum:
    """Eigenvalues d and squared column sums w = (1^T u)^2 of a symmetric graph matrix."""

    d: np.ndarray
    w: np.ndarray

    @staticmethod
    def of(p: np.ndarray) -> "Spectrum":
        d, u = np.linalg.eigh((p + p.T) / 2)
        return Spectrum(d, u.sum(axis=0) ** 2)


def log_rw_kernel(s1: Spectrum, s2: Spectrum, beta: float = 1.0) -> float:
    """log k_RW(G1, G2) = log 1^T exp(beta P1 (x) P2) 1 = logsumexp_ab(log w1_a w2_b + beta d1_a d2_b)."""
    a = np.log(np.maximum(np.outer(s1.w, s2.w), 1e-300)) + beta * np.outer(s1.d, s2.d)
    top = a.max()
    return float(top + np.log(np.exp(a - top).sum()))


def rw_kernel(p1: np.ndarray, p2: np.ndarray, beta: float = 1.0) -> float:
    """The stacked random walk kernel of Eq. 12 / Proposition 2 (unnormalised)."""
    return float(np.exp(log_rw_kernel(Spectrum.of(p1), Spectrum.of(p2), beta)))


def rw_similarity(s1: Spectrum, s2: Spectrum, beta: float = 1.0) -> float:
    """Normalised k_RW: k(G1, G2) / sqrt(k(G1, G1) k(G2, G2)), in (0, 1]."""
    return float(np.exp(log_rw_kernel(s1, s2, beta)
                        - 0.5 * (log_rw_kernel(s1, s1, beta) + log_rw_kernel(s2, s2, beta))))


def gp_posterior(k_xx: np.ndarray, k_sx: np.ndarray, k_ss: float, y: np.ndarray, noise: float,
                 prior_mean=0.0):
    """Eq. 1 and 2: posterior mean  m + k_sx (K + s^2 I)^-1 (y - m)  and variance  k_ss - k_sx (K + s^2 I)^-1 k_xs.

    y may have several output columns (one per machine), sharing the kernel; returns (mean, variance).
    """
    k = np.asarray(k_xx, float) + noise * np.eye(len(k_xx))
    k_sx = np.asarray(k_sx, float)
    y = np.asarray(y, float)
    alpha = np.linalg.solve(k, y - prior_mean)
    mean = prior_mean + k_sx @ alpha
    var = float(k_ss - k_sx @ np.linalg.solve(k, k_sx))
    return mean, max(var, 0.0)


class RWGP:
    """One-step-ahead machine performance prediction over the last `tau` cluster graphs."""

    def __init__(self, tau: int = 8, beta: float = 1.0, lengthscale=0.5, noise: float = 0.1):
        self.tau, self.beta, self.lengthscale, self.noise = tau, beta, lengthscale, noise
        self.history: deque[tuple[int, Spectrum, np.ndarray]] = deque(maxlen=tau)
        self._sim: dict[tuple[int, int], float] = {}  # similarities between history graphs, by serial
        self._serial = 0

    def spectrum(self, features: np.ndarray) -> Spectrum:
        return Spectrum.of(machine_graph(features, self.lengthscale))

    def observe(self, spectrum: Spectrum, realised: np.ndarray) -> None:
        """Record that the cluster graph `spectrum` was followed by machine speeds `realised`."""
        self.history.append((self._serial, spectrum, np.asarray(realised, float)))
        self._serial += 1
        live = {i for i, _, _ in self.history}
        self._sim = {k: v for k, v in self._sim.items() if k[0] in live and k[1] in live}

    def _k(self, a, b) -> float:
        key = (min(a[0], b[0]), max(a[0], b[0]))
        if key not in self._sim:
            self._sim[key] = rw_similarity(a[1], b[1], self.beta)
        return self._sim[key]

    def predict(self, spectrum: Spectrum, prior_mean: np.ndarray):
        """(mean [M], standard deviation [M]) of next-slot machine speeds, around `prior_mean` (the GP's mean
        function: the speeds observed last); the prior mean itself while the history has < 2 graphs."""
        prior_mean = np.asarray(prior_mean, float)
        if len(self.history) < 2:
            return prior_mean, np.zeros(len(prior_mean))
        h = list(self.history)
        y = np.stack([v for _, _, v in h])
        k_xx = np.array([[self._k(a, b) for b in h] for a in h])
        k_sx = np.array([rw_similarity(spectrum, b[1], self.beta) for b in h])
        mean, var = gp_posterior(k_xx, k_sx, 1.0, y, self.noise, prior_mean)
        return mean, np.sqrt(var) * (y.std(axis=0) + EPS)


# ---------------------------------------------------------------- the two agents

N_FEATURES = 5


def job_features(view: SlotView, cluster_message: float) -> np.ndarray:
    """phi_j: [-log1p(remaining h), log1p(wait slots), GPU demand, log model MB / 6, message * -log1p(rem h)]."""
    rem = -np.log1p(remaining_time_estimate(view) / 3600.0)
    wait = np.log1p(np.maximum(view.slot - view.arrival_slot, 0))
    return np.stack([rem, wait, view.worker_demand[:, 0], np.log(MODEL_SIZE_MB[view.type_idx]) / 6.0,
                     cluster_message * rem], axis=1)


SRTF_THETA = np.array([1.0, 0.0, 0.0, 0.0, 0.0])


class DualAgent:
    """The DAS decision structure: ordering agent (linear-Gaussian priorities) + RWGP placement agent."""

    name = "dual-agent"

    def __init__(self, theta=SRTF_THETA, tau: int = 8, eta: float = 0.3, explore: float = 0.0, seed: int = 0):
        self.theta = np.asarray(theta, float)
        self.eta, self.explore = eta, explore
        self.rng = np.random.default_rng(seed)
        self.gp = RWGP(tau=tau)
        self._last: tuple[int, Spectrum, np.ndarray] | None = None  # (slot, graph, predicted) of last decision
        self._prev_obs: np.ndarray | None = None
        self._gpu_used: np.ndarray | None = None  # GPU share each machine got from our last allocation
        self.errors: list[tuple[float, float]] = []  # (RWGP abs error, last-value abs error) per slot

    # the placement agent's view of the machines
    def _machines(self, view: SlotView):
        m = len(view.capacity)
        observed = np.ones(m) if view.server_speed is None else np.asarray(view.server_speed, float)
        if self._last is not None and self._last[0] == view.slot - 1:
            _, spec, pred = self._last
            self.gp.observe(spec, observed)  # the graph of last slot, and the speeds that followed it
            self.errors.append((float(np.abs(pred - observed).mean()), float(np.abs(self._prev_obs - observed).mean())))
        used = self._gpu_used if self._gpu_used is not None and len(self._gpu_used) == m else np.zeros(m)
        features = np.column_stack([observed, used])
        spec = self.gp.spectrum(features)
        mean, std = self.gp.predict(spec, observed)
        self._last, self._prev_obs = (view.slot, spec, mean), observed
        return mean, std

    def priorities(self, view: SlotView, message: float) -> np.ndarray:
        mu = np.tanh(job_features(view, message) @ self.theta)
        if self.explore > 0:
            mu = mu + self.explore * self.rng.standard_normal(len(mu))
        return mu

    @staticmethod
    def job_speed(view: SlotView, j: int, ps: int, worker_servers, mu: np.ndarray) -> float:
        """Predicted speed: the view's estimate at (ps, workers) times the slowest predicted machine."""
        if not worker_servers:
            return 0.0
        return float(view.est_speed[j, ps, len(worker_servers)]) * min(mu[s] for s in worker_servers)

    def _server(self, b: AllocationBuilder, j: int, demand, score) -> int:
        free = b.placer.free
        fits = np.all(free >= np.asarray(demand) - EPS, axis=1)
        return int(np.argmax(np.where(fits, score, -np.inf))) if fits.any() else -1

    def __call__(self, view: SlotView) -> Allocation:
        mu, std = self._machines(view)
        affinity = mu + std * self.rng.standard_normal(len(mu)) if self.explore > 0 else mu
        order = np.argsort(-self.priorities(view, float(np.mean(mu))), kind="stable")
        b = AllocationBuilder(view)
        m = len(view.capacity)
        for j in map(int, order):
            while b.within_limits(j, "bundle"):
                tasks = list(b.worker_servers[j]) + list(b.ps_servers[j])
                agg = aggregation_degree(tasks, m) if tasks else np.zeros(m)
                ws = self._server(b, j, view.worker_demand[j], affinity + self.eta * agg)
                if ws < 0:
                    break
                w_now, extra_ps = list(b.worker_servers[j]), int(not view.allreduce[j])
                if w_now and (self.job_speed(view, j, b.ps(j) + extra_ps, w_now + [ws], mu)
                              <= self.job_speed(view, j, b.ps(j), w_now, mu)):
                    break  # the placement agent predicts this worker would slow the job down
                b.placer.add_at(ws, view.worker_demand[j])
                if view.allreduce[j]:
                    b.worker_servers[j].append(ws)
                    continue
                wagg = aggregation_degree(w_now + [ws], m)
                ps = self._server(b, j, view.ps_demand[j], wagg + 0.01 * default_scores(b.placer.free, view.capacity))
                if ps < 0:
                    b.placer.remove(ws, view.worker_demand[j])
                    break
                b.placer.add_at(ps, view.ps_demand[j])
                b.worker_servers[j].append(ws)
                b.ps_servers[j].append(ps)
        cap = view.capacity[:, 0]
        self._gpu_used = np.where(cap > 0, 1.0 - b.placer.free[:, 0] / np.where(cap > 0, cap, 1), 0.0)
        return b.allocation()

    def applied(self, view: SlotView, allocation: Allocation, overridden: bool) -> None:
        """Overridden: the machines carry the fallback's tasks, not ours; read the next slot's speeds against
        the GPU share the fallback placed (unknown without its placement)."""
        if not overridden:
            return
        if allocation.worker_servers is None:
            self._gpu_used = None
            return
        cap = view.capacity[:, 0]
        used = view.capacity[:, 0] - view.free[:, 0]
        for j, servers in enumerate(allocation.worker_servers):
            for srv in servers:
                used[srv] += view.worker_demand[j][0]
        self._gpu_used = np.where(cap > 0, used / np.where(cap > 0, cap, 1), 0.0)

    def observe(self, reward: float) -> None:
        """The placement agent learns from the machines' observed speeds in the next view, not the reward."""


def build(options: PolicyOptions) -> DualAgent:
    return DualAgent(seed=options.seed)


__all__ = ["DualAgent", "RWGP", "Spectrum", "gp_posterior", "log_rw_kernel", "machine_graph", "matern52",
           "rw_kernel", "rw_similarity", "job_features"]
