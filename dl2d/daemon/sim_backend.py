"""The simulated cluster backend: the daemon's embedded default.

The daemon drives it exactly as it drives Slurm (``observe`` / ``apply`` / ``cancel`` / ``drain`` /
``resume``), and :meth:`SimBackend.end_slot` trains every running job for one slot with the simulator's
truth, times the job's hidden interference factor and a per-slot noise drawn as the simulator draws it: a PS
job at the measured speed table (``dl2d.workload.speed.epochs_trained``), an all-reduce job at the measured
throughput of its placement (the GPUs it holds on each node: ``dl2d.sim.allreduce.epoch_rates``), slowed by
``shared_node_slowdown`` while it is spread over nodes one of which holds another spread job
(``allreduce.shares_a_server``). A model the catalog does not know has no measured truth: it trains at the
daemon's stated prior for it (dl2d.daemon.jobmodel). A start or resize (an all-reduce job's move too) costs
``resize_overhead_s`` of training, as in the simulator (``SimConfig.resize_overhead_s``; 0 by default).
Time is virtual: :meth:`SimBackend.now` is the start time plus ``slot`` x ``slot_seconds``, so the daemon's
timestamps (and the DB's JCTs) are simulated time.

The cluster outlives the daemon like a real one: with ``state_file`` set, the whole state (jobs, sizes,
placements, drained nodes, virtual clock, the noise generator and a log of every apply) is written
atomically after each change, and a new SimBackend on the same file continues where the last one stopped.
That is what lets the crash tests kill the daemon with SIGKILL and check that nothing was applied twice.
Inside :meth:`SimBackend.batch` the state is written once, when the batch ends (the daemon applies a slot's
intents in one batch): a daemon killed inside a batch leaves the cluster as it was before the batch, as if
those requests had never been sent, and replays them from its journal.

Placement: targets carry per-task node names as hints; they are recorded (``JobStatus.nodes``) but, as
with Slurm, where tasks really run is the backend's business: a job whose size does not change keeps its
tasks where they are, so per-node hints of different slots need not add up. An all-reduce job's speed is
that of its recorded nodes (packed on the fewest nodes when a target carried none). ``end_slot`` checks that the
running jobs fit the cluster in total (a plan applied job by job may pass through states that do not fit,
as on a real cluster between two resizes; the state that runs must fit).
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from dl2d.core.files import write_json_atomic
from dl2d.core.jobs import JobDemand, JobKind, TaskDemand
from dl2d.daemon import jobmodel
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
from dl2d.sim import allreduce
from dl2d.sim.cluster import ClusterSpec
from dl2d.workload import batching, efficiency, goodput, throughput
from dl2d.workload.catalog import ALLREDUCE_MODELS, MODEL_NAMES
from dl2d.workload.jobtypes import JOB_TYPES
from dl2d.workload.speed import epochs_trained, speed_table

STATE_FORMAT = "dl2d-sim-cluster"
STATE_VERSION = 1


@dataclass(frozen=True)
class Hidden:
    """What the scheduler is not told about a simulated job (from a trace): true epochs, interference."""

    true_epochs: float
    speed_factor: float = 1.0


def node_names(n: int) -> list[str]:
    width = max(3, len(str(n)))
    return [f"sim{i + 1:0{width}d}" for i in range(n)]


class SimBackend:
    """See the module docstring. ``hidden`` maps job *names* to :class:`Hidden` (demo traces)."""

    name = "sim"

    def __init__(self, cluster: ClusterSpec = ClusterSpec(40), slot_seconds: float = 1200.0, noise: float = 0.1,
                 seed: int = 0, speed_model: str = "measured", state_file: str | Path | None = None,
                 hidden: Mapping[str, Hidden] | None = None, start_time: float | None = None,
                 resize_overhead_s: float = 0.0, shared_node_slowdown: float = 0.0):
        self.heartbeat = lambda: None  # the simulated cluster never waits inside apply
        if slot_seconds <= 0:
            raise ValueError("slot_seconds must be > 0")
        if not 0 <= noise < 1:
            raise ValueError("noise must be in [0, 1)")
        if not 0 <= resize_overhead_s < float("inf") or not 0 <= shared_node_slowdown < 1:
            raise ValueError("resize_overhead_s must be a finite number >= 0 and shared_node_slowdown in [0, 1)")
        self.resize_overhead_s = float(resize_overhead_s)
        self.shared_node_slowdown = float(shared_node_slowdown)
        self.cluster = cluster
        self.slot_seconds = float(slot_seconds)
        self.noise = float(noise)
        self.table = speed_table(speed_model)
        self.hidden = dict(hidden or {})
        self.state_file = Path(state_file) if state_file else None
        self._names = node_names(cluster.num_servers)
        self._index = {n: i for i, n in enumerate(self._names)}
        self._batch_depth, self._dirty = 0, False
        if self.state_file is not None and self.state_file.exists():
            self._load()
        else:
            self.slot = 0
            self.origin = time.time() if start_time is None else float(start_time)
            self.jobs: dict[int, dict[str, Any]] = {}
            self.drained: dict[str, str] = {}
            self.rng = np.random.default_rng(seed)
            self.log: list[dict[str, Any]] = []
            self._save()

    # ------------------------------------------------------------------ persistence

    def _doc(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT, "version": STATE_VERSION, "servers": self.cluster.num_servers,
            "slot": self.slot, "origin": self.origin, "jobs": {str(k): v for k, v in self.jobs.items()},
            "drained": self.drained, "rng": self.rng.bit_generator.state, "log": self.log,
        }

    def _save(self) -> None:
        if self.state_file is None:
            return
        if self._batch_depth:
            self._dirty = True
            return
        # no fsync: a killed process loses nothing the kernel has; power loss is not what this simulated
        # cluster models
        write_json_atomic(self.state_file, self._doc(), fsync=False)

    @contextmanager
    def batch(self):
        """Write the state once at the end instead of after every change (also when the batch raises)."""
        self._batch_depth += 1
        try:
            yield self
        finally:
            self._batch_depth -= 1
            if not self._batch_depth and self._dirty:
                self._dirty = False
                self._save()

    def _load(self) -> None:
        try:
            doc = json.loads(self.state_file.read_text())
        except (OSError, ValueError) as e:
            raise BackendError(f"{self.state_file}: cannot read the simulated cluster's state ({e})") from None
        if doc.get("format") != STATE_FORMAT or doc.get("version") != STATE_VERSION:
            raise BackendError(f"{self.state_file}: not a dl2d simulated-cluster state file (v{STATE_VERSION})")
        if doc["servers"] != self.cluster.num_servers:
            raise BackendError(f"{self.state_file}: the saved cluster has {doc['servers']} servers, the config "
                               f"{self.cluster.num_servers}; remove the file to start a new simulated cluster")
        self.slot, self.origin = int(doc["slot"]), float(doc["origin"])
        self.jobs = {int(k): v for k, v in doc["jobs"].items()}
        for j in self.jobs.values():  # state files written before jobs carried their own demand
            if "worker_demand" not in j:
                d = JOB_TYPES[j["type"]].demand
                j["worker_demand"], j["ps_demand"] = d.worker.as_array().tolist(), d.ps.as_array().tolist()
        self.drained = dict(doc["drained"])
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = doc["rng"]
        self.log = list(doc["log"])

    # ------------------------------------------------------------------ the ClusterBackend interface

    def now(self) -> datetime:
        """Virtual time: start + slot x slot_seconds."""
        return datetime.fromtimestamp(self.origin + self.slot * self.slot_seconds, timezone.utc)

    def nodes(self) -> list[NodeInfo]:
        c = self.cluster
        return [NodeInfo(n, int(c.gpus), int(c.cpus), float(c.mem_gb), usable=n not in self.drained,
                         reason=self.drained.get(n, "")) for n in self._names]

    def _status(self, job_id: int, j: dict[str, Any]) -> JobStatus:
        fin = j.get("finished_at")
        return JobStatus(
            job_id=job_id, state=j["state"], workers=j["workers"], ps=j["ps"], epochs_done=j["epochs_done"],
            nodes=tuple(sorted(set(self._names[s] for s in self._worker_servers(j)) | set(j["ps_nodes"]))),
            backend_ref=f"sim-{job_id}",
            hot_scaling=True, message=j.get("message", ""),
            finished_at=datetime.fromtimestamp(fin, timezone.utc) if fin is not None else None,
            **self._batch_report(j),
        )

    @staticmethod
    def _batch_report(j: Mapping[str, Any]) -> dict[str, Any]:
        """A running adaptive job's own report: its batch, and the gradient noise it measures (its model's
        measured statistics at its batch and epoch, the variance at its submitted batch, as dl2d.job reports)."""
        if not j.get("adaptive") or j["state"] != RUNNING or not j["workers"]:
            return {}
        sqr, var = efficiency.job_prior(j["model"], j["batch_now"], j["epochs_done"])
        return {"batch_size": float(j["batch_now"]),
                "grad_noise": (sqr, var * batching.limits(j["model"]).init / float(j["batch"]))}

    def observe(self) -> dict[int, JobStatus]:
        return {jid: self._status(jid, j) for jid, j in self.jobs.items()}

    def _check_target(self, job: JobRequest, target: Target) -> None:
        if target.workers < 0 or target.ps < 0:
            raise BackendError(f"job {job.job_id}: negative target {target.workers}/{target.ps}")
        for role, want, nodes in (("worker", target.workers, target.worker_nodes), ("ps", target.ps, target.ps_nodes)):
            if nodes and len(nodes) != want:
                raise BackendError(f"job {job.job_id}: {want} {role}(s) but {len(nodes)} node(s) given")
            unknown = [n for n in nodes if n not in self._index]
            if unknown:
                raise BackendError(f"job {job.job_id}: unknown node(s) {', '.join(sorted(set(unknown)))}")

    def apply(self, job: JobRequest, target: Target) -> ApplyResult:
        self._check_target(job, target)
        ref = f"sim-{job.job_id}"
        j = self.jobs.get(job.job_id)
        if j is not None and j["state"] in (FINISHED, FAILED):
            return ApplyResult(job.job_id, NOOP, ref)
        w_nodes, p_nodes = list(target.worker_nodes), list(target.ps_nodes)
        if j is None:
            if target.workers == 0 and target.ps == 0:
                return ApplyResult(job.job_id, NOOP, ref)
            try:
                model = jobmodel.model_of(job.job_type, job.spec)
                demand = jobmodel.job_demand(job.job_type, job.spec)
            except ValueError as e:
                raise BackendError(f"job {job.job_id}: {e}") from None
            hid = self.hidden.get(str(job.spec.get("name", "")), Hidden(job.total_epochs))
            j = {"type": model.type_idx, "kind": model.kind.value, "model": model.name, "batch": model.batch_size,
                 "requested": model.requested, "epoch_seconds": model.epoch_seconds,
                 "est": float(job.total_epochs), "true": float(hid.true_epochs),
                 "worker_demand": demand.worker.as_array().tolist(), "ps_demand": demand.ps.as_array().tolist(),
                 "factor": float(hid.speed_factor), "epochs_done": 0.0, "workers": 0, "ps": 0,
                 "worker_nodes": [], "ps_nodes": [], "state": PENDING, "finished_at": None, "debt": 0.0}
            if job.spec.get("adaptive_batch") and model.name in ALLREDUCE_MODELS:
                j.update(adaptive=True, batch_now=model.batch_size, max_local=job.spec.get("max_local_batch"))
            self.jobs[job.job_id] = j
        rebatched = bool(j.get("adaptive") and target.batch_size and target.batch_size != j["batch_now"])
        same = (j["workers"], j["ps"]) == (target.workers, target.ps) and not rebatched and \
            (not w_nodes or w_nodes == j["worker_nodes"]) and (not p_nodes or p_nodes == j["ps_nodes"])
        if same:
            return ApplyResult(job.job_id, NOOP, ref)
        if rebatched:
            j["batch_now"] = float(target.batch_size)
        resized = (j["workers"], j["ps"]) != (target.workers, target.ps)
        moved = bool(self._allreduce(j) and (rebatched or w_nodes and sorted(w_nodes) != sorted(j["worker_nodes"])))
        if resized or moved:
            # what the simulator charges: a size change, or an all-reduce job moved (a checkpoint-restart)
            j["debt"] = j.get("debt", 0.0) + self.resize_overhead_s
        if target.workers == 0 and target.ps == 0:
            method = STOP
        elif j["workers"] == 0 and j["ps"] == 0:
            method = START
        elif not resized and moved:  # the same size on other nodes, or a new batch: a checkpoint-restart
            method = RESTART
        elif target.workers <= j["workers"] and target.ps <= j["ps"]:
            method = SHRINK
        else:
            method = HOT  # simulated jobs scale in place
        j.update(workers=target.workers, ps=target.ps, worker_nodes=w_nodes, ps_nodes=p_nodes,
                 state=RUNNING if target.workers > 0 else PENDING)
        self.log.append({"slot": self.slot, "job": job.job_id, "workers": target.workers, "ps": target.ps,
                         "method": method})
        self._save()
        return ApplyResult(job.job_id, method, ref)

    def cancel(self, job_id: int) -> None:
        j = self.jobs.get(job_id)
        if j is None or j["state"] in (FINISHED, FAILED):
            return
        j.update(state=FAILED, workers=0, ps=0, worker_nodes=[], ps_nodes=[], message="cancelled")
        self.log.append({"slot": self.slot, "job": job_id, "workers": 0, "ps": 0, "method": "cancel"})
        self._save()

    def drain(self, node: str, reason: str) -> None:
        if node not in self._index:
            raise BackendError(f"unknown node {node!r}")
        if self.drained.get(node) != reason:
            self.drained[node] = reason
            self._save()

    def resume(self, node: str) -> None:
        if self.drained.pop(node, None) is not None:
            self._save()

    def _check_capacity(self, running: list[tuple[int, dict[str, Any]]]) -> None:
        total = np.zeros(3)
        for _, j in running:
            total += j["workers"] * np.asarray(j["worker_demand"]) + j["ps"] * np.asarray(j["ps_demand"])
        cap = self.cluster.server_capacity * len(self._names)
        if np.any(total > cap + 1e-6):
            raise BackendError(f"running jobs need {total.tolist()} (GPUs, CPUs, GB), the cluster has {cap.tolist()}")

    @staticmethod
    def _allreduce(j: Mapping[str, Any]) -> bool:
        return j.get("kind") == JobKind.ALLREDUCE.value

    def _worker_servers(self, j: Mapping[str, Any]) -> list[int]:
        """Server indices of a job's workers: its recorded nodes, else packed on the first servers."""
        nodes = j["worker_nodes"]
        if len(nodes) == j["workers"] and all(n in self._index for n in nodes):
            return [self._index[n] for n in nodes]
        per_server = max(int(self.cluster.gpus // jobmodel.gpus_per_worker(self._demand(j))), 1)
        return [w // per_server for w in range(j["workers"])]

    @staticmethod
    def _demand(j: Mapping[str, Any]) -> JobDemand:
        return JobDemand(TaskDemand.of(j["worker_demand"]), TaskDemand.of(j["ps_demand"]),
                         JobKind(j.get("kind", JobKind.PS.value)))

    def _allreduce_rates(self, jobs: list[dict[str, Any]]) -> np.ndarray:
        """[jobs] epochs/s of running all-reduce jobs on their servers, with the shared-node slowdown; before
        interference and noise. Known models: the measured throughput (dl2d.sim.allreduce); unseen: the prior."""
        servers = [self._worker_servers(j) for j in jobs]
        gpw = np.array([jobmodel.gpus_per_worker(self._demand(j)) for j in jobs], float)
        known = [k for k, j in enumerate(jobs) if j["type"] != jobmodel.UNSEEN_MODEL]
        rates = np.zeros(len(jobs))
        if known:
            rates[known] = allreduce.epoch_rates([MODEL_NAMES[jobs[k]["type"]] for k in known],
                                                 [jobs[k]["batch"] for k in known],
                                                 [servers[k] for k in known], gpw[known])
        for k, j in enumerate(jobs):
            if j["type"] == jobmodel.UNSEEN_MODEL:
                model = jobmodel.JobModel(j["model"], j["type"], JobKind.ALLREDUCE, j["batch"], j["requested"],
                                          j["epoch_seconds"])
                rates[k] = jobmodel.prior(model, int(gpw[k]), int(self.cluster.gpus), j["workers"])[j["workers"]]
        for k, j in enumerate(jobs):  # an adaptive job at another batch than its submitted one: its goodput's ratio
            if j.get("adaptive") and j["batch_now"] != j["batch"]:
                rates[k] *= self._goodput_ratio(j, servers[k], gpw[k])
        return rates * (1 - self.shared_node_slowdown * allreduce.shares_a_server(servers))

    def _goodput_ratio(self, j: Mapping[str, Any], servers: list[int], gpus_per_worker: float) -> float:
        """Epochs a second at the job's batch now against at its submitted one on ``servers``: its goodput's ratio
        (dl2d.workload.goodput), with its model's measured gradient statistics as the job's own."""
        ratio = goodput.relative_goodput(j["model"], throughput.placement_on(servers, gpus_per_worker),
                                         j["batch_now"], j["batch"], int(j["epochs_done"]), max_local=j.get("max_local"))
        return 1.0 if ratio is None else ratio

    def end_slot(self, seconds: float) -> None:
        """Train every running job for one slot (``seconds`` is ignored: a slot is ``slot_seconds``)."""
        active = sorted((jid, j) for jid, j in self.jobs.items() if j["state"] in (PENDING, RUNNING))
        self._check_capacity(active)
        noise = 1 + self.noise * self.rng.uniform(-1, 1, len(active))
        start = self.origin + self.slot * self.slot_seconds
        running_ar = [j for _, j in active if j["workers"] > 0 and self._allreduce(j)]
        ar_rate = dict(zip(map(id, running_ar), self._allreduce_rates(running_ar))) if running_ar else {}
        for (jid, j), nz in zip(active, noise):
            lost = min(j.get("debt", 0.0), self.slot_seconds)  # resize overhead paid this slot
            if lost:
                j["debt"] -= lost
            train_s = self.slot_seconds - lost
            if j["workers"] == 0:
                continue
            if self._allreduce(j):
                ep = ar_rate[id(j)] * j["factor"] * nz * train_s
            else:
                ep = float(epochs_trained(self.table, np.array([j["type"]]), np.array([j["ps"]]),
                                          np.array([j["workers"]]), j["factor"] * nz, train_s)[0])
            left = j["true"] - j["epochs_done"]
            if ep >= left - 1e-12:
                frac = min(max(left / ep, 0.0), 1.0) if ep > 0 else 1.0
                j.update(epochs_done=j["true"], state=FINISHED, finished_at=start + frac * self.slot_seconds,
                         workers=0, ps=0, worker_nodes=[], ps_nodes=[])
            else:
                j["epochs_done"] += ep
        self.slot += 1
        self._save()

