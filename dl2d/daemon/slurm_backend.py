"""The Slurm backend: one Slurm batch job per dl2d job (design: docs/slurm.md).

Pure parts (tested without Slurm): :func:`demand_from_spec`, :func:`allocation_for`,
:func:`target_selection`, :func:`allocation_for_selection`, :func:`plan_apply`,
:func:`epochs_from_progress`, :func:`status_from`, :func:`batch_script`.
:class:`SlurmBackend` is the I/O shell around them: it talks to Slurm through a
:class:`~dl2d.slurm.driver.SlurmDriver` (wrapped in a retrying one), reads the jobs' progress
files and keeps one small JSON record per job under its state directory.

Rule for the allocation (``allocation_for``): all workers and parameter servers of a job live in
one Slurm allocation of ``N`` nodes with ``G`` GPUs each (``--nodes=N --gres=gpu:G``)::

    N = max(1, ceil(W*gpus_w / gpus_node), ceil((W*cpus_w + P*cpus_ps) / cpus_node),
            ceil((W*mem_w + P*mem_ps) / mem_node))
    G = ceil(W*gpus_w / N)

with ``W``/``P`` the target workers/PS, ``*_w``/``*_ps`` the per-task demands of the job's spec
(``worker.gpus`` default 1, ``worker.cpus`` 1, ``worker.mem_gb`` 0, ``ps.cpus`` 1, ``ps.mem_gb``
0) and ``*_node`` the capacity of the smallest usable node (or the configured node shape). PS
need no GPU and share the workers' nodes.

When the daemon's target carries a placement (``Target.worker_nodes``/``ps_nodes``, e.g. from
DLTAP), that placement is the allocation instead (``target_selection``,
``allocation_for_selection``): ``--nodelist`` = its nodes, most tasks first, ``N`` = their count,
``G`` = the workers on the busiest node times ``gpus_w``; the job directory gets a ``hostfile``
(one node per task, PS first; ``$DL2D_HOSTFILE``) for ``srun --distribution=arbitrary``.

Per job the backend keeps a directory ``<state_dir>/jobs/<id>/``:

* ``record.json`` — the backend's durable state (Slurm job ids, target and applied size,
  stopped/cancelled/final), written atomically (write-then-rename);
* ``target.env`` / ``target.json`` — the size the job should run at; the batch script sources
  ``target.env`` every time it starts (so a requeued job sees its new size) and exports
  ``DL2D_WORKERS``/``DL2D_PS``; running jobs may re-read ``$DL2D_TARGET_FILE``;
* ``progress.json`` (``$DL2D_PROGRESS_FILE``) — written by the job: epochs done;
* ``checkpoint/`` (``$DL2D_CHECKPOINT_DIR``) — the job's checkpoints, kept across restarts;
* ``slurm-<slurm id>.out`` — the batch job's output.

The Slurm job carries ``--comment=dl2d:<id>`` and the name ``<prefix><id>``, so a backend whose
record lacks a job it just submitted (daemon killed between ``sbatch`` and the record write)
adopts the active Slurm job instead of submitting a second one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shlex
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from dl2d.daemon.backend import (
    FAILED,
    FINISHED,
    HOT,
    NOOP,
    PENDING,
    RESTART,
    RUNNING,
    SHRINK,
    START,
    STOP,
    ApplyResult,
    BackendError,
    JobRequest,
    JobStatus,
    NodeInfo,
    Target,
)
from dl2d.slurm.backoff import BackoffPolicy, RetryingDriver
from dl2d.slurm.driver import (
    COMMENT_PREFIX,
    JobSpec,
    SlurmDriver,
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmUnavailable,
)

log = logging.getLogger(__name__)

RESTART_METHODS = ("resubmit", "requeue")
#: SlurmBackendConfig.placement: slurm = Slurm picks the nodes (the target's placement is ignored);
#: target = the target's placement (e.g. DLTAP's) is the job's --nodelist (``target_selection``).
PLACEMENTS = ("slurm", "target")


# ---------------------------------------------------------------------------------------------
# Pure mapping
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Demand:
    """Per-task resource demands of a job (from its spec)."""

    gpus_per_worker: int = 1
    cpus_per_worker: int = 1
    mem_gb_per_worker: float = 0.0
    cpus_per_ps: int = 1
    mem_gb_per_ps: float = 0.0


@dataclass(frozen=True)
class NodeShape:
    """Capacity of one node used to size allocations."""

    gpus: int
    cpus: int
    mem_gb: float


@dataclass(frozen=True)
class Allocation:
    """A Slurm allocation: ``nodes`` nodes with ``gpus_per_node`` GPUs each."""

    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def _num(spec: Mapping[str, Any], section: str, key: str, default: float) -> float:
    sub = spec.get(section)
    value = sub.get(key, default) if isinstance(sub, Mapping) else default
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"job spec {section}.{key} must be a number >= 0, got {value!r}")
    return value


def demand_from_spec(spec: Mapping[str, Any]) -> Demand:
    """The per-task demands in a submitted spec (``[worker]``/``[ps]`` tables, see
    dl2d/cli/jobspec.py); missing values take the defaults of :class:`Demand`."""
    return Demand(
        gpus_per_worker=int(_num(spec, "worker", "gpus", 1)),
        cpus_per_worker=int(_num(spec, "worker", "cpus", 1)),
        mem_gb_per_worker=float(_num(spec, "worker", "mem_gb", 0.0)),
        cpus_per_ps=int(_num(spec, "ps", "cpus", 1)),
        mem_gb_per_ps=float(_num(spec, "ps", "mem_gb", 0.0)),
    )


def node_shape(nodes: list[NodeInfo]) -> NodeShape | None:
    """The smallest usable node (per resource), or None when no node is usable."""
    usable = [n for n in nodes if n.usable]
    if not usable:
        return None
    return NodeShape(gpus=min(n.gpus for n in usable), cpus=min(n.cpus for n in usable),
                     mem_gb=min(n.mem_gb for n in usable))


def allocation_for(workers: int, ps: int, demand: Demand, shape: NodeShape) -> Allocation:
    """The allocation that holds ``workers`` workers and ``ps`` PS (rule in the module doc).
    Raises ValueError when one task does not fit on a node at all."""
    if workers < 0 or ps < 0 or workers + ps == 0:
        raise ValueError(f"allocation_for needs a non-zero size, got {workers} workers, {ps} PS")
    gpus = workers * demand.gpus_per_worker
    cpus = workers * demand.cpus_per_worker + ps * demand.cpus_per_ps
    mem = workers * demand.mem_gb_per_worker + ps * demand.mem_gb_per_ps
    if workers and demand.gpus_per_worker > shape.gpus:
        raise ValueError(f"a worker needs {demand.gpus_per_worker} GPUs; nodes have {shape.gpus}")
    if max(demand.cpus_per_worker if workers else 0, demand.cpus_per_ps if ps else 0) > shape.cpus:
        raise ValueError(f"a task needs more CPUs than a node has ({shape.cpus})")
    if max(demand.mem_gb_per_worker if workers else 0,
           demand.mem_gb_per_ps if ps else 0) > shape.mem_gb > 0:
        raise ValueError(f"a task needs more memory than a node has ({shape.mem_gb:g} GB)")
    nodes = 1
    if gpus:
        nodes = max(nodes, math.ceil(gpus / shape.gpus))
    if cpus and shape.cpus:
        nodes = max(nodes, math.ceil(cpus / shape.cpus))
    if mem and shape.mem_gb:
        nodes = max(nodes, math.ceil(mem / shape.mem_gb))
    return Allocation(nodes=nodes, gpus_per_node=math.ceil(gpus / nodes) if gpus else 0)


def fits(needed: Allocation, current: Allocation) -> bool:
    """Can ``needed`` run inside ``current`` (on at most its nodes, within its GPUs per node)?"""
    return (needed.nodes <= current.nodes and needed.gpus_per_node <= current.gpus_per_node)


def target_selection(target: Target):
    """The Slurm node selection (:class:`dl2d.sim.placement.SlurmNodeSelection`: ``--nodelist`` order,
    hostfile) of a target that carries a placement (the policy's, e.g. DLTAP), or None when it carries
    none. Nodes are numbered by first appearance, PS first, so ties in the node order keep that order.
    Raises ValueError when the placement does not list one node per task."""
    wn, pn = tuple(target.worker_nodes), tuple(target.ps_nodes)
    if not wn and not pn:
        return None
    if len(wn) != target.workers or len(pn) != target.ps:
        raise ValueError(f"the target places {len(wn)} workers / {len(pn)} PS on nodes but asks for "
                         f"{target.workers}/{target.ps}")
    from dl2d.sim.placement import slurm_node_selection

    names = list(dict.fromkeys(pn + wn))
    index = {n: i for i, n in enumerate(names)}
    return slurm_node_selection([index[n] for n in wn], [index[n] for n in pn], names)


def allocation_for_selection(selection, demand: Demand) -> Allocation:
    """The allocation that holds a node selection: its nodes, each with the GPUs of the node with the
    most workers (``--gres`` is per node, so nodes with fewer workers, or only PS, get as many)."""
    per_node: dict[str, int] = {}
    for node, role in zip(selection.hostfile, selection.roles):
        if role == "worker":
            per_node[node] = per_node.get(node, 0) + 1
    return Allocation(nodes=selection.nodes, gpus_per_node=max(per_node.values(), default=0) * demand.gpus_per_worker)


def is_elastic(spec: Mapping[str, Any]) -> bool:
    """Does the job's runtime support hot scaling? ``elastic = true/false`` in the spec decides;
    without it, jobs whose command runs ``dl2-run`` (or ``-m dl2d.elastic.launcher``) are."""
    if "elastic" in spec:
        return bool(spec["elastic"])
    command = str(spec.get("command") or "")
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return any(w == "dl2-run" or w.endswith("/dl2-run") or w == "dl2d.elastic.launcher"
               for w in words)


@dataclass(frozen=True)
class Current:
    """What is true of a job now, as far as :func:`plan_apply` needs to know."""

    slurm_state: str | None  # Slurm base state of its live Slurm job; None: no active job
    allocation: Allocation | None  # of the live Slurm job (None when not running)
    applied: tuple[int, int]  # (workers, ps) last carried out, from the record
    finished: bool = False  # the job's progress says it is done


def plan_apply(cur: Current, target: Target, needed: Allocation | None, elastic: bool) -> str:
    """The method that takes a job from ``cur`` to ``target`` (``needed`` = its allocation; None
    when the target is 0/0). The rules:

    * target 0/0: STOP when a Slurm job is active, else NOOP;
    * finished: NOOP;
    * no active Slurm job: START (resumes from the job's checkpoint, if any);
    * pending in Slurm: NOOP when its allocation is ``needed`` (the new (W, P) is written to the
      target file it reads when it starts), else START (cancel + submit at the new size);
    * running, ``needed`` is its allocation or fits in it with the same nodes: HOT when the job is
      elastic and (W, P) changed, else NOOP (a non-elastic job keeps its allocation);
    * running, ``needed`` fits on fewer of its nodes: SHRINK (``scontrol update NumNodes``; an
      elastic job is scaled down first);
    * running, ``needed`` does not fit: RESTART (checkpoint, then requeue or resubmit).

    HOT growth is decided with :func:`dl2d.elastic.control.choose_resize_method` (no free nodes
    can be added to a running allocation, so "hot" means the new roles fit in it).
    """
    want = (target.workers, target.ps)
    if want == (0, 0):
        return STOP if cur.slurm_state is not None else NOOP
    if needed is None:
        raise ValueError("plan_apply needs the allocation of a non-zero target")
    if cur.finished:
        return NOOP
    if cur.slurm_state is None:
        return START
    if cur.slurm_state != "RUNNING" or cur.allocation is None:
        return NOOP if cur.allocation in (None, needed) else START
    if not fits(needed, cur.allocation):
        return RESTART
    if needed.nodes < cur.allocation.nodes:
        return SHRINK
    if want == cur.applied or not elastic:
        return NOOP
    if min(want) < 1 or min(cur.applied) < 1:
        return RESTART  # the elastic runtime needs >= 1 worker and >= 1 PS
    from dl2d.elastic.control import JobCaps, choose_resize_method
    # Everything that fits in the allocation counts as spare slots of the held nodes.
    caps = JobCaps(hot_scaling=True, roles_per_node=1, spare_slots=sum(want))
    return HOT if choose_resize_method(caps, cur.applied, want, free_nodes=0) == "hot" else RESTART


def epochs_from_progress(progress: Mapping[str, Any] | None) -> float:
    """Cumulative epochs from a job's progress file: ``dl2-run``'s (``step``/``total_steps``/
    ``epochs``: fractional) or the demo job's / any program's (``epoch``)."""
    if not progress:
        return 0.0
    try:
        step, total, epochs = progress.get("step"), progress.get("total_steps"), progress.get("epochs")
        if isinstance(step, (int, float)) and isinstance(total, (int, float)) and total > 0 \
                and isinstance(epochs, (int, float)) and epochs > 0:
            return float(step) / (float(total) / float(epochs))
        return float(progress.get("epoch", 0) or 0)
    except (TypeError, ValueError):
        return 0.0


def progress_state(progress: Mapping[str, Any] | None) -> str:
    """The job's own word on its state (``status`` of the demo job, ``state`` of dl2-run)."""
    if not progress:
        return ""
    return str(progress.get("state") or progress.get("status") or "")


#: Slurm states of a job that ended without the job saying it is done.
FAILED_SLURM_STATES = frozenset(
    {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED",
     "CANCELLED", "COMPLETED", "SPECIAL_EXIT", "REVOKED"})


def status_from(job_id: int, record: Mapping[str, Any], slurm: SlurmJob | None,
                progress: Mapping[str, Any] | None) -> JobStatus:
    """A :class:`JobStatus` from the job's record, its (latest) Slurm job and its progress.

    FINISHED when the job says it is done; RUNNING / PENDING while its Slurm job is active;
    after that PENDING when dl2d stopped it or it checkpointed (it waits to be started again),
    FAILED when it was cancelled or its Slurm job ended any other way (exit code != 0,
    timeout, node failure, or exit 0 without saying "done")."""
    applied = record.get("applied") or {}
    w, p = int(applied.get("workers", 0)), int(applied.get("ps", 0))
    epochs = epochs_from_progress(progress)
    ref = str(record.get("slurm_job_id") or (slurm.job_id if slurm else ""))
    elastic = bool(record.get("elastic", False))
    said = progress_state(progress)
    base = dict(job_id=job_id, epochs_done=epochs, backend_ref=ref, hot_scaling=elastic)
    if said == "done" or record.get("final") == FINISHED:
        return JobStatus(state=FINISHED, workers=0, ps=0, message="done", **base)
    if record.get("cancelled"):
        return JobStatus(state=FAILED, workers=0, ps=0, message="cancelled by dl2d", **base)
    if record.get("final") == FAILED:
        return JobStatus(state=FAILED, workers=0, ps=0,
                         message=str(record.get("message") or "failed"), **base)
    if slurm is not None and slurm.active:
        if slurm.state == "RUNNING":
            return JobStatus(state=RUNNING, workers=w, ps=p, nodes=slurm.nodes, **base)
        return JobStatus(state=PENDING, workers=w, ps=p,
                         message=f"Slurm {slurm.state} ({slurm.reason or 'no reason'})", **base)
    if record.get("stopped"):
        return JobStatus(state=PENDING, workers=0, ps=0, message="stopped by dl2d", **base)
    if said == "checkpointed":
        return JobStatus(state=PENDING, workers=0, ps=0,
                         message="checkpointed; waiting to be started", **base)
    if slurm is None:
        if not record.get("slurm_job_id"):
            return JobStatus(state=PENDING, workers=0, ps=0, message="not submitted", **base)
        return JobStatus(state=PENDING, workers=0, ps=0,
                         message=f"Slurm job {ref} is gone; waiting to be started", **base)
    return JobStatus(state=FAILED, workers=0, ps=0,
                     message=f"Slurm job {slurm.job_id} ended {slurm.state}"
                             + (f" ({slurm.reason})" if slurm.reason and slurm.reason != "None"
                                else ""), **base)


def target_env(workers: int, ps: int, hostfile: Path | None = None) -> str:
    """``DL2D_WORKERS``/``DL2D_PS``, and ``DL2D_HOSTFILE`` (one node per task, PS first: for
    ``srun --distribution=arbitrary`` with ``SLURM_HOSTFILE``) when the target carries a placement."""
    text = f"DL2D_WORKERS={int(workers)}\nDL2D_PS={int(ps)}\nexport DL2D_WORKERS DL2D_PS\n"
    if hostfile is not None:
        text += f"DL2D_HOSTFILE={shlex.quote(str(hostfile))}\nexport DL2D_HOSTFILE\n"
    return text


def batch_script(job_id: int, job_dir: Path, command: str | None, script_path: Path | None) -> str:
    """The batch script of a dl2d job. It exports the job's paths, sources the target file
    (every start, so a requeued job sees its new size) and ``exec`` s the user's command through
    ``bash -c`` (bash replaces itself with a single command, so the program receives Slurm's
    checkpoint signal) or the user's script."""
    if (command is None) == (script_path is None):
        raise ValueError("batch_script needs exactly one of command or script_path")
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# dl2d job {job_id}: generated by dl2d.daemon.slurm_backend; do not edit",
        f"export DL2D_JOB_ID={int(job_id)}",
        f"export DL2D_JOB_DIR={q(str(job_dir))}",
        f"export DL2D_CHECKPOINT_DIR={q(str(job_dir / 'checkpoint'))}",
        f"export DL2D_PROGRESS_FILE={q(str(job_dir / 'progress.json'))}",
        f"export DL2D_TARGET_FILE={q(str(job_dir / 'target.json'))}",
        'mkdir -p "$DL2D_CHECKPOINT_DIR"',
        'if [ -r "$DL2D_JOB_DIR/target.env" ]; then . "$DL2D_JOB_DIR/target.env"; fi',
    ]
    if command is not None:
        lines.append(f"exec bash -c {q(command)}")
    else:
        lines.append(f"exec {q(str(script_path))}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def write_atomic(path: Path, text: str) -> None:
    """Readers see the old or the new file, never a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json_file(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when missing or (being) garbled."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


@dataclass
class SlurmBackendConfig:
    """Settings of :class:`SlurmBackend`.

    state_dir: where job directories live (must be on a file system the compute nodes share).
    restart_method: ``"resubmit"`` (default: checkpoint, let the job end, submit a new Slurm job
      at the new size — starts as soon as resources are free) or ``"requeue"`` (checkpoint, then
      ``scontrol requeue`` with the new size — keeps the Slurm job id, but Slurm holds it for
      ``cred_expire``, 120 s by default; see docs/slurm.md). Requeue can change the node count
      only, so a restart that changes the GPUs per node resubmits in either mode.
    checkpoint_signal / checkpoint_timeout_s: the signal that makes a job checkpoint and exit,
      and how long to wait for it to end before cancelling it (scancel: SIGTERM, then SIGKILL).
    node_shape: size allocations by this node instead of the smallest usable node from sinfo.
    job_name_prefix: Slurm job names are ``<prefix><dl2d id>``.
    """

    state_dir: Path
    restart_method: str = "resubmit"
    checkpoint_signal: str = "USR1"
    checkpoint_timeout_s: float = 120.0
    poll_interval_s: float = 0.25
    node_shape: NodeShape | None = None
    job_name_prefix: str = "dl2d-"
    partition: str | None = None
    time_limit_min: int | None = None  # default when the spec gives none
    workdir: str | None = None
    hot_scale_timeout_s: float = 120.0
    #: apply() reuses the job/node lists of the last observe()/apply() this long (any change
    #: made through the backend drops them), so a slot costs one squeue + one sinfo.
    cache_ttl_s: float = 5.0
    backoff: BackoffPolicy = field(default_factory=lambda: BackoffPolicy(max_attempts=4, cap=5.0))
    #: "slurm" (Slurm picks the nodes) or "target" (the target's placement as --nodelist, see PLACEMENTS)
    placement: str = "slurm"

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.restart_method not in RESTART_METHODS:
            raise ValueError(f"restart_method must be one of {', '.join(RESTART_METHODS)}, "
                             f"got {self.restart_method!r}")
        if self.checkpoint_timeout_s <= 0:
            raise ValueError("checkpoint_timeout_s must be > 0")


#: ``scaler(coordinator_address, workers, ps, timeout) -> dict``; dl2d.elastic.control.scale.
Scaler = Callable[[str, int, int, float], dict]


def _default_scaler(addr: str, workers: int, ps: int, timeout: float) -> dict:
    from dl2d.elastic.control import scale
    return scale(addr, workers=workers, ps=ps, method="hot", timeout=timeout)


class SlurmBackend:
    """:class:`~dl2d.daemon.backend.ClusterBackend` on Slurm (see the module doc).

    ``driver``: a SlurmDriver (e.g. ``make_driver("cli", env={"SLURM_CONF": ...})``); it is
    wrapped in a :class:`~dl2d.slurm.backoff.RetryingDriver` unless ``retry=False``.
    Errors: :class:`BackendError` with ``retryable=True`` when the controller stayed unreachable
    through the backoff, ``retryable=False`` for anything else.
    """

    name = "slurm"

    def __init__(self, driver: SlurmDriver, config: SlurmBackendConfig, *, retry: bool = True,
                 scaler: Scaler | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.raw_driver = driver
        self.driver = RetryingDriver(driver, config.backoff) if retry else driver
        self.config = config
        self.scaler = scaler or _default_scaler
        self.sleep = sleep
        self.clock = clock
        self._cache: dict[str, tuple[float, Any]] = {}
        (config.state_dir / "jobs").mkdir(parents=True, exist_ok=True)

    # -- files ------------------------------------------------------------------------------
    def job_dir(self, job_id: int) -> Path:
        return self.config.state_dir / "jobs" / str(int(job_id))

    def _record(self, job_id: int) -> dict[str, Any]:
        return read_json_file(self.job_dir(job_id) / "record.json") or {}

    def _save(self, job_id: int, record: dict[str, Any]) -> None:
        write_atomic(self.job_dir(job_id) / "record.json", json.dumps(record, indent=1))

    def _write_target(self, job_id: int, target: Target) -> None:
        d = self.job_dir(job_id)
        selection = self._selection(target)
        hostfile = d / "hostfile" if selection is not None else None
        if hostfile is not None:
            write_atomic(hostfile, "".join(f"{n}\n" for n in selection.hostfile))
        write_atomic(d / "target.env", target_env(target.workers, target.ps, hostfile))
        doc = {"workers": target.workers, "ps": target.ps}
        if selection is not None:
            doc.update(worker_nodes=list(target.worker_nodes), ps_nodes=list(target.ps_nodes))
        write_atomic(d / "target.json", json.dumps(doc))

    def _progress(self, job_id: int) -> dict[str, Any] | None:
        return read_json_file(self.job_dir(job_id) / "progress.json")

    def _known_ids(self) -> list[int]:
        ids = []
        for p in (self.config.state_dir / "jobs").iterdir():
            if p.name.isdigit() and (p / "record.json").exists():
                ids.append(int(p.name))
        return sorted(ids)

    # -- Slurm access -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _slurm(self, what: str, mutates: bool = True) -> Iterator[None]:
        try:
            yield
        except SlurmUnavailable as e:
            raise BackendError(f"Slurm unavailable while {what}: {e}", retryable=True) from e
        except SlurmError as e:
            raise BackendError(f"Slurm refused {what}: {e}", retryable=False) from e
        finally:
            if mutates:
                self._cache.clear()

    def _cached(self, key: str, fetch: Callable[[], Any], fresh: bool) -> Any:
        """``fetch()``, reused for ``cache_ttl_s`` unless ``fresh`` or Slurm was changed since
        (so one slot's observe + applies cost one ``squeue`` and one ``sinfo``)."""
        hit = self._cache.get(key)
        if not fresh and hit is not None and self.clock() - hit[0] < self.config.cache_ttl_s:
            return hit[1]
        value = fetch()
        self._cache[key] = (self.clock(), value)
        return value

    def _jobs(self, fresh: bool = False) -> list[SlurmJob]:
        def fetch() -> list[SlurmJob]:
            with self._slurm("listing jobs", mutates=False):
                return self.driver.jobs()
        return self._cached("jobs", fetch, fresh)

    def _live_job(self, job_id: int, record: Mapping[str, Any],
                  jobs: list[SlurmJob]) -> tuple[SlurmJob | None, SlurmJob | None]:
        """(the job's active Slurm job or None, its latest Slurm job or None). The record's
        Slurm id comes first; an active Slurm job with this job's comment and name that the
        record does not know (submitted just before a crash) is adopted."""
        by_id = {j.job_id: j for j in jobs}
        latest = by_id.get(str(record.get("slurm_job_id") or ""))
        if latest is not None and latest.active:
            return latest, latest
        name = f"{self.config.job_name_prefix}{job_id}"
        known = set(map(str, record.get("slurm_job_ids") or []))
        # Known ids that are still active are earlier runs being replaced: not adopted.
        orphans = [j for j in jobs if j.active and j.comment == f"{COMMENT_PREFIX}{job_id}"
                   and j.name == name and j.job_id not in known]
        if orphans and not record.get("cancelled"):
            adopted = max(orphans, key=lambda j: int(j.job_id) if j.job_id.isdigit() else 0)
            return adopted, adopted
        return None, latest

    # -- ClusterBackend -----------------------------------------------------------------------
    def nodes(self) -> list[NodeInfo]:
        return [node_info(n) for n in self._slurm_nodes(fresh=True)]

    def _slurm_nodes(self, fresh: bool = False) -> list[SlurmNode]:
        def fetch() -> list[SlurmNode]:
            with self._slurm("listing nodes", mutates=False):
                return self.driver.nodes()
        return self._cached("nodes", fetch, fresh)

    def observe(self) -> dict[int, JobStatus]:
        jobs = self._jobs(fresh=True)
        out: dict[int, JobStatus] = {}
        for job_id in self._known_ids():
            record = self._record(job_id)
            live, latest = self._live_job(job_id, record, jobs)
            if live is not None and str(record.get("slurm_job_id")) != live.job_id:
                record = self._adopt(job_id, record, live)
            status = status_from(job_id, record, live or latest, self._progress(job_id))
            # Remember how a job ended: Slurm forgets finished jobs after MinJobAge.
            if status.state in (FINISHED, FAILED) and not record.get("final") \
                    and not record.get("cancelled"):
                self._save(job_id, {**record, "final": status.state, "message": status.message})
            out[job_id] = status
        return out

    def apply(self, job: JobRequest, target: Target) -> ApplyResult:
        if target.workers < 0 or target.ps < 0:
            raise BackendError(f"job {job.job_id}: negative target {target}")
        spec = dict(job.spec or {})
        record = self._record(job.job_id)
        if record.get("cancelled"):
            raise BackendError(f"job {job.job_id} was cancelled; it cannot be started again")
        elastic = is_elastic(spec)
        # First from the lists of this slot's observe() (cheap); a decision to change anything
        # is re-made on fresh lists, so only NOOPs ever rest on a cached view.
        for fresh in (False, True):
            live, _ = self._live_job(job.job_id, record, self._jobs(fresh=fresh))
            if live is not None and str(record.get("slurm_job_id")) != live.job_id:
                record = self._adopt(job.job_id, record, live)
            needed = None
            if (target.workers, target.ps) != (0, 0):
                try:
                    demand = demand_from_spec(spec)
                    needed = allocation_for(target.workers, target.ps, demand, self._shape(fresh=fresh))
                    selection = self._selection(target)
                except ValueError as e:
                    raise BackendError(f"job {job.job_id}: {e}") from e
                if selection is not None:
                    known = {n.name for n in self._slurm_nodes(fresh=fresh)}
                    unknown = [n for n in selection.nodelist if n not in known]
                    if unknown:
                        raise BackendError(f"job {job.job_id}: the target places tasks on nodes Slurm does "
                                           f"not know: {', '.join(unknown)}")
                    needed = allocation_for_selection(selection, demand)
            progress = self._progress(job.job_id)
            applied = record.get("applied") or {}
            cur = Current(
                slurm_state=live.state if live is not None else None,
                allocation=self._allocation(live, record),
                applied=(int(applied.get("workers", 0)), int(applied.get("ps", 0))),
                finished=progress_state(progress) == "done" or record.get("final") == FINISHED,
            )
            failed = live is None and record.get("final") == FAILED
            method = plan_apply(cur, target, needed, elastic)
            if method == NOOP and not failed:
                break
        if failed and (target.workers, target.ps) != (0, 0):
            raise BackendError(f"job {job.job_id} failed ({record.get('message')}); "
                               "it is not restarted", retryable=False)
        log.info("job %s: %s -> %s/%s: %s", job.job_id, cur, target.workers, target.ps, method)
        record = {**record, "job_id": job.job_id, "elastic": elastic,
                  "target": {"workers": target.workers, "ps": target.ps}}
        if method == NOOP:
            if needed is not None and live is not None:
                self._write_target(job.job_id, target)
                record["applied"] = record["target"]
            self._save(job.job_id, record)
            return ApplyResult(job.job_id, NOOP, str(record.get("slurm_job_id") or ""))
        assert live is not None or method == START
        if method == STOP:
            self._save(job.job_id, record)
            self._checkpoint_and_end(live)
            record.update(stopped=True, applied={"workers": 0, "ps": 0})
            self._save(job.job_id, record)
            return ApplyResult(job.job_id, STOP, live.job_id)
        assert needed is not None
        record["stopped"] = False
        if method == START:
            if live is not None:  # pending at another size: replace it
                with self._slurm(f"cancelling pending job {live.job_id}"):
                    self.driver.cancel(live.job_id)
                self._wait_ended(live.job_id, self.config.checkpoint_timeout_s)
            return self._submit(job, record, target, needed)
        if method == HOT:
            if self._hot_scale(job.job_id, target):
                record["applied"] = record["target"]
                self._write_target(job.job_id, target)
                self._save(job.job_id, record)
                return ApplyResult(job.job_id, HOT, live.job_id)
            method = RESTART  # the job could not be scaled hot: relaunch it
        if method == SHRINK:
            if elastic and not self._hot_scale(job.job_id, target):
                method = RESTART
            else:
                self._write_target(job.job_id, target)
                self._save(job.job_id, record)
                with self._slurm(f"shrinking job {live.job_id} to {needed.nodes} nodes"):
                    self.driver.shrink(live.job_id, needed.nodes)
                record["applied"] = record["target"]
                record["allocation"] = {"nodes": needed.nodes, "gpus_per_node": live.gpus_per_node}
                self._save(job.job_id, record)
                return ApplyResult(job.job_id, SHRINK, live.job_id)
        # RESTART: checkpoint, then requeue at the new size or submit anew.
        self._write_target(job.job_id, target)
        self._save(job.job_id, record)
        self._checkpoint_and_end(live)
        if progress_state(self._progress(job.job_id)) == "done":
            record["applied"] = {"workers": 0, "ps": 0}
            self._save(job.job_id, record)
            return ApplyResult(job.job_id, NOOP, live.job_id)  # it finished meanwhile
        # requeue can change a pending job's node count but not its GPUs per node.
        if self.config.restart_method == "requeue" and needed.gpus_per_node == live.gpus_per_node:
            with self._slurm(f"requeueing job {live.job_id} at {needed.nodes} nodes"):
                self.driver.requeue(live.job_id, num_nodes=needed.nodes)
            record["applied"] = record["target"]
            record["allocation"] = {"nodes": needed.nodes, "gpus_per_node": live.gpus_per_node}
            self._save(job.job_id, record)
            return ApplyResult(job.job_id, RESTART, live.job_id)
        result = self._submit(job, record, target, needed)
        return ApplyResult(job.job_id, RESTART, result.backend_ref)

    def cancel(self, job_id: int) -> None:
        record = self._record(job_id)
        if not record:
            return
        record["cancelled"] = True
        self._save(job_id, record)
        live, _ = self._live_job(job_id, {**record, "cancelled": False}, self._jobs(fresh=True))
        if live is not None:
            with self._slurm(f"cancelling job {live.job_id}"):
                self.driver.cancel(live.job_id)

    def drain(self, node: str, reason: str) -> None:
        with self._slurm(f"draining {node}"):
            self.driver.drain_node(node, reason or "dl2d")

    def resume(self, node: str) -> None:
        with self._slurm(f"resuming {node}"):
            self.driver.resume_node(node)

    def end_slot(self, seconds: float) -> None:
        return None  # real time passes by itself

    # -- helpers ------------------------------------------------------------------------------
    def _selection(self, target: Target):
        """The target's node selection when ``placement = "target"`` (else None: Slurm picks)."""
        return target_selection(target) if self.config.placement == "target" else None

    def _shape(self, fresh: bool = False) -> NodeShape:
        if self.config.node_shape is not None:
            return self.config.node_shape
        shape = node_shape([node_info(n) for n in self._slurm_nodes(fresh=fresh)])
        if shape is None:
            raise BackendError("no usable Slurm node (all down or drained)", retryable=True)
        return shape

    @staticmethod
    def _allocation(live: SlurmJob | None, record: Mapping[str, Any]) -> Allocation | None:
        """A running job's allocation as Slurm reports it; a pending one's as we requested
        it (Slurm 22.05 keeps showing a requeued job's old node count after ``scontrol update
        NumNodes`` until it starts, at the new count)."""
        if live is None:
            return None
        asked = record.get("allocation") or {}
        if live.state != "RUNNING" and asked.get("nodes"):
            return Allocation(int(asked["nodes"]), int(asked.get("gpus_per_node", 0)))
        return Allocation(live.num_nodes, live.gpus_per_node) if live.num_nodes else None

    def _adopt(self, job_id: int, record: dict[str, Any], live: SlurmJob) -> dict[str, Any]:
        log.warning("job %s: adopting Slurm job %s (not in the record)", job_id, live.job_id)
        ids = [str(i) for i in record.get("slurm_job_ids") or []]
        record = {**record, "slurm_job_id": live.job_id, "stopped": False, "submitting": False,
                  "slurm_job_ids": ids + ([live.job_id] if live.job_id not in ids else [])}
        if "target" in record and not record.get("applied"):
            record["applied"] = record["target"]
        self._save(job_id, record)
        return record

    def _submit(self, job: JobRequest, record: dict[str, Any], target: Target,
                needed: Allocation) -> ApplyResult:
        spec = dict(job.spec or {})
        d = self.job_dir(job.job_id)
        (d / "checkpoint").mkdir(parents=True, exist_ok=True)
        command = spec.get("command")
        script_path = None
        if command is None:
            if not spec.get("script"):
                raise BackendError(f"job {job.job_id}: its spec has no command or script")
            script_path = d / "user-script"
            write_atomic(script_path, str(spec["script"]))
            script_path.chmod(0o755)
        self._write_target(job.job_id, target)
        selection = self._selection(target)  # checked by apply()
        limit = spec.get("time_limit_min", self.config.time_limit_min)
        js = JobSpec(
            name=f"{self.config.job_name_prefix}{job.job_id}",
            script=batch_script(job.job_id, d, command, script_path),
            nodes=needed.nodes,
            gpus_per_node=needed.gpus_per_node,
            time_limit_min=int(limit) if limit is not None else None,
            output=str(d / "slurm-%j.out"),
            workdir=self.config.workdir,
            partition=spec.get("partition", self.config.partition),
            checkpoint_signal=self.config.checkpoint_signal,
            requeue=True,
            nodelist=selection.nodelist if selection is not None else (),
            dl2d_job_id=str(job.job_id),
        )
        # Record the intent first: if the daemon dies after sbatch, the next backend adopts
        # the Slurm job by its comment instead of submitting it twice.
        record = {**record, "submitting": True}
        self._save(job.job_id, record)
        with self._slurm(f"submitting job {job.job_id}"):
            slurm_id = self.driver.submit(js)
        ids = [str(i) for i in record.get("slurm_job_ids") or []]
        record.update(slurm_job_id=slurm_id, slurm_job_ids=ids + [slurm_id], submitting=False,
                      applied=record["target"], final=None, message="",
                      allocation={"nodes": needed.nodes, "gpus_per_node": needed.gpus_per_node},
                      nodelist=list(js.nodelist))
        self._save(job.job_id, record)
        return ApplyResult(job.job_id, START, slurm_id)

    def _hot_scale(self, job_id: int, target: Target) -> bool:
        """Scale an elastic job through its coordinator; False when that is not possible."""
        from dl2d.elastic.control import read_coordinator_file
        try:
            addr = read_coordinator_file(str(self.job_dir(job_id) / "checkpoint"))
            self.scaler(addr, target.workers, target.ps, self.config.hot_scale_timeout_s)
            return True
        except Exception as e:  # noqa: BLE001 - any failure means "relaunch instead"
            log.warning("job %s: hot scaling to %s/%s failed (%s); relaunching from checkpoint",
                        job_id, target.workers, target.ps, e)
            return False

    def _wait_ended(self, slurm_id: str, timeout: float) -> bool:
        deadline = self.clock() + timeout
        while True:
            job = next((j for j in self._jobs(fresh=True) if j.job_id == slurm_id), None)
            if job is None or not job.active:
                return True
            if self.clock() >= deadline:
                return False
            self.sleep(self.config.poll_interval_s)

    def _checkpoint_and_end(self, live: SlurmJob) -> None:
        """Signal the job to checkpoint and exit; cancel it when it does not end in time
        (scancel sends SIGTERM first, which the job runtimes also treat as "checkpoint")."""
        if live.state == "RUNNING":
            try:
                with self._slurm(f"signalling job {live.job_id}"):
                    self.driver.signal(live.job_id, self.config.checkpoint_signal)
            except BackendError as e:
                # It may have ended since it was listed (e.g. on its own time-limit signal).
                if e.retryable or not self._wait_ended(live.job_id, 0):
                    raise
                return
            if self._wait_ended(live.job_id, self.config.checkpoint_timeout_s):
                return
            log.warning("Slurm job %s did not end %gs after %s; cancelling it", live.job_id,
                        self.config.checkpoint_timeout_s, self.config.checkpoint_signal)
        with self._slurm(f"cancelling job {live.job_id}"):
            self.driver.cancel(live.job_id)
        if not self._wait_ended(live.job_id, self.config.checkpoint_timeout_s):
            raise BackendError(f"Slurm job {live.job_id} did not end after scancel", retryable=True)


def node_info(n: SlurmNode) -> NodeInfo:
    reason = n.reason or ("" if n.usable else ",".join((n.state,) + n.flags))
    return NodeInfo(name=n.name, gpus=n.gpus, cpus=n.cpus, mem_gb=n.mem_mb / 1024.0,
                    usable=n.usable, reason=reason)


# ---------------------------------------------------------------------------------------------
# From the daemon's config file
# ---------------------------------------------------------------------------------------------

#: Keys of the ``[slurm]`` table of dl2d.toml besides the SlurmBackendConfig fields.
DRIVER_KEYS = ("driver", "slurm_conf", "command_timeout_s")
_CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "state_dir": (str,), "restart_method": (str,), "checkpoint_signal": (str,),
    "checkpoint_timeout_s": (int, float), "poll_interval_s": (int, float),
    "job_name_prefix": (str,), "partition": (str,), "time_limit_min": (int,), "workdir": (str,),
    "hot_scale_timeout_s": (int, float), "cache_ttl_s": (int, float),
    "node_shape": (dict,), "backoff": (dict,), "placement": (str,),
}
_BACKOFF_KEYS = ("base", "factor", "cap", "jitter", "max_attempts", "max_elapsed")


def settings_from_table(table: Mapping[str, Any], default_state_dir: str | Path
                        ) -> tuple[str, dict[str, Any], SlurmBackendConfig]:
    """The ``[slurm]`` table of dl2d.toml -> (driver kind, driver options, backend config).
    Pure; raises ValueError naming the key (``slurm.<key>: ...``). Keys: ``driver`` (cli |
    pyslurm), ``slurm_conf`` (the CLI driver's ``SLURM_CONF``), ``command_timeout_s``, every
    field of :class:`SlurmBackendConfig` (``state_dir`` defaults to ``<state_dir>/slurm``;
    ``node_shape`` and ``backoff`` are tables)."""
    from dataclasses import fields as dc_fields

    known = set(DRIVER_KEYS) | set(_CONFIG_TYPES)
    for key in table:
        if key not in known:
            raise ValueError(f"slurm.{key}: unknown key; known keys: {', '.join(sorted(known))}")
    for key, value in table.items():
        types = _CONFIG_TYPES.get(key, {"driver": (str,), "slurm_conf": (str,),
                                        "command_timeout_s": (int, float)}.get(key))
        if isinstance(value, bool) or not isinstance(value, types):
            raise ValueError(f"slurm.{key}: wrong type {type(value).__name__} ({value!r})")
    kind = table.get("driver", "cli")
    from dl2d.slurm.driver import DRIVERS
    if kind not in DRIVERS:
        raise ValueError(f"slurm.driver: must be one of {', '.join(DRIVERS)}, got {kind!r}")
    options: dict[str, Any] = {}
    if kind == "cli":
        if "command_timeout_s" in table:
            if table["command_timeout_s"] <= 0:
                raise ValueError("slurm.command_timeout_s: must be > 0")
            options["timeout"] = float(table["command_timeout_s"])
        if table.get("slurm_conf"):
            options["env"] = {"SLURM_CONF": table["slurm_conf"]}
    elif "slurm_conf" in table or "command_timeout_s" in table:
        raise ValueError("slurm.slurm_conf / slurm.command_timeout_s: only for driver = \"cli\" "
                         "(pyslurm reads SLURM_CONF from the environment)")
    kw: dict[str, Any] = {k: v for k, v in table.items() if k in _CONFIG_TYPES}
    kw["state_dir"] = Path(kw.get("state_dir") or Path(default_state_dir) / "slurm")
    if "node_shape" in kw:
        ns = kw["node_shape"]
        if set(ns) != {"gpus", "cpus", "mem_gb"}:
            raise ValueError("slurm.node_shape: needs exactly gpus, cpus and mem_gb")
        kw["node_shape"] = NodeShape(int(ns["gpus"]), int(ns["cpus"]), float(ns["mem_gb"]))
    if "backoff" in kw:
        bad = set(kw["backoff"]) - set(_BACKOFF_KEYS)
        if bad:
            raise ValueError(f"slurm.backoff.{sorted(bad)[0]}: unknown key; known: {', '.join(_BACKOFF_KEYS)}")
        try:
            kw["backoff"] = BackoffPolicy(**kw["backoff"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"slurm.backoff: {e}") from None
    for key in ("checkpoint_timeout_s", "poll_interval_s", "hot_scale_timeout_s"):
        if key in kw and kw[key] <= 0:
            raise ValueError(f"slurm.{key}: must be > 0, got {kw[key]}")
    assert {f.name for f in dc_fields(SlurmBackendConfig)} >= set(kw)
    try:
        config = SlurmBackendConfig(**kw)
    except ValueError as e:
        raise ValueError(f"slurm: {e}") from None
    return kind, options, config


def backend_from_table(table: Mapping[str, Any], default_state_dir: str | Path) -> SlurmBackend:
    """The daemon's SlurmBackend from the ``[slurm]`` table (see :func:`settings_from_table`)."""
    from dl2d.slurm.driver import make_driver

    kind, options, config = settings_from_table(table, default_state_dir)
    return SlurmBackend(make_driver(kind, **options), config)
