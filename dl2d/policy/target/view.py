"""The target-size policy on a :class:`~dl2d.core.contract.SlotView`: the NumPy simulator's and the daemon's side
of dl2d.policy.target.policy (whose features, network and decision are pure functions of arrays, the JAX environment's
side too). :func:`view_obs` gives a view's observation, :func:`padded` pads it to the rows the jitted decision
compiles for, and :class:`TargetPolicy` decides and places the chosen sizes on the servers (registered as
``dl2-target`` in dl2d.policy.target.entry; ``dl2-plan``, dl2d.policy.planning.plan_net, reads the plan through it).
"""
from __future__ import annotations

import jax
import numpy as np

from dl2d.policy.target import policy as T
def view_obs(cfg: T.TargetConfig, view) -> dict:
    """dl2d.policy.target.policy.job_features' arrays from a :class:`~dl2d.core.contract.SlotView` (NumPy), but for
    Optimus's (dl2d.policy.target.policy.with_optimus adds them, in JAX): the same quantities the JAX environment gives
    training, from what the daemon and the NumPy simulator know."""
    from dl2d.policy.elastic.srtf import size_curves

    # a cluster that allows fewer workers or PS than the policy's levels: the levels above its limits read the
    # speed at the limit, as in the environment (the fill never goes past a limit)
    lv = np.minimum(np.array(cfg.levels), view.max_workers)
    curves = size_curves(view)[:, lv] if len(view) else np.zeros((0, len(lv)))
    psl = np.minimum(np.array(cfg.ps_levels), view.max_ps)
    one_worker = view.est_speed[:, :, 1] if len(view) else np.zeros((0, view.max_ps + 1))
    ps_curves = np.where(view.allreduce[:, None], one_worker[:, :1], one_worker[:, psl]) if len(view) \
        else np.zeros((0, len(psl)))
    server_gpus = max(float(np.max(view.capacity[:, 0])), 1.0) if len(view.capacity) else 1.0
    bundle = view.worker_demand + np.where(view.allreduce[:, None], 0.0, view.ps_demand)  # one worker, one PS
    factor = np.full(len(view), np.nan) if view.job_speed_factor is None else view.job_speed_factor
    return {"job_speed_factor": np.asarray(factor, np.float32), "active": np.ones(len(view), bool),
            "remaining_epochs": np.asarray(view.remaining_epochs, np.float32),
            "slots_run": np.asarray(view.slots_run, np.float32),
            "age": np.maximum(view.slot - np.asarray(view.arrival_slot), 0).astype(np.float32),
            "prev_workers": np.asarray(view.prev_workers, np.float32),
            "worker_gpus": (bundle[:, 0] / server_gpus).astype(np.float32), "allreduce": np.asarray(view.allreduce),
            "curves": curves.astype(np.float32), "ps_curves": ps_curves.astype(np.float32),
            "slot_seconds": np.float32(view.slot_seconds),
            "capacity_gpus": np.float32(np.sum(view.capacity[:, 0])),
            # what Optimus needs (with_optimus, run inside the jitted decision)
            "speed": np.asarray(view.est_speed, np.float32),
            "worker_demand": np.asarray(view.worker_demand, np.float32),
            "ps_demand": np.asarray(view.ps_demand, np.float32),
            "arrival_slot": np.asarray(view.arrival_slot, np.int32),
            "capacity": np.asarray(view.total_capacity, np.float32)}


#: Views are padded to at least this many rows (then powers of two), so small clusters compile the decision once.
_MIN_ROWS = 64
#: The keys of an observation that describe the cluster, not a job (never padded).
_CLUSTER_KEYS = frozenset({"slot_seconds", "capacity_gpus", "capacity"})


def padded_rows(n: int) -> int:
    """The rows ``n`` jobs are padded to: 64, or the next power of two above ``n`` (the jitted network compiles
    once per size)."""
    return max(_MIN_ROWS, 1 << max(n - 1, 0).bit_length())


def padded(obs: dict, n: int) -> dict:
    """A view's observation of ``n`` jobs padded with inactive rows to :func:`padded_rows`."""
    size = padded_rows(n)
    return {k: (v if k in _CLUSTER_KEYS else np.concatenate([v, np.zeros((size - n, *v.shape[1:]), v.dtype)]))
            for k, v in obs.items()}


class TargetPolicy:
    """The target-size policy on a view: the greedy action of every job, then the fill task by task on the
    servers (dl2d.policy.baselines.heuristics.AllocationBuilder) in shortest-remaining-work order (:meth:`place`: a PS
    job's bundles first, while its targets and the servers allow; one none of whose workers fit holds no PS). Jobs
    are padded to 64 rows, or the next power of two above, for the jitted network (one compilation up to 64 jobs,
    one more per doubling). ``kinds``: the job kinds it was trained on ("ps", "allreduce"); a job of another
    kind gets its teacher's sizes. ``whole_nodes``: an all-reduce job of more workers than a node holds gets whole
    nodes' worth, its target and what fits of it each cut down to whole nodes (a site's rule,
    ``PolicyOptions.whole_nodes``; the network never learned it)."""

    def __init__(self, cfg: T.TargetConfig, params, name: str = "target", kinds: tuple[str, ...] = ("ps", "allreduce"),
                 whole_nodes: bool = False):
        self.cfg, self.params, self.name = cfg, params, name
        self.kinds = tuple(kinds)
        self.whole_nodes = bool(whole_nodes)
        self._decide = jax.jit(lambda p, o: T.decide(cfg, p, o, self.kinds)["action"])

    def actions(self, view, obs: dict | None = None):
        """(each job's greedy pair, the observation it was chosen on): ``obs``, or :func:`view_obs` of the view."""
        obs = view_obs(self.cfg, view) if obs is None else obs
        return np.asarray(self._decide(self.params, padded(obs, len(view))))[:len(view)], obs

    def __call__(self, view):
        if not len(view):
            return self.place(view, np.zeros(0, int), view_obs(self.cfg, view))
        action, obs = self.actions(view)
        return self.place(view, action, obs)

    def place(self, view, action, obs):
        """The fill of the chosen ``action`` [J] on the servers of ``view`` (``obs``: its :func:`view_obs`): in
        shortest-remaining-work order, every all-reduce job its workers and every PS job one bundle (a worker
        and a PS together); then, in the same order, each PS job's further bundles while it wants both, then
        its remaining PS, then its remaining workers. Why bundles first: placing one job's PS all before its
        workers took the cores of servers whose GPUs then stood idle (on `testbed` a tenth of the targets did
        not fit, and Optimus's own bundles-first placement did fit them; docs/BENCHMARKS.md). With
        ``whole_nodes``, an all-reduce job's workers above a node's are cut down to whole nodes, its target first
        and then what fitted of it."""
        from dl2d.policy.elastic.srtf import node_workers, whole_nodes_of
        from dl2d.policy.baselines.heuristics import AllocationBuilder

        b = AllocationBuilder(view)
        if not len(view):
            return b.allocation()
        target_w, target_p = (np.asarray(a).astype(int) for a in T.sizes(self.cfg, action, obs["allreduce"]))
        one = np.maximum(obs["curves"][:, 1], 1e-12)
        order = np.lexsort((view.arrival_slot, obs["remaining_epochs"] / one))
        ps_job = ~np.asarray(obs["allreduce"], bool) & (target_p > 0)
        node = node_workers(view) if self.whole_nodes else np.zeros(len(view), int)
        for j in order:
            if not ps_job[j]:
                b.add_up_to(j, "worker", whole_nodes_of(target_w[j], node[j]))
                if b.workers(j) != whole_nodes_of(b.workers(j), node[j]):
                    b.shrink_to(j, whole_nodes_of(b.workers(j), node[j]), 0)
            elif target_w[j] >= 1:
                b.add(j, "bundle")  # a worker and a PS, or nothing: a PS job's PS wait with no worker
        for j in order:
            if not ps_job[j] or not b.workers(j):
                continue
            while b.ps(j) < target_p[j] and b.workers(j) < target_w[j] and b.add(j, "bundle"):
                pass
            b.add_up_to(j, "ps", target_p[j] - b.ps(j))
            b.add_up_to(j, "worker", target_w[j] - b.workers(j))
        return b.allocation()

    def applied(self, view, allocation, overridden: bool) -> None:
        pass

    def observe(self, reward: float) -> None:
        pass
