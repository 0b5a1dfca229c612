"""An in-memory Slurm: the :class:`~dl2d.slurm.driver.SlurmDriver` protocol without a controller.

For tests and trials of code that drives Slurm (the daemon's Slurm backend): it behaves like the
Slurm 22.05 the real drivers were checked on, where the backend depends on it, and is explicit about
the rest:

* jobs wait PENDING until :meth:`InMemorySlurm.run` starts them all (on ``node1..nodeN``, in order;
  ``start_time`` = the clock then): the test decides when the scheduler runs; a job keeps the CPUs and
  memory per node it asked for (``cpus_per_node``, ``mem_mb_per_node``) and its time limit, and
  :meth:`InMemorySlurm.end` ends it (``end_time`` = the clock, Slurm's EndTime);
* a signalled job "checkpoints" and completes at once (unless ``ignore_signals``), and calls
  :meth:`on_checkpoint`, which a test may replace (e.g. to write the job's progress file);
* a requeued job keeps showing its old node count until it runs again, at the requeued count (as
  22.05 does after ``scontrol update NumNodes``);
* ``down = True`` makes every call but :meth:`ping` raise :class:`SlurmUnavailable`;
* a job runs as ``JobSpec.user`` (``SlurmJob.user``; the driver's own user where it names none); its account, QOS and
  environment are kept in ``specs``, as submitted;
* every call that changes something is appended to ``calls`` (``("submit", id, nodes, gpus)``,
  ``("shrink", id, n)``, ``("signal", id, sig)``, ``("requeue", id, n)``, ``("cancel", id)``,
  ``("drain", node, reason)``, ``("resume", node)``), so tests can check what reached "Slurm".

Resources are not accounted: any number of jobs run at once.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

from dl2d.slurm.driver import JobSpec, SlurmJob, SlurmNode, SlurmUnavailable, process_user


class InMemorySlurm:
    """A :class:`~dl2d.slurm.driver.SlurmDriver` held in memory (see the module doc). ``nodes`` nodes
    with ``gpus`` GPUs, 16 CPUs and 16000 MB each (the local test Slurm's, scripts/slurm-localhost.sh);
    Slurm job ids count from 101."""

    def __init__(self, nodes: int = 4, gpus: int = 4, *, cpus: int = 16, mem_mb: int = 16000,
                 clock: Callable[[], float] = time.time) -> None:
        self.node_list = [SlurmNode(f"node{i}", "idle", cpus=cpus, gpus=gpus, mem_mb=mem_mb)
                          for i in range(1, nodes + 1)]
        self.slurm_jobs: dict[str, SlurmJob] = {}
        self.specs: dict[str, JobSpec] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.next_id = 100
        self.down = False
        self.ignore_signals = False
        self.cancel_ends_job = True  # False: a cancelled job lingers (a node that takes its time to kill it)
        self.requeued_nodes: dict[str, int] = {}
        self.clock = clock
        #: what ``scontrol show config`` would say (dl2d.slurm.rights), and users' AdminLevels (sacctmgr)
        self.config = {"SlurmUser": "root(0)", "AccountingStorageType": "accounting_storage/none"}
        self.admin_levels: dict[str, str] = {}

    # -- for tests ------------------------------------------------------------------------------
    def set_job(self, job_id: str, **fields: Any) -> None:
        """Change a job's fields (e.g. ``state="FAILED"``), as Slurm would on its own."""
        self.slurm_jobs[job_id] = replace(self.slurm_jobs[job_id], **fields)

    def run(self) -> None:
        """The scheduler's turn: every pending job starts, on the first nodes."""
        for j in list(self.slurm_jobs.values()):
            if j.state == "PENDING":
                n = self.requeued_nodes.pop(j.job_id, j.num_nodes)
                nodes = tuple(f"node{i}" for i in range(1, n + 1))
                self.set_job(j.job_id, state="RUNNING", nodes=nodes, num_nodes=n, batch_host=nodes[0],
                             start_time=int(self.clock()))

    def end(self, job_id: str, state: str = "COMPLETED") -> None:
        """The job ends on its own now (``end_time`` = the clock), as Slurm records it."""
        self.set_job(job_id, state=state, end_time=int(self.clock()))

    def on_checkpoint(self, job_id: str) -> None:
        """Called when a signalled job "checkpoints" (replace it to write the job's files)."""

    def _check(self) -> None:
        if self.down:
            raise SlurmUnavailable("controller down", command=("squeue",))

    # -- SlurmDriver ----------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        self._check()
        self.next_id += 1
        jid = str(self.next_id)
        self.calls.append(("submit", jid, spec.nodes, spec.gpus_per_node))
        self.specs[jid] = spec
        self.slurm_jobs[jid] = SlurmJob(job_id=jid, name=spec.name, state="PENDING",
                                        num_nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
                                        cpus_per_node=spec.cpus_per_node or 1,
                                        mem_mb_per_node=spec.mem_mb_per_node or 0,
                                        time_limit_min=spec.time_limit_min,
                                        comment=spec.comment or "", submit_time=int(self.clock()),
                                        user=spec.user or process_user().name)
        return jid

    def jobs(self) -> list[SlurmJob]:
        self._check()
        return list(self.slurm_jobs.values())

    def nodes(self) -> list[SlurmNode]:
        self._check()
        return list(self.node_list)

    def shrink(self, job_id: str, num_nodes: int) -> None:
        self._check()
        self.calls.append(("shrink", job_id, num_nodes))
        j = self.slurm_jobs[job_id]
        self.set_job(job_id, num_nodes=num_nodes, nodes=j.nodes[:num_nodes])

    def signal(self, job_id: str, sig: str) -> None:
        self._check()
        self.calls.append(("signal", job_id, sig))
        if sig in ("KILL", "SIGKILL", "9"):  # no job can ignore it; a node may take its time to carry it out
            if self.slurm_jobs[job_id].active and self.cancel_ends_job:
                self.set_job(job_id, state="CANCELLED", end_time=int(self.clock()))
        elif not self.ignore_signals:
            self.set_job(job_id, state="COMPLETED", end_time=int(self.clock()))
            self.on_checkpoint(job_id)

    def requeue(self, job_id: str, num_nodes: int | None = None) -> None:
        self._check()
        self.calls.append(("requeue", job_id, num_nodes))
        if num_nodes:
            self.requeued_nodes[job_id] = num_nodes
        self.set_job(job_id, state="PENDING", nodes=(), restarts=self.slurm_jobs[job_id].restarts + 1)

    def cancel(self, job_id: str) -> None:
        self._check()
        self.calls.append(("cancel", job_id))
        if self.slurm_jobs[job_id].active and self.cancel_ends_job:
            self.set_job(job_id, state="CANCELLED", end_time=int(self.clock()))

    def drain_node(self, node: str, reason: str) -> None:
        self._check()
        self.calls.append(("drain", node, reason))
        self.node_list = [replace(n, flags=("DRAIN",), reason=reason) if n.name == node else n
                          for n in self.node_list]

    def resume_node(self, node: str) -> None:
        self._check()
        self.calls.append(("resume", node))
        self.node_list = [replace(n, flags=(), reason="") if n.name == node else n
                          for n in self.node_list]

    def ping(self) -> bool:
        return not self.down

    # -- read-only probes of dl2d.slurm.rights ---------------------------------------------------
    def show_config(self) -> dict[str, str]:
        self._check()
        return dict(self.config)

    def admin_level(self, user: str) -> str | None:
        self._check()
        return self.admin_levels.get(user)
