"""Spawners (how the coordinator starts new roles) and an in-process cluster.

* :class:`ThreadSpawner` runs PSs and workers as objects in this process, still
  talking over real TCP sockets (used by the fast tests).
* :class:`ProcessSpawner` starts ``python -m dl2d.elastic.role`` processes
  locally (``dl2-run --local``) or through ``srun`` on the allocated nodes.

Both hand the roles the job's member key (``member_key``, set by whoever made
the coordinator): a thread gets it as an argument, a process in its environment
(``$DL2D_ELASTIC_MEMBER_KEY``; ``ps`` shows command lines, not environments).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

from .auth import MEMBER_KEY_ENV, SECRET_FILE_ENV
from .coordinator import Coordinator
from .model import TrainConfig
from .ps import ParameterServer
from .worker import Worker


class ThreadSpawner:
    def __init__(self):
        self.coord_addr: str | None = None
        self.member_key: bytes | None = None
        self.ps: list[ParameterServer] = []
        self.workers: list[Worker] = []

    def spawn(self, role: str, n: int) -> None:
        for _ in range(n):
            if role == "ps":
                self.ps.append(ParameterServer(self.coord_addr, self.member_key).start())
            else:
                self.workers.append(Worker(self.coord_addr, self.member_key).start())

    def kill_all(self) -> None:
        for r in self.ps + self.workers:
            r.stop()
        self.ps, self.workers = [], []


BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def role_env(threads: int | None = 1, base: dict | None = None, member_key: bytes | None = None) -> dict:
    """Environment of a role process: ``threads`` BLAS/OpenMP threads unless the caller set them; the
    job's member key (``$DL2D_ELASTIC_MEMBER_KEY``), and not the name of the job's secret file (a role
    needs the member key only).

    Several roles share a node's cores; with one BLAS thread pool per core in
    every role the pools spin against each other (a 100k-parameter step took
    ~60 ms instead of ~0.5 ms on a loaded 2-core host).
    """
    env = dict(os.environ if base is None else base)
    env.pop(SECRET_FILE_ENV, None)
    env.pop(MEMBER_KEY_ENV, None)
    if member_key is not None:
        env[MEMBER_KEY_ENV] = member_key.hex()
    if threads:
        for var in BLAS_THREAD_VARS:
            env.setdefault(var, str(threads))
    return env


class ProcessSpawner:
    """Start roles as processes: locally, or with ``srun`` on Slurm nodes (round robin).

    ``threads``: BLAS threads per role (``None`` leaves the environment alone).
    """

    def __init__(self, coord_addr: str | None = None, nodes: list[str] | None = None,
                 srun: bool = False, python: str = sys.executable, bind_host: str = "127.0.0.1",
                 log_dir: str | None = None, threads: int | None = 1, member_key: bytes | None = None):
        """``bind_host``: what the roles bind (``auto``: each its node's address, see role.py);
        ``member_key``: the job's member key, in each role's environment."""
        self.coord_addr = coord_addr
        self.member_key = member_key
        self.threads = threads
        self.nodes = nodes or []
        self.srun = srun
        self.python = python
        self.bind_host = bind_host
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []
        self._rr = itertools.count()

    def command(self, role: str) -> list[str]:
        cmd = [self.python, "-m", "dl2d.elastic.role", role, "--coord", self.coord_addr,
               "--host", self.bind_host]
        if self.srun:
            node = self.nodes[next(self._rr) % len(self.nodes)] if self.nodes else None
            pre = ["srun", "--nodes=1", "--ntasks=1", "--overlap", "--kill-on-bad-exit=0",
                   f"--job-name=dl2-{role}"]
            if node:
                pre.append(f"--nodelist={node}")
            return pre + cmd
        return cmd

    def spawn(self, role: str, n: int) -> None:
        for _ in range(n):
            out = None
            if self.log_dir:
                os.makedirs(self.log_dir, exist_ok=True)
                out = open(os.path.join(self.log_dir, f"{role}-{len(self.procs)}.log"), "ab")
            if self.member_key is None:
                raise RuntimeError("no member key for the roles (set ProcessSpawner.member_key)")
            self.procs.append(subprocess.Popen(self.command(role), stdout=out, stderr=subprocess.STDOUT
                                               if out else None, env=role_env(self.threads,
                                                                              member_key=self.member_key)))
            if out:
                out.close()

    def kill_all(self, grace: float = 5.0) -> None:
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


class LocalCluster:
    """Coordinator + thread-spawned roles in this process (real loopback TCP)."""

    def __init__(self, cfg: TrainConfig, n_ps: int, n_workers: int, checkpoint_dir: str | None = None,
                 spawner=None, **kw):
        self.spawner = spawner or ThreadSpawner()
        self.coord = Coordinator(cfg, n_ps, n_workers, spawner=self.spawner,
                                 checkpoint_dir=checkpoint_dir, **kw).start()
        self.spawner.coord_addr = self.coord.address
        self.spawner.member_key = self.coord.member_key
        self.n_ps, self.n_workers = n_ps, n_workers

    def start(self) -> "LocalCluster":
        self.spawner.spawn("ps", self.n_ps)
        self.spawner.spawn("worker", self.n_workers)
        return self

    def wait(self, timeout: float = 60.0) -> str:
        if not self.coord.finished.wait(timeout):
            raise TimeoutError(f"job not finished; errors={self.coord.errors}")
        return self.coord.exit_reason

    def close(self) -> None:
        self.spawner.kill_all()
        self.coord.close()
