"""A job's demand and a target -> the Slurm allocation to ask for. Pure (design: docs/slurm.md).

All workers and parameter servers of a dl2d job live in one Slurm allocation of ``N`` nodes with ``G``
GPUs each (``--nodes=N --gres=gpu:G``). The rule (:func:`allocation_for`): ``N`` is the fewest nodes
that host the tasks, the workers spread evenly over them (no node holds two more than another) and the
PS in the CPUs and memory left; ``G = ceil(W / N) * gpus_w`` (``--gres`` is per node, so every node
gets the GPUs of the busiest one), and likewise every node asks for the CPUs and memory of the busiest
node of that layout (:func:`spread`, :func:`per_node_request`; ``--mincpus``, ``--mem``). A node's capacity is that of the smallest usable node, or the
configured node shape. PS need no GPU and share the workers' nodes.

A task's demand comes from one place, :func:`job_demand`: the job's spec where it says, its model's
default where it is silent (dl2d.daemon.jobmodel) — what the policy plans the job with. An all-reduce job is
the same rule with no PS: its workers spread evenly over the fewest nodes, ``--gres`` their GPUs per node. Slurm hands out whole
GPUs and CPUs, so those demands are rounded up (:class:`TaskSize`); memory stays in GB.

A running job can only keep or release nodes (Slurm cannot add nodes or GPUs per node to a running
allocation): :func:`nodes_to_host` says how few of the nodes it holds host a new size, or that they
cannot.

When a target carries a placement (``Target.worker_nodes``/``ps_nodes``, e.g. from DLTAP), that
placement is the allocation instead (:func:`target_selection`, :func:`allocation_for_selection`):
``--nodelist`` = its nodes, most tasks first, ``N`` = their count, ``G`` = the workers on the busiest
node times the GPUs per worker, and a PS-first hostfile for ``srun --distribution=arbitrary``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import AbstractSet, Any, Mapping, Sequence

from dl2d.core.jobs import JobDemand, TaskDemand
from dl2d.daemon import jobmodel
from dl2d.daemon.backend import JobRequest, NodeInfo, Target
from dl2d.slurm.driver import SlurmJob, SlurmNode


def job_demand(job: JobRequest) -> JobDemand:
    """The job's per-task demand: its spec's ``[worker]``/``[ps]`` values, its model's default where the spec
    gives none (dl2d.daemon.jobmodel.job_demand). The same source the policy plans from, so a job submitted
    with 2 GPUs per worker is sized with 2 here too, and an all-reduce job has no PS: W workers of g GPUs are
    ``N`` nodes x ``ceil(W / N) * g`` GPUs (8 one-GPU workers on 4-GPU nodes: 2 nodes x ``--gres=gpu:4``).
    ValueError for a PS job of an unknown type or a bad spec value."""
    return jobmodel.job_demand(job.job_type, job.spec or {})


@dataclass(frozen=True)
class NodeShape:
    """Capacity of one node used to size allocations (0 CPUs or memory: unknown, not a limit)."""

    gpus: int
    cpus: int
    mem_gb: float


@dataclass(frozen=True)
class SlurmAllocation:
    """A Slurm allocation: ``nodes`` nodes with ``gpus_per_node`` GPUs, ``cpus_per_node`` CPUs and
    ``mem_mb_per_node`` MB of memory each (``--nodes``, ``--gres``, ``--mincpus``, ``--mem``): what the
    busiest node's tasks need. 0 CPUs or memory: not requested (or unknown, for a job dl2d submitted
    before it requested them)."""

    nodes: int
    gpus_per_node: int
    cpus_per_node: int = 0
    mem_mb_per_node: int = 0

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def allocation_record(a: SlurmAllocation) -> dict[str, int]:
    """An allocation as the job's record keeps it."""
    return asdict(a)


def allocation_from_record(asked: Mapping[str, Any]) -> SlurmAllocation:
    """An allocation from the job's record (0 CPUs / memory where it predates them)."""
    return SlurmAllocation(int(asked["nodes"]), int(asked.get("gpus_per_node", 0)),
                           int(asked.get("cpus_per_node") or 0), int(asked.get("mem_mb_per_node") or 0))


def held_allocation(live: SlurmJob | None, record: Mapping[str, Any]) -> SlurmAllocation | None:
    """A running job's allocation as Slurm reports it; a pending one's as we requested
    it (Slurm 22.05 keeps showing a requeued job's old node count after ``scontrol update
    NumNodes`` until it starts, at the new count). CPUs and memory per node: Slurm's figures, the
    record's where Slurm gives none; unknown (0) for a job submitted before dl2d requested them."""
    if live is None:
        return None
    asked = record.get("allocation") or {}
    if live.state != "RUNNING" and asked.get("nodes"):
        return allocation_from_record(asked)
    if not live.num_nodes:
        return None
    known = "cpus_per_node" in asked
    return SlurmAllocation(
        live.num_nodes, live.gpus_per_node,
        (live.cpus_per_node or int(asked["cpus_per_node"])) if known else 0,
        (live.mem_mb_per_node or int(asked.get("mem_mb_per_node") or 0)) if known else 0)


@dataclass(frozen=True)
class TaskSize:
    """One task's demand in Slurm's units: whole GPUs and CPUs, memory in GB."""

    gpus: int
    cpus: int
    mem_gb: float

    @staticmethod
    def of(task: TaskDemand) -> TaskSize:
        """Rounded up: Slurm cannot hand out part of a GPU or CPU, and rounding down would put more
        tasks on a node than it holds (a job type's 0.5-GPU task still needs a whole GPU here)."""
        return TaskSize(math.ceil(task.gpus), math.ceil(task.cpus), float(task.mem_gb))


def node_info(n: SlurmNode, gpus_other: int = 0) -> NodeInfo:
    """A Slurm node as the daemon sees it (memory in GB; the reason a node is unusable; ``gpus_other``: the GPUs
    that Slurm jobs not dl2d's hold there, :func:`gpus_held_by_others`)."""
    reason = n.reason or ("" if n.usable else ",".join((n.state,) + n.flags))
    return NodeInfo(name=n.name, gpus=n.gpus, cpus=n.cpus, mem_gb=n.mem_mb / 1024.0,
                    usable=n.usable, reason=reason, gpus_other=gpus_other)


#: Slurm job states in which a job holds its nodes' resources.
HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"})


def gpus_held_by_others(nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob], own: AbstractSet[str]
                        ) -> dict[str, int]:
    """The GPUs of each node that Slurm has allocated to work that is not dl2d's: the node's GRES in use less what
    dl2d's own Slurm jobs (``own``: their Slurm ids) hold there, each ``--gres=gpu:G`` on every node it has.
    Counted from the node and not from the other jobs because another user's job may ask for GPUs in any form
    Slurm takes (per job, per task, per node); only the node's count is sure. A job that carries a dl2d name or
    comment but is not one of ``own`` (planted, or another daemon's) is someone else's too."""
    mine: dict[str, int] = {}
    for j in jobs:
        if j.job_id in own and j.state in HOLDING_STATES:
            for name in set(j.nodes):
                mine[name] = mine.get(name, 0) + j.gpus_per_node
    return {n.name: max(n.gpus_alloc - mine.get(n.name, 0), 0) for n in nodes}


def node_shape(nodes: list[NodeInfo]) -> NodeShape | None:
    """The smallest usable node (per resource), or None when no node is usable."""
    usable = [n for n in nodes if n.usable]
    if not usable:
        return None
    return NodeShape(gpus=min(n.gpus for n in usable), cpus=min(n.cpus for n in usable),
                     mem_gb=min(n.mem_gb for n in usable))


def _fit_count(free: float, need: float) -> float:
    """How many tasks that each need ``need`` fit in ``free`` (unlimited when they need none)."""
    if need <= 0 or math.isinf(free):
        return math.inf
    return max(0, math.floor(free / need + 1e-9))


def _hosts(nodes: int, gpus_per_node: int, workers: int, ps: int, worker: TaskSize, server: TaskSize,
           shape: NodeShape) -> bool:
    """Do ``nodes`` nodes with ``gpus_per_node`` GPUs (and the shape's CPUs and memory) host ``workers``
    workers spread evenly and ``ps`` PS in what is left? Nodes hold ``ceil(W/N)`` or ``floor(W/N)``
    workers; only these two kinds of node exist, so the check is O(1)."""
    if nodes < 1:
        return False
    if workers and math.ceil(workers / nodes) * worker.gpus > gpus_per_node:
        return False
    cpus = shape.cpus if shape.cpus > 0 else math.inf
    mem = shape.mem_gb if shape.mem_gb > 0 else math.inf
    fewer, busier = divmod(workers, nodes)  # `busier` nodes hold fewer + 1 workers, the rest `fewer`
    room = 0.0
    for w, count in ((fewer + 1, busier), (fewer, nodes - busier)):
        if count == 0:
            continue
        cpus_left, mem_left = cpus - w * worker.cpus, mem - w * worker.mem_gb
        if cpus_left < 0 or mem_left < -1e-9:
            return False
        room += count * min(_fit_count(cpus_left, server.cpus), _fit_count(mem_left, server.mem_gb))
    return room >= ps


def _check_tasks_fit_a_node(workers: int, ps: int, worker: TaskSize, server: TaskSize,
                            shape: NodeShape) -> None:
    if workers and worker.gpus > shape.gpus:
        raise ValueError(f"a worker needs {worker.gpus} GPUs; nodes have {shape.gpus}")
    if max(worker.cpus if workers else 0, server.cpus if ps else 0) > shape.cpus > 0:
        raise ValueError(f"a task needs more CPUs than a node has ({shape.cpus})")
    if max(worker.mem_gb if workers else 0, server.mem_gb if ps else 0) > shape.mem_gb > 0:
        raise ValueError(f"a task needs more memory than a node has ({shape.mem_gb:g} GB)")


def mem_mb(gb: float) -> int:
    """GB (of 1024 MB, as sinfo's RealMemory / 1024 and dl2ctl's --mem-per-* are) → whole MB, rounded up."""
    return max(0, math.ceil(gb * 1024 - 1e-6))


def spread(nodes: int, workers: int, ps: int, worker: TaskSize, server: TaskSize,
           shape: NodeShape) -> list[tuple[int, int]]:
    """(workers, PS) on each of ``nodes`` nodes: the workers spread evenly (the first ``W mod N`` nodes
    hold one more), each PS on the node with the most room left for another PS (room: how many more
    fit in the shape's CPUs and memory; ties: fewer PS, then fewer workers, then node order). When the
    tasks fit at all (:func:`_hosts`), this layout fits: a PS costs every node one unit of its room."""
    fewer, busier = divmod(workers, nodes)
    layout = [[fewer + (i < busier), 0] for i in range(nodes)]
    cpus = shape.cpus if shape.cpus > 0 else math.inf
    mem = shape.mem_gb if shape.mem_gb > 0 else math.inf

    def room(i: int) -> float:
        w, p = layout[i]
        return min(_fit_count(cpus - w * worker.cpus - p * server.cpus, server.cpus),
                   _fit_count(mem - w * worker.mem_gb - p * server.mem_gb, server.mem_gb))

    for _ in range(ps):
        best = max(range(nodes), key=lambda i: (room(i), -layout[i][1], -layout[i][0], -i))
        layout[best][1] += 1
    return [(w, p) for w, p in layout]


def per_node_request(layout: Sequence[tuple[int, int]], worker: TaskSize,
                     server: TaskSize) -> tuple[int, int]:
    """(CPUs, memory MB) to ask on every node so that the busiest node of ``layout`` ((workers, PS) per
    node) holds its tasks; at least 1 CPU (Slurm's minimum); 0 MB when the tasks need no memory (the
    request is then left out: ``--mem=0`` would mean the whole node)."""
    cpus = max((w * worker.cpus + p * server.cpus for w, p in layout), default=0)
    mem = max((w * worker.mem_gb + p * server.mem_gb for w, p in layout), default=0.0)
    return max(1, cpus), mem_mb(mem)


def allocation_for(workers: int, ps: int, demand: JobDemand, shape: NodeShape) -> SlurmAllocation:
    """The allocation that holds ``workers`` workers and ``ps`` PS (the rule in the module doc).
    Raises ValueError when one task does not fit on a node at all."""
    if workers < 0 or ps < 0 or workers + ps == 0:
        raise ValueError(f"allocation_for needs a non-zero size, got {workers} workers, {ps} PS")
    worker, server = TaskSize.of(demand.worker), TaskSize.of(demand.ps)
    _check_tasks_fit_a_node(workers, ps, worker, server, shape)
    # One task per node always fits (each task fits a node), so the loop ends by workers + ps nodes.
    for nodes in range(1, workers + ps + 1):
        gpus_per_node = math.ceil(workers / nodes) * worker.gpus
        if gpus_per_node <= shape.gpus and _hosts(nodes, gpus_per_node, workers, ps, worker, server, shape):
            cpus, mem = per_node_request(spread(nodes, workers, ps, worker, server, shape), worker, server)
            return SlurmAllocation(nodes, gpus_per_node, cpus, mem)
    raise AssertionError("unreachable: one task per node always fits")


def held_shape(held: SlurmAllocation, shape: NodeShape) -> NodeShape:
    """What each node of a running allocation holds for the job: its GPUs, CPUs and memory per node
    (the node shape's CPUs or memory where the allocation does not say: a job submitted before dl2d
    requested them)."""
    return NodeShape(gpus=held.gpus_per_node,
                     cpus=held.cpus_per_node if held.cpus_per_node > 0 else shape.cpus,
                     mem_gb=held.mem_mb_per_node / 1024.0 if held.mem_mb_per_node > 0 else shape.mem_gb)


def nodes_to_host(held: SlurmAllocation, workers: int, ps: int, demand: JobDemand,
                  shape: NodeShape) -> int | None:
    """The fewest of a running job's nodes (each keeping its GPUs, CPUs and memory, :func:`held_shape`)
    that host ``workers`` workers and ``ps`` PS; None when all of them cannot (growing beyond them needs
    a new allocation: Slurm adds neither nodes nor GPUs, CPUs or memory to a running job)."""
    worker, server = TaskSize.of(demand.worker), TaskSize.of(demand.ps)
    holds = held_shape(held, shape)
    for nodes in range(1, held.nodes + 1):
        if _hosts(nodes, held.gpus_per_node, workers, ps, worker, server, holds):
            return nodes
    return None


# -- node selection from a placement (DLTAP) ----------------------------------------------------


@dataclass(frozen=True)
class SlurmNodeSelection:
    """How to ask Slurm for one job's placement (one batch job per dl2d job, see docs/slurm.md).

    nodelist: the nodes, most tasks of the job first (ties: by node order given), so the batch host is
    the most aggregated node and a shrink, which keeps the first nodes, releases the least used ones.
    hostfile: one node per task, PS tasks first then workers (the roles in `roles`), for
    `--distribution=arbitrary` with SLURM_HOSTFILE pointing at a file of these lines.
    """

    nodelist: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    hostfile: tuple[str, ...]
    roles: tuple[str, ...]
    distribution: str = "arbitrary"

    @property
    def nodes(self) -> int:
        return len(self.nodelist)

    @property
    def ntasks(self) -> int:
        return len(self.hostfile)

    def sbatch_args(self) -> list[str]:
        return [f"--nodes={self.nodes}", f"--nodelist={','.join(self.nodelist)}", f"--ntasks={self.ntasks}",
                f"--distribution={self.distribution}"]


def slurm_node_selection(worker_servers: Sequence[int], ps_servers: Sequence[int],
                         node_names: Sequence[str]) -> SlurmNodeSelection:
    """One job's placement (e.g. DLTAP's), as server indices into `node_names`, as Slurm node selection."""
    tasks = [("ps", int(s)) for s in ps_servers] + [("worker", int(s)) for s in worker_servers]
    if not tasks:
        raise ValueError("a job without tasks has no node selection")
    for _, s in tasks:
        if not 0 <= s < len(node_names):
            raise ValueError(f"server index {s} outside the {len(node_names)} node names")
    counts: dict[int, int] = {}
    for _, s in tasks:
        counts[s] = counts.get(s, 0) + 1
    order = sorted(counts, key=lambda s: (-counts[s], s))
    return SlurmNodeSelection(
        nodelist=tuple(node_names[s] for s in order),
        tasks_per_node=tuple(counts[s] for s in order),
        hostfile=tuple(node_names[s] for _, s in tasks),
        roles=tuple(r for r, _ in tasks),
    )


def target_selection(target: Target) -> SlurmNodeSelection | None:
    """The Slurm node selection (``--nodelist`` order, hostfile) of a target that carries a placement
    (the policy's, e.g. DLTAP), or None when it carries none. Nodes are numbered by first appearance,
    PS first, so ties in the node order keep that order. Raises ValueError when the placement does not
    list one node per task."""
    wn, pn = tuple(target.worker_nodes), tuple(target.ps_nodes)
    if not wn and not pn:
        return None
    if len(wn) != target.workers or len(pn) != target.ps:
        raise ValueError(f"the target places {len(wn)} workers / {len(pn)} PS on nodes but asks for "
                         f"{target.workers}/{target.ps}")
    names = list(dict.fromkeys(pn + wn))
    index = {n: i for i, n in enumerate(names)}
    return slurm_node_selection([index[n] for n in wn], [index[n] for n in pn], names)


def allocation_for_selection(selection: SlurmNodeSelection, demand: JobDemand) -> SlurmAllocation:
    """The allocation that holds a node selection: its nodes, each with the GPUs, CPUs and memory of the
    busiest node (``--gres``, ``--mincpus`` and ``--mem`` are per node, so nodes with fewer tasks, or
    only PS, get as many)."""
    per_node: dict[str, list[int]] = {n: [0, 0] for n in selection.nodelist}
    for node, role in zip(selection.hostfile, selection.roles):
        per_node[node][0 if role == "worker" else 1] += 1
    worker, server = TaskSize.of(demand.worker), TaskSize.of(demand.ps)
    cpus, mem = per_node_request([(w, p) for w, p in per_node.values()], worker, server)
    return SlurmAllocation(nodes=selection.nodes,
                           gpus_per_node=max((w for w, _ in per_node.values()), default=0) * worker.gpus,
                           cpus_per_node=cpus, mem_mb_per_node=mem)
