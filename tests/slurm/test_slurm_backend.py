"""SlurmBackend, the I/O shell, over an in-memory Slurm (dl2d.slurm.memory) with real files in tmp_path:
idempotent applies across backend instances, the resize methods, adoption after a crash, errors, the
per-slot cost in Slurm calls. The pure parts have their own tests (test_slurm_mapping/planning/jobdir)."""

from __future__ import annotations

import json
import os
import pwd

import pytest

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
    BackendError,
    JobRequest,
    NodeInfo,
    Target,
)
from dl2d.daemon.slurm.backend import SlurmBackend
from dl2d.daemon.slurm.settings import SlurmBackendConfig
from dl2d.slurm.backoff import BackoffPolicy
from dl2d.slurm.driver import JobSpec, SlurmError
from dl2d.slurm.memory import InMemorySlurm

#: The per-task demands these tests size jobs by (the job type's defaults would put one 8 GB worker
#: per 15.6 GB node): 1 GPU and 1 core per worker, 1 core per PS, no memory.
DEMANDS = {"worker": {"gpus": 1, "cpus": 1, "mem_gb": 0}, "ps": {"cpus": 1, "mem_gb": 0}}


#: The owner of the jobs below: the user running the tests.
ME = pwd.getpwuid(os.geteuid()).pw_name


def make_backend(tmp_path, fake, **cfg) -> SlurmBackend:
    config = SlurmBackendConfig(state_dir=tmp_path / "state", checkpoint_timeout_s=1.0,
                                poll_interval_s=0.01,
                                backoff=BackoffPolicy(base=0.001, cap=0.001, max_attempts=3),
                                **cfg)
    return SlurmBackend(fake, config)


def req(job_id=1, **spec) -> JobRequest:
    """A resnet-50 job whose spec states :data:`DEMANDS` (a ``worker``/``ps`` table given here wins key by
    key) and runs the demo job unless it says otherwise."""
    spec.setdefault("command", "exec python -m dl2d.slurm.demo_job --epochs 5")
    spec.setdefault("owner", ME)  # runs as its owner: this test's own user (no switch, nothing changes hands)
    for role, demand in DEMANDS.items():
        spec[role] = {**demand, **spec.get(role, {})}
    return JobRequest(job_id=job_id, job_type="resnet-50", total_epochs=5, spec=spec)


def write_progress(backend, job_id, **progress):
    p = backend.job_dir(job_id) / "job" / "progress.json"  # in the job's own directory
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(progress))


def test_start_is_idempotent_also_for_a_new_backend_instance(tmp_path):
    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake)
    r = b.apply(req(), Target(2, 1))
    assert (r.method, r.backend_ref) == (START, "101")
    spec = fake.specs["101"]
    token = b._record(1)["submit_token"]  # the submission's own secret, in the comment beside the id
    assert len(token) == 32 and (spec.nodes, spec.gpus_per_node, spec.comment, spec.name) == (1, 2, f"dl2d:1:{token}",
                                                                                           "dl2d-1")
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
    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake)
    fake.on_checkpoint = lambda jid: write_progress(b, 1, epoch=3, epochs=5, status="checkpointed")
    b.apply(req(), Target(6, 1))  # 2 nodes x 3 GPUs
    fake.run()
    assert b.apply(req(), Target(3, 1)).method == SHRINK  # one of its nodes, all of whose 3 GPUs it uses
    assert fake.calls[-1] == ("shrink", "101", 1)
    assert b.observe()[1].nodes == ("node1",)
    assert json.loads((b.job_dir(1) / "target.json").read_text()) == {"workers": 3, "ps": 1}
    assert b.apply(req(), Target(3, 1)).method == NOOP

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
    fake = InMemorySlurm()
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
    fake = InMemorySlurm()
    fake.ignore_signals = True
    b = make_backend(tmp_path, fake)
    b.apply(req(), Target(1, 1))
    fake.run()
    assert b.apply(req(), Target(0, 0)).method == STOP
    # the checkpoint signal, then after the deadline SIGKILL (scancel's SIGTERM could be held off) and scancel
    assert [c[0] for c in fake.calls[-3:]] == ["signal", "signal", "cancel"]
    assert [c[2] for c in fake.calls[-3:-1]] == ["USR1", "KILL"]


def test_restart_of_a_job_that_finishes_meanwhile_submits_nothing(tmp_path):
    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake)
    fake.on_checkpoint = lambda jid: write_progress(b, 1, epoch=5, epochs=5, status="done")
    b.apply(req(), Target(1, 1))
    fake.run()
    assert b.apply(req(), Target(5, 1)).method == NOOP
    assert [c[0] for c in fake.calls] == ["submit", "signal"]
    assert b.observe()[1].state == FINISHED
    assert b.apply(req(), Target(5, 1)).method == NOOP


def test_pending_job_at_another_size_is_replaced(tmp_path):
    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake)
    b.apply(req(), Target(1, 1))
    r = b.apply(req(), Target(8, 1))
    assert (r.method, r.backend_ref) == (START, "102")
    assert fake.slurm_jobs["101"].state == "CANCELLED"
    assert b.observe()[1].backend_ref == "102"


def test_submit_makes_the_job_secret_before_sbatch_and_keeps_it_across_restarts(tmp_path):
    """The elastic runtime's secret (docs/elastic.md): written 0600 in the job's directory before the job is
    submitted, its path exported by the batch script, the same file (and secret) for every run of the job."""
    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake)
    secrets_at_submit = []
    submit = fake.submit
    path = b.job_dir(1) / "job" / "job.secret"  # in the directory the job owns
    fake.submit = lambda spec: (secrets_at_submit.append(path.read_text()), submit(spec))[1]
    b.apply(req(), Target(2, 1))
    assert path.stat().st_mode & 0o777 == 0o600 and len(secrets_at_submit[0].strip()) == 64
    assert f"export DL2D_JOB_SECRET_FILE={path}" in fake.specs["101"].script
    fake.run()
    b.apply(req(), Target(3, 1))  # a restart at a new size: the same secret
    assert len(secrets_at_submit) == 2 and secrets_at_submit[1] == secrets_at_submit[0] == path.read_text()


def test_hot_scaling_through_the_coordinator_and_fallback_to_restart(tmp_path):
    fake = InMemorySlurm()
    calls = []

    def scaler(addr, workers, ps, timeout, secret):
        assert secret == (b.job_dir(1) / "job" / "job.secret").read_text().strip()  # the job's own, made at submit
        calls.append((addr, workers, ps))
        if (workers, ps) == (3, 2):
            raise ConnectionRefusedError("coordinator gone")
        return {"method": "hot", "workers": workers, "ps": ps, "records": []}

    config = SlurmBackendConfig(state_dir=tmp_path / "state", checkpoint_timeout_s=1.0,
                                poll_interval_s=0.01)
    b = SlurmBackend(fake, config, scaler=scaler)
    job = req(command="dl2-run --workers $DL2D_WORKERS --ps $DL2D_PS "
                      "--checkpoint-dir $DL2D_CHECKPOINT_DIR", worker={"gpus": 1})
    b.apply(job, Target(3, 1))  # 1 node x 3 GPUs
    fake.run()
    (b.job_dir(1) / "job" / "checkpoint" / "coordinator.json").write_text(
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
    publish_coordinator(b, 1, "node1:4000")  # the relaunched dl2-run's
    # 4 workers + 1 PS hold 1 node x (4 GPUs, 5 cores); 3 workers + 2 PS fit there, but hot scaling
    # fails: relaunch instead.
    assert fake.specs[b.observe()[1].backend_ref].cpus_per_node == 5
    assert b.apply(job, Target(3, 2)).method == RESTART
    assert calls[-1] == ("node1:4000", 3, 2)
    # 4 workers + 2 PS need more than the relaunched job holds per node (3 GPUs, 5 cores): no hot attempt.
    fake.run()
    publish_coordinator(b, 1, "node1:4000")
    assert b.apply(job, Target(4, 2)).method == RESTART and calls[-1] == ("node1:4000", 3, 2)


def elastic_job() -> JobRequest:
    return req(command="dl2-run --workers $DL2D_WORKERS --ps $DL2D_PS --checkpoint-dir $DL2D_CHECKPOINT_DIR")


def publish_coordinator(backend, job_id, address, written=None):
    """What dl2-run does when it starts: its coordinator's address in the checkpoint directory."""
    path = backend.job_dir(job_id) / "job" / "checkpoint" / "coordinator.json"
    path.write_text(json.dumps({"address": address}))
    if written is not None:
        os.utime(path, (written, written))


def test_a_grow_that_the_held_nodes_host_is_hot(tmp_path):
    """5 workers got 2 nodes x 3 GPUs; 4 workers + 2 PS fit on them (2 + 2), though a new allocation for
    that size would be 1 node x 4 GPUs: scaled hot, Slurm untouched."""
    fake = InMemorySlurm()
    calls = []
    b = SlurmBackend(fake, SlurmBackendConfig(state_dir=tmp_path / "state"),
                     scaler=lambda addr, w, p, t, secret: calls.append((addr, w, p)) or {})
    assert b.apply(elastic_job(), Target(5, 1)).method == START
    assert fake.calls[-1] == ("submit", "101", 2, 3)
    fake.run()
    publish_coordinator(b, 1, "node1:4000")
    write_progress(b, 1, state="running", workers=5, ps=1)
    n = len(fake.calls)
    assert b.apply(elastic_job(), Target(4, 2)).method == HOT
    assert calls == [("node1:4000", 4, 2)] and len(fake.calls) == n
    assert b.apply(elastic_job(), Target(7, 1)).method == RESTART  # 4 workers on a node: beyond them
    assert fake.calls[-1] == ("submit", "102", 2, 4)


def test_a_runtime_that_cannot_scale_hot_now_is_restarted_without_trying(tmp_path):
    """The facts come from the job's runtime: a coordinator file left by an earlier run (older than
    the Slurm job's start) or a runtime that says it is still starting cannot take a hot resize."""
    fake = InMemorySlurm()
    calls = []
    b = SlurmBackend(fake, SlurmBackendConfig(state_dir=tmp_path / "state", checkpoint_timeout_s=1.0,
                                              poll_interval_s=0.01),
                     scaler=lambda addr, w, p, t, secret: calls.append((addr, w, p)) or {})
    b.apply(elastic_job(), Target(2, 1))  # 1 node x 2 GPUs
    fake.run()
    started = fake.slurm_jobs["101"].start_time
    publish_coordinator(b, 1, "node1:4000", written=started - 60)
    assert b.apply(elastic_job(), Target(1, 2)).method == RESTART  # fits the node; no coordinator of this run
    fake.run()  # now 1 node x 1 GPU
    publish_coordinator(b, 1, "node1:4001")
    write_progress(b, 1, state="starting")
    assert b.apply(elastic_job(), Target(1, 3)).method == RESTART  # fits the node; the runtime is not up
    assert calls == []
    fake.run()
    publish_coordinator(b, 1, "node1:4002")
    write_progress(b, 1, state="running")
    assert b.apply(elastic_job(), Target(1, 2)).method == HOT
    assert calls == [("node1:4002", 1, 2)]
    assert [c[0] for c in fake.calls] == ["submit", "signal", "submit", "signal", "submit"]


def test_jobs_are_sized_by_their_spec_and_their_types_defaults(tmp_path):
    """One source of the demand (the policy's): a spec that asks 2 GPUs per worker gets them, and what it
    does not say comes from the job type (resnet-50: 8 GB per worker, 4 GB per PS), not from defaults of
    the backend's own."""
    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake)
    job = JobRequest(1, "resnet-50", 5, {"command": "true", "worker": {"gpus": 2}, "owner": ME})
    assert b.apply(job, Target(2, 1)).method == START
    assert fake.calls[-1] == ("submit", "101", 2, 2)  # 8 + 8 GB exceed a 15.6 GB node: one worker each


def test_elastic_shrink_scales_down_before_releasing_nodes(tmp_path):
    fake = InMemorySlurm()
    order = []
    fake_shrink = fake.shrink
    fake.shrink = lambda jid, n: (order.append("shrink"), fake_shrink(jid, n))
    config = SlurmBackendConfig(state_dir=tmp_path / "state")
    b = SlurmBackend(fake, config,
                     scaler=lambda addr, w, p, t, secret: order.append(("scale", w, p)) or {})
    job = req(command="dl2-run --checkpoint-dir $DL2D_CHECKPOINT_DIR")
    b.apply(job, Target(8, 2))
    fake.run()
    (b.job_dir(1) / "job" / "checkpoint" / "coordinator.json").write_text('{"address": "node1:1"}')
    assert b.apply(job, Target(4, 1)).method == SHRINK  # 2 nodes x 4 GPUs -> 1
    assert order == [("scale", 4, 1), "shrink"]


def test_failed_job_is_reported_remembered_and_not_restarted(tmp_path):
    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake)
    b.apply(req(), Target(1, 1))
    fake.run()
    write_progress(b, 1, epoch=1, epochs=5, status="running")
    fake.set_job("101", state="FAILED", reason="NonZeroExitCode")
    st = b.observe()[1]
    assert (st.state, st.epochs_done) == (FAILED, 1.0)
    del fake.slurm_jobs["101"]  # Slurm forgets it after MinJobAge
    assert b.observe()[1].state == FAILED
    with pytest.raises(BackendError, match="failed") as e:
        b.apply(req(), Target(1, 1))
    assert not e.value.retryable


def test_cancel(tmp_path):
    fake = InMemorySlurm()
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
    fake = InMemorySlurm()
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
    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake)
    fake.submit(JobSpec(name="someone-else", command="sleep 1", dl2d_job_id="1"))
    assert b.apply(req(), Target(1, 1)).method == START
    assert b.observe()[1].backend_ref == "102"


def test_controller_outage_is_a_retryable_backend_error(tmp_path):
    fake = InMemorySlurm()
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
    fake = InMemorySlurm()

    def refuse(node, reason):
        raise SlurmError("scontrol failed", command=("scontrol",), returncode=1,
                         stderr="Invalid node name specified")
    fake.drain_node = refuse
    b = make_backend(tmp_path, fake)
    with pytest.raises(BackendError, match="Invalid node name") as e:
        b.drain("nodeX", "x")
    assert not e.value.retryable


def test_nodes_drain_resume(tmp_path):
    fake = InMemorySlurm(nodes=2)
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
    fake = InMemorySlurm()
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


class CountingSlurm(InMemorySlurm):
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
    b.observe()
    b.nodes()  # the daemon's first slot: nodes() reads every record once, for the Slurm ids that are dl2d's
    fake.reads = {"jobs": 0, "nodes": 0}
    records = []
    b._record = lambda job_id, read=b._record: records.append(job_id) or read(job_id)
    b.observe()
    b.nodes()  # every slot after: observe, then the nodes with what other Slurm jobs hold
    assert sorted(records) == list(range(1, 21))  # each job's record read once, by observe
    for i in range(1, 21):
        assert b.apply(req(i), Target(1, 1)).method == NOOP
    assert fake.reads == {"jobs": 1, "nodes": 1}
    # A change made through the backend drops the cached lists.
    assert b.apply(req(1), Target(0, 0)).method == STOP
    assert b.apply(req(1), Target(1, 1)).method == START
    assert b.apply(req(2), Target(1, 1)).method == NOOP
    assert fake.reads["jobs"] > 1


def test_a_job_that_ended_before_its_checkpoint_signal_is_not_an_error(tmp_path):
    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake)
    b.apply(req(), Target(1, 1))
    fake.run()

    def signal(job_id, sig):  # it checkpointed on its own just before the signal came
        fake.set_job("101", state="COMPLETED")
        raise SlurmError("scancel failed", command=("scancel",), returncode=1,
                         stderr="Job/step already completing or completed")
    fake.signal = signal
    write_progress(b, 1, epoch=2, epochs=5, status="checkpointed")
    r = b.apply(req(), Target(5, 1))
    assert (r.method, r.backend_ref) == (RESTART, "102")


def test_changes_are_decided_on_fresh_lists_not_on_the_cached_ones(tmp_path):
    """Instance a's lists are stale after instance b shrank the job: a must not shrink again."""
    fake = InMemorySlurm()
    a = make_backend(tmp_path, fake)
    a.apply(req(), Target(6, 1))
    fake.run()
    a.observe()  # a caches: 2 nodes
    b = make_backend(tmp_path, fake)
    assert b.apply(req(), Target(3, 1)).method == SHRINK
    n = len(fake.calls)
    assert a.apply(req(), Target(3, 1)).method == NOOP
    assert len(fake.calls) == n


# -- node selection from the target's placement (DLTAP) ---------------------------------------

def test_a_placed_target_is_submitted_on_its_nodes(tmp_path):
    fake = InMemorySlurm()
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
    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake, placement="target")
    with pytest.raises(BackendError, match="nodes Slurm does not know: gpu9"):
        b.apply(req(), Target(1, 1, ("gpu9",), ("node1",)))
    with pytest.raises(BackendError, match="places 1 workers / 0 PS"):
        b.apply(req(), Target(1, 1, ("node1",), ()))
    assert not [c for c in fake.calls if c[0] == "submit"]


def test_placement_slurm_ignores_the_targets_nodes(tmp_path):
    """The default: the allocation rule, Slurm picks the nodes (a policy's load-balancing placement on
    the daemon's view of the cluster is not forced on a shared cluster)."""
    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake)
    assert b.apply(req(), Target(3, 1, ("node3", "node2", "node3"), ("node3",))).method == START
    spec = fake.specs["101"]
    assert spec.nodelist == () and (spec.nodes, spec.gpus_per_node) == (1, 3)
    assert not (b.job_dir(1) / "hostfile").exists()
    with pytest.raises(ValueError, match="placement must be one of slurm, target"):
        make_backend(tmp_path, fake, placement="dltap")


def test_a_job_ignoring_its_checkpoint_signal_keeps_the_watchdog_fed(tmp_path):
    """Issue #15, item 2: apply waits checkpoint_timeout_s for the signalled job, then again after scancel;
    the daemon's watchdog ping (here a real Notifier on a unix datagram socket, WatchdogSec = 0.4 s) is fed
    throughout, so systemd never kills the healthy daemon."""
    import socket
    import time

    from dl2d.daemon.notify import Notifier

    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as srv:
        srv.bind(path)
        srv.setblocking(False)
        fake = InMemorySlurm()
        fake.ignore_signals = True
        fake.cancel_ends_job = False  # even scancel takes its time: both waits run to their timeout
        b = SlurmBackend(fake, SlurmBackendConfig(state_dir=tmp_path / "state", checkpoint_timeout_s=1.2,
                                                  poll_interval_s=0.05,
                                                  backoff=BackoffPolicy(base=0.001, cap=0.001, max_attempts=3)))
        b.heartbeat = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}).ping
        b.apply(req(), Target(1, 1))
        fake.run()
        pings: list[float] = []
        t0 = time.monotonic()
        with pytest.raises(BackendError, match="did not end after scancel"):
            b.apply(req(), Target(0, 0))
        took = time.monotonic() - t0
        while True:
            try:
                if srv.recv(64) == b"WATCHDOG=1":
                    pings.append(1)
            except BlockingIOError:
                break
    assert took >= 2.4  # two full waits
    assert len(pings) >= took / 0.4  # at least one ping per watchdog period (the notifier sends every 0.1 s)


def test_a_shrink_slurm_refuses_is_carried_out_by_a_relaunch(tmp_path):
    """Slurm refuses to resize a job it already resized when it has no slurmdbd (the update waits for an
    accounting index that never comes): the backend relaunches the job at the smaller size instead."""
    from dl2d.daemon.backend import RESTART
    from dl2d.slurm.driver import SlurmError

    fake = InMemorySlurm()
    b = make_backend(tmp_path, fake)
    b.apply(req(), Target(8, 1))  # 2 nodes x 4 GPUs
    fake.run()

    def refuse(job_id, num_nodes):
        raise SlurmError("Unexpected message received for job " + job_id)

    fake.shrink = refuse
    r = b.apply(req(), Target(2, 1))
    assert r.method == RESTART and [c[0] for c in fake.calls[-2:]] == ["signal", "submit"]
    assert b.apply(req(), Target(2, 1)).method == NOOP
