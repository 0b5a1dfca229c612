"""The ``pyslurm`` driver: the :class:`~dl2d.slurm.driver.SlurmDriver` protocol over pyslurm's
object API (pyslurm 25.11 for Slurm 25.11: ``pyslurm.Job``, ``pyslurm.Jobs.load()``,
``pyslurm.Nodes.load()``, ``pyslurm.JobSubmitDescription``, ``pyslurm.Node.modify``).

Optional: pyslurm is compiled against one Slurm release and PyPI only has builds for Slurm
25.11 (and very old 17.x/18.x), so it cannot be used with Debian bookworm's Slurm 22.05 — use
the CLI driver there. pyslurm is imported lazily, when the driver is created, and a missing or
unusable pyslurm gives a :class:`PyslurmUnavailableError` that says what to install.

Not exercised against a live Slurm 25.11 in this repository's tests (CI runs Slurm 22.05);
attribute access is defensive (``getattr`` with fallbacks) where pyslurm's names changed
between releases.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Mapping

from dl2d.slurm.driver import (
    JobSpec,
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmUnavailable,
    UnixUser,
    job_environment,
    lookup_user,
    process_user,
    wait_for_state,
)
from dl2d.slurm.parsing import expand_hostlist, gpu_count, is_unavailable_message, state_list

REQUIREMENT = ("the 'pyslurm' Slurm driver needs Slurm 25.11 and its Python binding: "
               "`pip install pyslurm` (25.11.x, built against the installed libslurm). "
               "With other Slurm releases (e.g. Debian's 22.05) use the 'cli' driver.")


class PyslurmUnavailableError(SlurmError):
    """pyslurm is not installed or does not load (wrong Slurm version)."""


def import_pyslurm(module: str = "pyslurm") -> Any:
    """Import pyslurm or raise :class:`PyslurmUnavailableError` naming the requirement."""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:  # also libslurm.so mismatches, which surface as ImportError
        raise PyslurmUnavailableError(f"{REQUIREMENT} (import failed: {e})") from e
    for name in ("Job", "Jobs", "Nodes", "Node", "JobSubmitDescription"):
        if not hasattr(mod, name):
            raise PyslurmUnavailableError(
                f"{REQUIREMENT} (the installed pyslurm {getattr(mod, '__version__', '?')} "
                f"has no {name}; it predates the 23.x object API)")
    return mod


def _count(gres: Any) -> int:
    """GPUs in pyslurm's GRES value: a dict like ``{"gpu": 4}``/``{"gpu:a100": 2}`` or a string."""
    if isinstance(gres, dict):
        return sum(int(v) for k, v in gres.items()
                   if str(k).split(":")[0] in ("gpu", "gres/gpu") and str(v).isdigit())
    return gpu_count(str(gres or ""))


def _first(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return default


def submit_description_kwargs(spec: JobSpec, user: UnixUser | None = None,
                              env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``JobSubmitDescription`` keyword arguments for a :class:`JobSpec` (pure, testable). ``env``: the job's
    whole environment (pyslurm adds this process's ``SLURM_*`` and nothing else of it; default: the base
    environment of ``user`` with the spec's variables); ``user``: the account the job runs as, given as its
    user and group ids when it is another user than this process's (pyslurm's ``--uid``/``--gid``; root only)."""
    script = spec.script if spec.script is not None else f"#!/bin/sh\n{spec.command}\n"
    if env is None:
        env = job_environment(user or process_user(), spec.env)
    kw: dict[str, Any] = {
        "name": spec.name,
        "nodes": spec.nodes,
        "script": script,
        "is_requeueable": spec.requeue,
        # A dict: exactly these variables (never "ALL": this process's environment, the daemon's secrets).
        "environment": dict(env),
    }
    if user is not None:
        kw.update(user_id=user.uid, group_id=user.gid)
        if not spec.workdir:  # pyslurm's default is this process's working directory
            kw["working_directory"] = user.home
    optional = {
        "ntasks_per_node": spec.ntasks_per_node,
        "gres_per_node": f"gpu:{spec.gpus_per_node}" if spec.gpus_per_node else None,
        "cpus_per_task": spec.cpus_per_task,
        "min_cpus_per_node": spec.cpus_per_node,
        "memory_per_node": spec.mem_mb_per_node,  # MB, as sbatch --mem
        "time_limit": spec.time_limit_min,
        "standard_output": spec.output,
        "working_directory": spec.workdir,
        "partitions": spec.partition,
        "account": spec.account,
        "qos": spec.qos,
        "signal": (f"B:{spec.checkpoint_signal}@{spec.checkpoint_signal_secs}"
                   if spec.checkpoint_signal else None),
        "required_nodes": ",".join(spec.nodelist) or None,
        "excluded_nodes": ",".join(spec.exclude) or None,
        "comment": spec.comment,
    }
    kw.update({k: v for k, v in optional.items() if v is not None})
    return kw


def job_from_pyslurm(job: Any) -> SlurmJob:
    node_list = str(_first(job, "nodes", "allocated_nodes", default="") or "")
    states = state_list(_first(job, "state", default="UNKNOWN"))
    return SlurmJob(
        job_id=str(job.id),
        name=str(_first(job, "name", default="")),
        state=states[0] if states else "UNKNOWN",
        reason=str(_first(job, "state_reason", default="") or ""),
        node_list=node_list,
        nodes=expand_hostlist(node_list),
        num_nodes=int(_first(job, "num_nodes", default=0) or 0),
        gpus_per_node=_count(_first(job, "gres_per_node", default="")),
        comment=str(_first(job, "comment", default="") or ""),
        restarts=int(_first(job, "requeue_count", default=0) or 0),
        submit_time=_first(job, "submit_time_raw"),
        start_time=_first(job, "start_time_raw"),
        time_limit_min=_first(job, "time_limit_raw"),
        batch_host=str(_first(job, "batch_host", default="") or ""),
        cpus_per_node=_int(_first(job, "min_cpus_per_node")),
        mem_mb_per_node=_int(_first(job, "memory_per_node")),
        end_time=_int(_first(job, "end_time_raw", "end_time")) or None,
        user=str(_first(job, "user_name", default="") or ""),
    )


def _int(value: Any) -> int:
    """A pyslurm number (int, numeric string or None/unset) as an int; 0 when unset or not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def node_from_pyslurm(node: Any) -> SlurmNode:
    words = state_list(_first(node, "state", default="UNKNOWN"))
    words += [w for w in state_list(_first(node, "next_state", default=None)) if w == "DRAIN"]
    parts = _first(node, "partitions", default=()) or ()
    return SlurmNode(
        name=str(node.name),
        state=words[0].lower() if words else "unknown",
        flags=tuple(dict.fromkeys(words[1:])),
        cpus=int(_first(node, "total_cpus", "cpus", default=0) or 0),
        cpus_alloc=int(_first(node, "allocated_cpus", "alloc_cpus", default=0) or 0),
        gpus=_count(_first(node, "configured_gres", "gres", default="")),
        gpus_alloc=_count(_first(node, "allocated_gres", "gres_used", default="")),
        reason=str(_first(node, "reason", default="") or ""),
        partitions=tuple(parts) if not isinstance(parts, str) else tuple(parts.split(",")),
    )


class PyslurmDriver:
    """:class:`~dl2d.slurm.driver.SlurmDriver` over pyslurm (Slurm 25.11).

    ``module``: the module to import (tests pass a stand-in)."""

    def __init__(self, *, module: str = "pyslurm", requeue_settle_s: float = 10.0) -> None:
        self.ps = import_pyslurm(module)
        self.requeue_settle_s = requeue_settle_s

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a pyslurm call, mapping its RPCError to SlurmError / SlurmUnavailable."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # pyslurm raises RPCError (and ValueError for bad input)
            if isinstance(e, SlurmError):
                raise
            msg = str(e)
            cls = SlurmUnavailable if is_unavailable_message(msg) else SlurmError
            raise cls(f"pyslurm {what} failed", command=f"pyslurm {what}",
                      stderr=msg) from e

    def submit(self, spec: JobSpec) -> str:
        me = process_user()
        user = lookup_user(spec.user) if spec.user is not None else me
        if user.uid != me.uid and os.geteuid() != 0:
            raise SlurmError(f"cannot submit a job as user {user.name}: only root may submit for another user "
                             f"(this process is uid {os.geteuid()}); run dl2d as root, or set [slurm] "
                             'run_jobs_as = "daemon" on a single-user cluster', command="pyslurm submit")
        slurm_conf = os.environ.get("SLURM_CONF")
        try:
            env = job_environment(user, spec.env, slurm_conf=slurm_conf)
        except ValueError as e:
            raise SlurmError(f"job {spec.name}: {e}", command="pyslurm submit") from None
        kwargs = submit_description_kwargs(spec, user if user.uid != me.uid else None, env)
        desc = self.ps.JobSubmitDescription(**kwargs)
        return str(self._call("submit", desc.submit))

    def jobs(self) -> list[SlurmJob]:
        loaded = self._call("Jobs.load", self.ps.Jobs.load)
        return [job_from_pyslurm(j) for j in loaded.values()]

    def nodes(self) -> list[SlurmNode]:
        loaded = self._call("Nodes.load", self.ps.Nodes.load)
        return [node_from_pyslurm(n) for n in loaded.values()]

    def _modify(self, job_id: str, **changes: Any) -> None:
        desc = self.ps.JobSubmitDescription(**changes)
        self._call("Job.modify", self.ps.Job(int(job_id)).modify, desc)

    def shrink(self, job_id: str, num_nodes: int) -> None:
        if num_nodes < 1:
            raise ValueError(f"cannot shrink job {job_id} to {num_nodes} nodes; cancel it instead")
        self._modify(job_id, nodes=num_nodes)

    def signal(self, job_id: str, sig: str) -> None:
        name = sig if str(sig).isdigit() or str(sig).startswith("SIG") else f"SIG{sig}"
        sig_value = int(name) if str(name).isdigit() else name
        self._call("Job.send_signal", self.ps.Job(int(job_id)).send_signal, sig_value, steps="all")

    def requeue(self, job_id: str, num_nodes: int | None = None) -> None:
        self._call("Job.requeue", self.ps.Job(int(job_id)).requeue)
        if num_nodes:
            wait_for_state(self, job_id, "PENDING", self.requeue_settle_s)
            # See CliDriver.requeue: a pending job's node range is pinned to one value.
            self._modify(job_id, nodes={"min": num_nodes, "max": num_nodes})

    def cancel(self, job_id: str) -> None:
        self._call("Job.cancel", self.ps.Job(int(job_id)).cancel)

    def drain_node(self, node: str, reason: str) -> None:
        self._call("Node.modify", self.ps.Node(node).modify,
                   self.ps.Node(state="DRAIN", reason=reason or "dl2d"))

    def resume_node(self, node: str) -> None:
        self._call("Node.modify", self.ps.Node(node).modify, self.ps.Node(state="RESUME"))

    def ping(self) -> bool:
        try:
            self._call("Nodes.load", self.ps.Nodes.load)
        except SlurmError:
            return False
        return True
