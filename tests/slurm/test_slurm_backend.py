"""SlurmBackend without Slurm: the pure mapping (allocation rule, apply plan, progress, status,
batch script) and the backend's I/O shell over an in-memory Slurm (real files in tmp_path)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from dl2d.daemon.backend import (
    FAILED, FINISHED, HOT, NOOP, PENDING, RESTART, RUNNING, SHRINK, START, STOP,
    BackendError, JobRequest, NodeInfo, Target,
)
from dl2d.daemon.slurm_backend import (
    Allocation, Current, Demand, NodeShape, SlurmBackend, SlurmBackendConfig, allocation_for,
    batch_script, demand_from_spec, epochs_from_progress, fits, is_elastic, node_info,
    node_shape, plan_apply, status_from, target_env,
)
from dl2d.slurm.backoff import BackoffPolicy
from dl2d.slurm.driver import JobSpec, SlurmError, SlurmJob, SlurmNode, SlurmUnavailable
from dl2d.slurm.parsing import parse_sinfo_json

FIXTURES = Path(__file__).parent / "fixtures"
SHAPE = NodeShape(gpus=4, cpus=16, mem_gb=15.6)


# -- allocation rule -------------------------------------------------------------------------

@pytest.mark.parametrize("workers,ps,demand,expected", [
    (1, 1, Demand(), Allocation(1, 1)),
    (3, 1, Demand(), Allocation(1, 3)),
    (4, 2, Demand(), Allocation(1, 4)),
    (5, 1, Demand(), Allocation(2, 3)),
    (6, 4, Demand(), Allocation(2, 3)),
    (8, 0, Demand(gpus_per_worker=2), Allocation(4, 4)),
    (0, 3, Demand(), Allocation(1, 0)),  # PS only: no GPUs
    (2, 2, Demand(gpus_per_worker=0, cpus_per_worker=8, cpus_per_ps=4), Allocation(2, 0)),
    (1, 1, Demand(mem_gb_per_worker=10, mem_gb_per_ps=10), Allocation(2, 1)),
])
def test_allocation_rule(workers, ps, demand, expected):
    assert allocation_for(workers, ps, demand, SHAPE) == expected


def test_allocation_rejects_tasks_bigger_than_a_node_and_empty_targets():
    with pytest.raises(ValueError, match="5 GPUs"):
        allocation_for(1, 1, Demand(gpus_per_worker=5), SHAPE)
    with pytest.raises(ValueError, match="CPUs"):
        allocation_for(1, 1, Demand(cpus_per_ps=17), SHAPE)
    with pytest.raises(ValueError, match="memory"):
        allocation_for(1, 0, Demand(mem_gb_per_worker=16), SHAPE)
    with pytest.raises(ValueError, match="non-zero"):
        allocation_for(0, 0, Demand(), SHAPE)


def test_demand_from_spec_defaults_and_validation():
    assert demand_from_spec({}) == Demand()
    assert demand_from_spec({"worker": {"gpus": 2, "cpus": 4, "mem_gb": 8},
                             "ps": {"cpus": 2, "mem_gb": 4}}) == Demand(2, 4, 8.0, 2, 4.0)
    with pytest.raises(ValueError, match="worker.gpus"):
        demand_from_spec({"worker": {"gpus": -1}})
    with pytest.raises(ValueError, match="ps.cpus"):
        demand_from_spec({"ps": {"cpus": "two"}})


def test_node_shape_is_the_smallest_usable_node():
    nodes = [NodeInfo("a", 4, 16, 16.0), NodeInfo("b", 2, 32, 64.0),
             NodeInfo("c", 1, 1, 1.0, usable=False)]
    assert node_shape(nodes) == NodeShape(2, 16, 16.0)
    assert node_shape([NodeInfo("c", 1, 1, 1.0, usable=False)]) is None


def test_fits():
    assert fits(Allocation(1, 2), Allocation(2, 2))
    assert fits(Allocation(2, 2), Allocation(2, 2))
    assert not fits(Allocation(1, 3), Allocation(2, 2))  # more GPUs per node than held
    assert not fits(Allocation(3, 1), Allocation(2, 2))


def test_is_elastic():
    assert is_elastic({"command": "dl2-run --workers $DL2D_WORKERS --ps 1"})
    assert is_elastic({"command": "exec /opt/venv/bin/dl2-run --epochs 3"})
    assert is_elastic({"command": "python -m dl2d.elastic.launcher --local"})
    assert not is_elastic({"command": "python train.py"})
    assert not is_elastic({"command": "dl2-run", "elastic": False})
    assert is_elastic({"script": "#!/bin/sh\n...", "elastic": True})
    assert not is_elastic({"command": "echo 'unbalanced"})


# -- the apply plan --------------------------------------------------------------------------

RUN2 = Current("RUNNING", Allocation(2, 2), (4, 1))


@pytest.mark.parametrize("cur,target,needed,elastic,expected", [
    (Current(None, None, (0, 0)), Target(2, 1), Allocation(1, 2), False, START),
    (Current(None, None, (0, 0)), Target(0, 0), None, False, NOOP),
    (Current(None, None, (0, 0), finished=True), Target(2, 1), Allocation(1, 2), False, NOOP),
    (Current("PENDING", Allocation(1, 2), (2, 1)), Target(2, 1), Allocation(1, 2), False, NOOP),
    (Current("PENDING", Allocation(1, 2), (2, 1)), Target(6, 1), Allocation(2, 3), False, START),
    (Current("PENDING", Allocation(1, 2), (2, 1)), Target(0, 0), None, False, STOP),
    (RUN2, Target(4, 1), Allocation(2, 2), False, NOOP),
    (RUN2, Target(4, 1), Allocation(2, 2), True, NOOP),
    (RUN2, Target(0, 0), None, True, STOP),
    (RUN2, Target(2, 1), Allocation(1, 2), False, SHRINK),
    (RUN2, Target(2, 1), Allocation(1, 2), True, SHRINK),
    (RUN2, Target(3, 2), Allocation(2, 2), False, NOOP),  # same allocation, not elastic
    (RUN2, Target(3, 2), Allocation(2, 2), True, HOT),
    (RUN2, Target(4, 3), Allocation(2, 2), True, HOT),  # more PS in the held allocation
    (RUN2, Target(6, 1), Allocation(2, 3), True, RESTART),  # more GPUs per node than held
    (RUN2, Target(9, 1), Allocation(3, 3), True, RESTART),
    (RUN2, Target(9, 1), Allocation(3, 3), False, RESTART),
    (Current("RUNNING", Allocation(2, 2), (4, 1)), Target(4, 0), Allocation(2, 2), True, RESTART),
])
def test_plan_apply(cur, target, needed, elastic, expected):
    assert plan_apply(cur, target, needed, elastic) == expected


def test_plan_apply_needs_an_allocation_for_a_nonzero_target():
    with pytest.raises(ValueError):
        plan_apply(RUN2, Target(1, 1), None, False)


# -- progress and status ---------------------------------------------------------------------

def test_epochs_from_progress():
    assert epochs_from_progress(None) == 0.0
    assert epochs_from_progress({"epoch": 3, "epochs": 8, "status": "running"}) == 3.0
    # dl2-run: 2.5 epochs done of 4 at 10 steps per epoch
    assert epochs_from_progress({"epoch": 2, "step": 25, "total_steps": 40, "epochs": 4,
                                 "state": "running"}) == pytest.approx(2.5)
    assert epochs_from_progress({"epoch": "garbage"}) == 0.0


def sjob(state="RUNNING", job_id="7", nodes=("node1",), reason="", **kw) -> SlurmJob:
    return SlurmJob(job_id=job_id, name="dl2d-1", state=state, reason=reason, nodes=nodes,
                    num_nodes=len(nodes), gpus_per_node=1, comment="dl2d:1", **kw)


REC = {"slurm_job_id": "7", "applied": {"workers": 2, "ps": 1}, "elastic": True}


@pytest.mark.parametrize("record,slurm,progress,state,workers,message", [
    (REC, sjob(), {"epoch": 2}, RUNNING, 2, ""),
    (REC, sjob("PENDING", nodes=(), reason="Resources"), None, PENDING, 2, "Resources"),
    (REC, sjob("COMPLETED"), {"epoch": 8, "status": "done"}, FINISHED, 0, "done"),
    (REC, sjob("FAILED", reason="NonZeroExitCode"), {"epoch": 1, "status": "running"}, FAILED, 0,
     "ended FAILED (NonZeroExitCode)"),
    (REC, sjob("COMPLETED"), {"epoch": 1, "status": "running"}, FAILED, 0, "ended COMPLETED"),
    (REC, sjob("COMPLETED"), {"epoch": 3, "status": "checkpointed"}, PENDING, 0, "checkpointed"),
    (REC, sjob("FAILED"), {"epoch": 3, "state": "checkpointed"}, PENDING, 0, "checkpointed"),
    ({**REC, "stopped": True}, sjob("CANCELLED"), {"epoch": 3}, PENDING, 0, "stopped"),
    ({**REC, "cancelled": True}, sjob("CANCELLED"), None, FAILED, 0, "cancelled"),
    ({**REC, "final": FAILED, "message": "boom"}, None, None, FAILED, 0, "boom"),
    (REC, None, {"epoch": 3}, PENDING, 0, "gone"),
    ({}, None, None, PENDING, 0, "not submitted"),
])
def test_status_from(record, slurm, progress, state, workers, message):
    st = status_from(1, record, slurm, progress)
    assert (st.state, st.workers) == (state, workers), st
    assert message in st.message
    assert st.epochs_done == epochs_from_progress(progress)


def test_batch_script_exports_paths_and_reads_the_target_each_start(tmp_path):
    """Run the generated script with bash: the command sees the job's variables and the
    size from target.env, re-read at every start (a requeued job sees its new size)."""
    out = tmp_path / "out.txt"
    cmd = f'echo "$DL2D_JOB_ID $DL2D_WORKERS $DL2D_PS $DL2D_PROGRESS_FILE" >> {out}'
    script = tmp_path / "job.sh"
    script.write_text(batch_script(5, tmp_path, cmd, None))
    (tmp_path / "target.env").write_text(target_env(3, 2))
    subprocess.run(["bash", str(script)], check=True, timeout=10)
    (tmp_path / "target.env").write_text(target_env(1, 1))
    subprocess.run(["bash", str(script)], check=True, timeout=10)
    assert out.read_text().splitlines() == [f"5 3 2 {tmp_path}/progress.json",
                                            f"5 1 1 {tmp_path}/progress.json"]
    assert (tmp_path / "checkpoint").is_dir()
    with pytest.raises(ValueError):
        batch_script(5, tmp_path, None, None)


def test_batch_script_quotes_commands_with_quotes(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(batch_script(1, tmp_path, "echo \"it's $((1+1))\"", None))
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=10)
    assert out.stdout == "it's 2\n"


def test_sinfo_memory_is_parsed_and_mapped_to_node_info():
    nodes = parse_sinfo_json((FIXTURES / "sinfo-22.05.json").read_text())
    assert nodes and all(n.mem_mb == 16000 for n in nodes)
    info = node_info(nodes[0])
    assert info.mem_gb == pytest.approx(16000 / 1024)
    drained = node_info(SlurmNode("n9", "idle", flags=("DRAIN",), cpus=4, gpus=2))
    assert not drained.usable and drained.reason == "idle,DRAIN"


# -- the backend over an in-memory Slurm -----------------------------------------------------

class FakeSlurm:
    """A small in-memory Slurm: jobs start when ``run()`` is called; a signalled job
    "checkpoints" (its progress says so) and completes. Counts every mutating call."""

    def __init__(self, nodes: int = 4, gpus: int = 4) -> None:
        self.node_list = [SlurmNode(f"node{i}", "idle", cpus=16, gpus=gpus, mem_mb=16000)
                          for i in range(1, nodes + 1)]
        self.jobs_: dict[str, SlurmJob] = {}
        self.specs: dict[str, JobSpec] = {}
        self.calls: list[tuple] = []
        self.next_id = 100
        self.down = False
        self.ignore_signals = False
        self.requeued_nodes: dict[str, int] = {}

    def _check(self) -> None:
        if self.down:
            raise SlurmUnavailable("controller down", command=("squeue",))

    def _set(self, job_id: str, **kw) -> None:
        self.jobs_[job_id] = replace(self.jobs_[job_id], **kw)

    def run(self) -> None:
        for j in list(self.jobs_.values()):
            if j.state == "PENDING":
                n = self.requeued_nodes.pop(j.job_id, j.num_nodes)
                nodes = tuple(f"node{i}" for i in range(1, n + 1))
                self._set(j.job_id, state="RUNNING", nodes=nodes, num_nodes=n,
                          batch_host=nodes[0])

    def submit(self, spec: JobSpec) -> str:
        self._check()
        self.next_id += 1
        jid = str(self.next_id)
        self.calls.append(("submit", jid, spec.nodes, spec.gpus_per_node))
        self.specs[jid] = spec
        self.jobs_[jid] = SlurmJob(job_id=jid, name=spec.name, state="PENDING",
                                   num_nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
                                   comment=spec.comment or "")
        return jid

    def jobs(self) -> list[SlurmJob]:
        self._check()
        return list(self.jobs_.values())

    def nodes(self) -> list[SlurmNode]:
        self._check()
        return list(self.node_list)

    def shrink(self, job_id, num_nodes):
        self._check()
        self.calls.append(("shrink", job_id, num_nodes))
        j = self.jobs_[job_id]
        self._set(job_id, num_nodes=num_nodes, nodes=j.nodes[:num_nodes])

    def signal(self, job_id, sig):
        self._check()
        self.calls.append(("signal", job_id, sig))
        if not self.ignore_signals:
            self._set(job_id, state="COMPLETED")
            self.on_checkpoint(job_id)

    def on_checkpoint(self, job_id):  # replaced by tests that write progress
        pass

    def requeue(self, job_id, num_nodes=None):
        self._check()
        self.calls.append(("requeue", job_id, num_nodes))
        # As seen on 22.05: a requeued job keeps showing its old node count until it runs.
        if num_nodes:
            self.requeued_nodes[job_id] = num_nodes
        self._set(job_id, state="PENDING", nodes=(), restarts=self.jobs_[job_id].restarts + 1)

    def cancel(self, job_id):
        self._check()
        self.calls.append(("cancel", job_id))
        if self.jobs_[job_id].active:
            self._set(job_id, state="CANCELLED")

    def drain_node(self, node, reason):
        self._check()
        self.calls.append(("drain", node, reason))
        self.node_list = [replace(n, flags=("DRAIN",), reason=reason) if n.name == node else n
                          for n in self.node_list]

    def resume_node(self, node):
        self._check()
        self.calls.append(("resume", node))
        self.node_list = [replace(n, flags=(), reason="") if n.name == node else n
                          for n in self.node_list]

    def ping(self):
        return not self.down

    def mutations(self) -> list[tuple]:
        return list(self.calls)


def make_backend(tmp_path, fake, **cfg) -> SlurmBackend:
    config = SlurmBackendConfig(state_dir=tmp_path / "state", checkpoint_timeout_s=1.0,
                                poll_interval_s=0.01,
                                backoff=BackoffPolicy(base=0.001, cap=0.001, max_attempts=3),
                                **cfg)
    return SlurmBackend(fake, config)


def req(job_id=1, **spec) -> JobRequest:
    spec.setdefault("command", "exec python -m dl2d.slurm.demo_job --epochs 5")
    return JobRequest(job_id=job_id, job_type="resnet-50", total_epochs=5, spec=spec)


def write_progress(backend, job_id, **progress):
    p = backend.job_dir(job_id) / "progress.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(progress))


def test_start_is_idempotent_also_for_a_new_backend_instance(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    r = b.apply(req(), Target(2, 1))
    assert (r.method, r.backend_ref) == (START, "101")
    spec = fake.specs["101"]
    assert (spec.nodes, spec.gpus_per_node, spec.comment, spec.name) == (1, 2, "dl2d:1", "dl2d-1")
    assert "DL2D_PROGRESS_FILE" in spec.script and spec.script.startswith("#!/bin/bash")
    assert b.observe()[1].state == PENDING
    assert b.apply(req(), Target(2, 1)).method == NOOP  # pending at that size
    fake.run()
    write_progress(b, 1, epoch=2, epochs=5, status="running")
    st = b.observe()[1]
    assert (st.state, st.workers, st.ps, st.epochs_done, st.nodes) == (RUNNING, 2, 1, 2.0, ("node1",))
    assert st.backend_ref == "101" and not st.hot_scaling
    n = len(fake.calls)
    again = make_backend(tmp_path, fake)  # the daemon restarted
    assert again.observe() == b.observe()
    assert again.apply(req(), Target(2, 1)).method == NOOP
    assert len(fake.calls) == n, "a NOOP must not touch Slurm"


def test_shrink_restart_by_resubmit_stop_and_start(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    fake.on_checkpoint = lambda jid: write_progress(b, 1, epoch=3, epochs=5, status="checkpointed")
    b.apply(req(), Target(6, 1))  # 2 nodes x 3 GPUs
    fake.run()
    assert b.apply(req(), Target(2, 1)).method == SHRINK
    assert fake.calls[-1] == ("shrink", "101", 1)
    assert b.observe()[1].nodes == ("node1",)
    assert json.loads((b.job_dir(1) / "target.json").read_text()) == {"workers": 2, "ps": 1}
    assert b.apply(req(), Target(2, 1)).method == NOOP

    r = b.apply(req(), Target(8, 1))  # needs 2 nodes: checkpoint + resubmit
    assert (r.method, r.backend_ref) == (RESTART, "102")
    assert [c[0] for c in fake.calls[-2:]] == ["signal", "submit"]
    assert fake.calls[-1] == ("submit", "102", 2, 4)
    assert "DL2D_WORKERS=8" in (b.job_dir(1) / "target.env").read_text()
    fake.run()
    assert b.observe()[1].state == RUNNING

    r = b.apply(req(), Target(0, 0))
    assert (r.method, r.backend_ref) == (STOP, "102")
    st = b.observe()[1]
    assert (st.state, st.workers, st.epochs_done) == (PENDING, 0, 3.0)
    assert "stopped" in st.message
    assert b.apply(req(), Target(0, 0)).method == NOOP
    r = b.apply(req(), Target(1, 1))
    assert (r.method, r.backend_ref) == (START, "103")


def test_restart_by_requeue_keeps_the_slurm_job(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake, restart_method="requeue")
    b.apply(req(), Target(4, 1))  # 1 node x 4 GPUs
    fake.run()
    r = b.apply(req(), Target(8, 1))  # 2 nodes x 4 GPUs: same GPUs per node
    assert (r.method, r.backend_ref) == (RESTART, "101")
    assert fake.calls[-2:] == [("signal", "101", "USR1"), ("requeue", "101", 2)]
    st = b.observe()[1]
    assert (st.state, st.workers) == (PENDING, 8)
    assert b.apply(req(), Target(8, 1)).method == NOOP  # pending at 2 nodes x 4
    fake.run()
    assert len(b.observe()[1].nodes) == 2
    # 2 x 4 -> 3 nodes x 3 GPUs: requeue cannot change GPUs per node, so it resubmits.
    r = b.apply(req(), Target(9, 1))
    assert (r.method, r.backend_ref) == (RESTART, "102")
    assert fake.calls[-1] == ("submit", "102", 3, 3)


def test_a_job_that_ignores_the_checkpoint_signal_is_cancelled(tmp_path):
    fake = FakeSlurm()
    fake.ignore_signals = True
    b = make_backend(tmp_path, fake)
    b.apply(req(), Target(1, 1))
    fake.run()
    assert b.apply(req(), Target(0, 0)).method == STOP
    assert [c[0] for c in fake.calls[-2:]] == ["signal", "cancel"]


def test_restart_of_a_job_that_finishes_meanwhile_submits_nothing(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    fake.on_checkpoint = lambda jid: write_progress(b, 1, epoch=5, epochs=5, status="done")
    b.apply(req(), Target(1, 1))
    fake.run()
    assert b.apply(req(), Target(5, 1)).method == NOOP
    assert [c[0] for c in fake.calls] == ["submit", "signal"]
    assert b.observe()[1].state == FINISHED
    assert b.apply(req(), Target(5, 1)).method == NOOP


def test_pending_job_at_another_size_is_replaced(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    b.apply(req(), Target(1, 1))
    r = b.apply(req(), Target(8, 1))
    assert (r.method, r.backend_ref) == (START, "102")
    assert fake.jobs_["101"].state == "CANCELLED"
    assert b.observe()[1].backend_ref == "102"


def test_hot_scaling_through_the_coordinator_and_fallback_to_restart(tmp_path):
    fake = FakeSlurm()
    calls = []

    def scaler(addr, workers, ps, timeout):
        calls.append((addr, workers, ps))
        if workers == 4:
            raise ConnectionRefusedError("coordinator gone")
        return {"method": "hot", "workers": workers, "ps": ps, "records": []}

    config = SlurmBackendConfig(state_dir=tmp_path / "state", checkpoint_timeout_s=1.0,
                                poll_interval_s=0.01)
    b = SlurmBackend(fake, config, scaler=scaler)
    job = req(command="dl2-run --workers $DL2D_WORKERS --ps $DL2D_PS "
                      "--checkpoint-dir $DL2D_CHECKPOINT_DIR", worker={"gpus": 1})
    b.apply(job, Target(3, 1))  # 1 node x 3 GPUs
    fake.run()
    (b.job_dir(1) / "checkpoint" / "coordinator.json").write_text(
        json.dumps({"address": "node1:4000"}))
    assert b.observe()[1].hot_scaling
    assert b.apply(job, Target(2, 2)).method == HOT
    assert calls == [("node1:4000", 2, 2)]
    assert b.observe()[1].workers == 2 and b.observe()[1].ps == 2
    assert b.apply(job, Target(2, 2)).method == NOOP
    assert b.apply(job, Target(3, 1)).method == HOT
    n = len(fake.calls)
    assert b.apply(job, Target(3, 1)).method == NOOP
    assert len(fake.calls) == n
    # Needs a 4th GPU on the node: beyond the allocation, so a restart (no scaler call).
    assert b.apply(job, Target(4, 1)).method == RESTART
    assert len(calls) == 2
    fake.run()
    # 4 workers hold 1 node x 4 GPUs; hot scaling to 4 workers + 2 PS fails: relaunch instead.
    assert b.apply(job, Target(4, 2)).method == RESTART
    assert calls[-1] == ("node1:4000", 4, 2)


def test_elastic_shrink_scales_down_before_releasing_nodes(tmp_path):
    fake = FakeSlurm()
    order = []
    fake_shrink = fake.shrink
    fake.shrink = lambda jid, n: (order.append("shrink"), fake_shrink(jid, n))
    config = SlurmBackendConfig(state_dir=tmp_path / "state")
    b = SlurmBackend(fake, config,
                     scaler=lambda addr, w, p, t: order.append(("scale", w, p)) or {})
    job = req(command="dl2-run --checkpoint-dir $DL2D_CHECKPOINT_DIR")
    b.apply(job, Target(8, 2))
    fake.run()
    (b.job_dir(1) / "checkpoint" / "coordinator.json").write_text('{"address": "node1:1"}')
    assert b.apply(job, Target(2, 1)).method == SHRINK
    assert order == [("scale", 2, 1), "shrink"]


def test_failed_job_is_reported_remembered_and_not_restarted(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    b.apply(req(), Target(1, 1))
    fake.run()
    write_progress(b, 1, epoch=1, epochs=5, status="running")
    fake._set("101", state="FAILED", reason="NonZeroExitCode")
    st = b.observe()[1]
    assert (st.state, st.epochs_done) == (FAILED, 1.0)
    del fake.jobs_["101"]  # Slurm forgets it after MinJobAge
    assert b.observe()[1].state == FAILED
    with pytest.raises(BackendError, match="failed") as e:
        b.apply(req(), Target(1, 1))
    assert not e.value.retryable


def test_cancel(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    b.cancel(99)  # unknown: ignored
    b.apply(req(), Target(1, 1))
    fake.run()
    b.cancel(1)
    assert fake.calls[-1] == ("cancel", "101")
    st = b.observe()[1]
    assert (st.state, st.message) == (FAILED, "cancelled by dl2d")
    with pytest.raises(BackendError, match="cancelled"):
        b.apply(req(), Target(1, 1))


def test_crash_after_submit_adopts_the_slurm_job_instead_of_submitting_twice(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    b.apply(req(), Target(2, 1))
    # Simulate a daemon killed between sbatch and the record update.
    rec_path = b.job_dir(1) / "record.json"
    rec = json.loads(rec_path.read_text())
    rec.update(slurm_job_id=None, slurm_job_ids=[], submitting=True, applied=None)
    rec_path.write_text(json.dumps(rec))
    fake.run()
    again = make_backend(tmp_path, fake)
    st = again.observe()[1]
    assert (st.state, st.backend_ref, st.workers) == (RUNNING, "101", 2)
    assert again.apply(req(), Target(2, 1)).method == NOOP
    assert [c[0] for c in fake.calls] == ["submit"]


def test_other_jobs_with_a_dl2d_comment_are_not_adopted(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    fake.submit(JobSpec(name="someone-else", command="sleep 1", dl2d_job_id="1"))
    assert b.apply(req(), Target(1, 1)).method == START
    assert b.observe()[1].backend_ref == "102"


def test_controller_outage_is_a_retryable_backend_error(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    fake.down = True
    for call in (b.observe, b.nodes, lambda: b.apply(req(), Target(1, 1)),
                 lambda: b.drain("node1", "x")):
        with pytest.raises(BackendError) as e:
            call()
        assert e.value.retryable, e.value
        assert "unavailable" in str(e.value)
    fake.down = False
    assert b.apply(req(), Target(1, 1)).method == START


def test_slurm_refusal_is_not_retryable(tmp_path):
    fake = FakeSlurm()

    def refuse(node, reason):
        raise SlurmError("scontrol failed", command=("scontrol",), returncode=1,
                         stderr="Invalid node name specified")
    fake.drain_node = refuse
    b = make_backend(tmp_path, fake)
    with pytest.raises(BackendError, match="Invalid node name") as e:
        b.drain("nodeX", "x")
    assert not e.value.retryable


def test_nodes_drain_resume(tmp_path):
    fake = FakeSlurm(nodes=2)
    b = make_backend(tmp_path, fake)
    assert b.nodes() == [NodeInfo("node1", 4, 16, 16000 / 1024, True, ""),
                         NodeInfo("node2", 4, 16, 16000 / 1024, True, "")]
    b.drain("node2", "agent stale")
    assert [(n.name, n.usable, n.reason) for n in b.nodes()] == [
        ("node1", True, ""), ("node2", False, "agent stale")]
    b.resume("node2")
    assert all(n.usable for n in b.nodes())
    b.end_slot(1200)  # real time: returns at once


def test_targets_that_cannot_fit_are_clear_errors(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    with pytest.raises(BackendError, match="needs 8 GPUs"):
        b.apply(req(worker={"gpus": 8}), Target(1, 1))
    with pytest.raises(BackendError, match="negative"):
        b.apply(req(), Target(-1, 1))
    with pytest.raises(BackendError, match="no command or script"):
        b.apply(JobRequest(2, "vgg-16", 3, spec={}), Target(1, 1))
    for n in list(fake.node_list):
        b.drain(n.name, "all gone")
    with pytest.raises(BackendError, match="no usable") as e:
        b.apply(req(), Target(1, 1))
    assert e.value.retryable


def test_config_validation(tmp_path):
    with pytest.raises(ValueError, match="restart_method"):
        SlurmBackendConfig(state_dir=tmp_path, restart_method="magic")
    with pytest.raises(ValueError, match="checkpoint_timeout_s"):
        SlurmBackendConfig(state_dir=tmp_path, checkpoint_timeout_s=0)


class CountingSlurm(FakeSlurm):
    def __init__(self):
        super().__init__()
        self.reads = {"jobs": 0, "nodes": 0}

    def jobs(self):
        self.reads["jobs"] += 1
        return super().jobs()

    def nodes(self):
        self.reads["nodes"] += 1
        return super().nodes()


def test_a_slot_of_noop_applies_costs_one_squeue_and_one_sinfo(tmp_path):
    fake = CountingSlurm()
    b = make_backend(tmp_path, fake)
    for i in range(1, 21):
        b.apply(req(i), Target(1, 1))
    fake.run()
    fake.reads = {"jobs": 0, "nodes": 0}
    b.observe()
    for i in range(1, 21):
        assert b.apply(req(i), Target(1, 1)).method == NOOP
    assert fake.reads == {"jobs": 1, "nodes": 1}
    # A change made through the backend drops the cached lists.
    assert b.apply(req(1), Target(0, 0)).method == STOP
    assert b.apply(req(1), Target(1, 1)).method == START
    assert b.apply(req(2), Target(1, 1)).method == NOOP
    assert fake.reads["jobs"] > 1


def test_a_job_that_ended_before_its_checkpoint_signal_is_not_an_error(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    b.apply(req(), Target(1, 1))
    fake.run()

    def signal(job_id, sig):  # it checkpointed on its own just before the signal came
        fake._set("101", state="COMPLETED")
        raise SlurmError("scancel failed", command=("scancel",), returncode=1,
                         stderr="Job/step already completing or completed")
    fake.signal = signal
    write_progress(b, 1, epoch=2, epochs=5, status="checkpointed")
    r = b.apply(req(), Target(5, 1))
    assert (r.method, r.backend_ref) == (RESTART, "102")


def test_changes_are_decided_on_fresh_lists_not_on_the_cached_ones(tmp_path):
    """Instance a's lists are stale after instance b shrank the job: a must not shrink again."""
    fake = FakeSlurm()
    a = make_backend(tmp_path, fake)
    a.apply(req(), Target(6, 1))
    fake.run()
    a.observe()  # a caches: 2 nodes
    b = make_backend(tmp_path, fake)
    assert b.apply(req(), Target(2, 1)).method == SHRINK
    n = len(fake.calls)
    assert a.apply(req(), Target(2, 1)).method == NOOP
    assert len(fake.calls) == n


# -- node selection from the target's placement (DLTAP) ---------------------------------------

def test_target_selection_and_its_allocation():
    from dl2d.daemon.slurm_backend import allocation_for_selection, target_selection

    assert target_selection(Target(2, 1)) is None
    # DLTAP Fig. 1(b): wk1, wk3, ps1 on node1; ps2 on node2; wk2 on node3
    sel = target_selection(Target(3, 2, ("node1", "node3", "node1"), ("node1", "node2")))
    assert sel.nodelist == ("node1", "node2", "node3") and sel.tasks_per_node == (3, 1, 1)
    assert sel.hostfile == ("node1", "node2", "node1", "node3", "node1")
    assert allocation_for_selection(sel, Demand()) == Allocation(3, 2)  # node1 holds 2 workers
    assert allocation_for_selection(sel, Demand(gpus_per_worker=2)) == Allocation(3, 4)
    ps_only = target_selection(Target(0, 2, (), ("node4", "node4")))
    assert ps_only.nodelist == ("node4",) and allocation_for_selection(ps_only, Demand()) == Allocation(1, 0)
    with pytest.raises(ValueError, match="places 1 workers / 1 PS on nodes but asks for 2/1"):
        target_selection(Target(2, 1, ("node1",), ("node1",)))


def test_a_placed_target_is_submitted_on_its_nodes(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake, placement="target")
    t = Target(3, 1, ("node3", "node2", "node3"), ("node3",))
    assert b.apply(req(), t).method == START
    spec = fake.specs["101"]
    assert spec.nodelist == ("node3", "node2") and (spec.nodes, spec.gpus_per_node) == (2, 2)
    d = b.job_dir(1)
    assert (d / "hostfile").read_text().split() == ["node3", "node3", "node2", "node3"]  # PS first
    assert f"DL2D_HOSTFILE={d / 'hostfile'}" in (d / "target.env").read_text()
    assert json.loads((d / "target.json").read_text())["worker_nodes"] == ["node3", "node2", "node3"]
    assert json.loads((d / "record.json").read_text())["nodelist"] == ["node3", "node2"]
    n = len(fake.calls)
    assert b.apply(req(), t).method == NOOP  # pending at that placement: idempotent
    fake.run()
    again = make_backend(tmp_path, fake, placement="target")
    assert again.apply(req(), t).method == NOOP  # running, after a daemon restart
    assert len(fake.calls) == n
    # an unplaced target keeps the allocation rule and lets Slurm choose the nodes
    assert b.apply(req(job_id=2), Target(2, 1)).method == START
    assert fake.specs["102"].nodelist == () and not (b.job_dir(2) / "hostfile").exists()
    assert "DL2D_HOSTFILE" not in (b.job_dir(2) / "target.env").read_text()


def test_a_placement_on_unknown_nodes_or_incomplete_is_a_clear_error(tmp_path):
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake, placement="target")
    with pytest.raises(BackendError, match="nodes Slurm does not know: gpu9"):
        b.apply(req(), Target(1, 1, ("gpu9",), ("node1",)))
    with pytest.raises(BackendError, match="places 1 workers / 0 PS"):
        b.apply(req(), Target(1, 1, ("node1",), ()))
    assert not [c for c in fake.calls if c[0] == "submit"]


def test_placement_slurm_ignores_the_targets_nodes(tmp_path):
    """The default: the allocation rule, Slurm picks the nodes (a policy's load-balancing placement on
    the daemon's view of the cluster is not forced on a shared cluster)."""
    fake = FakeSlurm()
    b = make_backend(tmp_path, fake)
    assert b.apply(req(), Target(3, 1, ("node3", "node2", "node3"), ("node3",))).method == START
    spec = fake.specs["101"]
    assert spec.nodelist == () and (spec.nodes, spec.gpus_per_node) == (1, 3)
    assert not (b.job_dir(1) / "hostfile").exists()
    with pytest.raises(ValueError, match="placement must be one of slurm, target"):
        make_backend(tmp_path, fake, placement="dltap")
