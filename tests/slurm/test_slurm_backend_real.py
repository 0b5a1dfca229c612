"""SlurmBackend against the real local Slurm (4 nodes x 4 fake GPUs, see conftest), running the
demo training job that reports epochs and checkpoints on SIGUSR1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dl2d.daemon.backend import (
    FAILED,
    FINISHED,
    NOOP,
    PENDING,
    RESTART,
    RUNNING,
    SHRINK,
    START,
    STOP,
    BackendError,
    JobRequest,
    Target,
)
from dl2d.daemon.slurm.backend import SlurmBackend
from dl2d.daemon.slurm.settings import SlurmBackendConfig

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
#: Small per-task demands, stated (resnet-50's defaults, 8 GB per worker, would fit one worker per 15.6 GB
#: node): the allocations below are counted in GPUs.
DEMANDS = {"worker": {"gpus": 1, "cpus": 1, "mem_gb": 0}, "ps": {"cpus": 1, "mem_gb": 0}}


def demo_request(job_id: int, epochs: int, seconds_per_epoch: float = 0.5) -> JobRequest:
    # The backend's batch script exports DL2D_CHECKPOINT_DIR / DL2D_PROGRESS_FILE.
    command = (f"exec {sys.executable} -m dl2d.slurm.demo_job --epochs {epochs}"
               ' --checkpoint "$DL2D_CHECKPOINT_DIR/ckpt.json" --progress "$DL2D_PROGRESS_FILE"'
               f" --seconds-per-epoch {seconds_per_epoch}")
    return JobRequest(job_id=job_id, job_type="resnet-50", total_epochs=epochs,
                      spec={"command": command, "time_limit_min": 10, **DEMANDS})


def backend(slurm, state_dir: Path, **kw) -> SlurmBackend:
    # run_jobs_as = "daemon": these jobs are the test's (root's); tests/slurm/test_jobs_run_as_owner.py runs one
    # as its owner
    config = SlurmBackendConfig(state_dir=state_dir, workdir=str(REPO), run_jobs_as="daemon",
                                checkpoint_timeout_s=20, **kw)
    return SlurmBackend(slurm.driver(), config)


def status_when(b: SlurmBackend, job_id: int, wait_for, timeout: float, what: str, **want):
    """The job's status once all ``want`` fields match (``epochs_min`` for epochs_done >=)."""
    epochs_min = want.pop("epochs_min", None)

    def check():
        st = b.observe().get(job_id)
        if st is None or any(getattr(st, k) != v for k, v in want.items()):
            return None
        if epochs_min is not None and st.epochs_done < epochs_min:
            return None
        return st
    return wait_for(check, timeout, what)


def progress(b: SlurmBackend, job_id: int) -> dict:
    try:
        return json.loads((b.job_dir(job_id) / "job" / "progress.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def test_lifecycle_start_shrink_grow_stop_start_and_daemon_restart(slurm, wait_for, tmp_path):
    b = backend(slurm, tmp_path / "state")
    job = demo_request(301, epochs=60)

    r = b.apply(job, Target(6, 1))  # 6 workers x 1 GPU: 2 nodes x 3 GPUs
    assert r.method == START
    st = status_when(b, 301, wait_for, 30, "the job running with an epoch done",
                     state=RUNNING, epochs_min=1)
    assert (st.workers, st.ps, len(st.nodes), st.backend_ref) == (6, 1, 2, r.backend_ref)
    assert b.apply(job, Target(6, 1)).method == NOOP

    # A restarted daemon (new backend instance, same state dir) sees the same job and does
    # not resize it again.
    b2 = backend(slurm, tmp_path / "state")
    seen = b2.observe()[301]
    assert (seen.state, seen.workers, seen.nodes, seen.backend_ref) == (
        RUNNING, 6, st.nodes, st.backend_ref)
    assert b2.apply(job, Target(6, 1)).method == NOOP
    slurm_job = next(j for j in slurm.driver().jobs() if j.job_id == r.backend_ref)
    assert (slurm_job.state, slurm_job.num_nodes, slurm_job.restarts) == ("RUNNING", 2, 0)

    # Shrink in place: 3 workers use all of one of its nodes (2 would leave a GPU held there: a relaunch).
    assert b2.apply(job, Target(3, 1)).method == SHRINK
    st = status_when(b2, 301, wait_for, 15, "the job on one node", state=RUNNING, workers=3)
    assert len(st.nodes) == 1 and st.backend_ref == r.backend_ref
    assert b.apply(job, Target(3, 1)).method == NOOP  # the first instance agrees

    # Grow beyond the allocation: checkpoint, resubmit at 2 nodes x 4 GPUs, resume.
    t0 = time.monotonic()
    r2 = b.apply(job, Target(8, 1))
    t_apply = time.monotonic() - t0
    assert r2.method == RESTART and r2.backend_ref != r.backend_ref
    saved = json.loads((b.job_dir(301) / "job" / "checkpoint" / "ckpt.json").read_text())["epoch"]
    assert saved >= 1
    st = status_when(b, 301, wait_for, 30, "the relaunched job running", state=RUNNING,
                     backend_ref=r2.backend_ref)
    assert len(st.nodes) == 2 and st.workers == 8
    print(f"resubmit restart: apply {t_apply:.1f}s, {time.monotonic() - t0:.1f}s to RUNNING")
    wait_for(lambda: progress(b, 301).get("runs") == 2, 15, "the second run's progress")
    p = progress(b, 301)
    assert p["resumed_from"] == saved and p["slurm_job_id"] == r2.backend_ref
    assert b.observe()[301].epochs_done >= saved
    assert b2.apply(job, Target(8, 1)).method == NOOP

    # Stop (checkpoint, the Slurm job ends, the checkpoint stays), then start again.
    wait_for(lambda: progress(b, 301).get("epoch", 0) > saved, 15, "an epoch after resuming")
    assert b.apply(job, Target(0, 0)).method == STOP
    st = b.observe()[301]
    assert (st.state, st.workers, st.ps) == (PENDING, 0, 0) and "stopped" in st.message
    stopped_at = json.loads((b.job_dir(301) / "job" / "checkpoint" / "ckpt.json").read_text())["epoch"]
    assert stopped_at > saved and st.epochs_done == stopped_at
    assert not any(j.active for j in slurm.driver().jobs() if j.comment == "dl2d:301")
    assert b2.apply(job, Target(0, 0)).method == NOOP

    r3 = b2.apply(job, Target(1, 1))
    assert r3.method == START
    status_when(b2, 301, wait_for, 30, "the restarted job running", state=RUNNING,
                backend_ref=r3.backend_ref)
    wait_for(lambda: progress(b2, 301).get("runs") == 3, 15, "the third run's progress")
    assert progress(b2, 301)["resumed_from"] == stopped_at

    b2.cancel(301)
    st = status_when(b, 301, wait_for, 15, "the cancelled job", state=FAILED)
    assert st.message == "cancelled by dl2d"
    with pytest.raises(BackendError, match="cancelled"):
        b.apply(job, Target(1, 1))


def test_grow_by_requeue_resumes_from_the_checkpoint(slurm, wait_for, tmp_path):
    b = backend(slurm, tmp_path / "state", restart_method="requeue")
    job = demo_request(302, epochs=60)
    r = b.apply(job, Target(4, 1))  # 1 node x 4 GPUs
    assert r.method == START
    status_when(b, 302, wait_for, 30, "the job running", state=RUNNING, epochs_min=1)

    t0 = time.monotonic()
    r2 = b.apply(job, Target(8, 1))  # 2 nodes x 4 GPUs: same GPUs per node, so requeue
    assert (r2.method, r2.backend_ref) == (RESTART, r.backend_ref)
    saved = json.loads((b.job_dir(302) / "job" / "checkpoint" / "ckpt.json").read_text())["epoch"]
    assert b.observe()[302].state == PENDING
    assert b.apply(job, Target(8, 1)).method == NOOP  # pending at the new size
    # Slurm holds a requeued job for cred_expire (10 s in the local Slurm).
    st = status_when(b, 302, wait_for, 40, "the requeued job running", state=RUNNING)
    print(f"requeue restart: {time.monotonic() - t0:.1f}s from apply to RUNNING")
    assert len(st.nodes) == 2 and st.backend_ref == r.backend_ref
    job_now = next(j for j in slurm.driver().jobs() if j.job_id == r.backend_ref)
    assert job_now.restarts == 1
    wait_for(lambda: progress(b, 302).get("runs") == 2, 15, "the requeued run's progress")
    assert progress(b, 302)["resumed_from"] == saved


def test_finished_and_failed_jobs(slurm, wait_for, tmp_path):
    b = backend(slurm, tmp_path / "state")
    done = demo_request(303, epochs=2, seconds_per_epoch=0.2)
    bad = JobRequest(job_id=304, job_type="vgg-16", total_epochs=3, spec={
        "command": 'echo \'{"epoch": 1, "status": "running"}\' > "$DL2D_PROGRESS_FILE"; '
                   "echo training diverged >&2; exit 3"})
    assert b.apply(done, Target(1, 1)).method == START
    assert b.apply(bad, Target(1, 1)).method == START
    st = status_when(b, 303, wait_for, 30, "the short job finished", state=FINISHED)
    assert st.epochs_done == 2.0
    st = status_when(b, 304, wait_for, 30, "the bad job failed", state=FAILED)
    assert st.epochs_done == 1.0 and "FAILED" in st.message, st
    out = (b.job_dir(304) / "job" / f"slurm-{st.backend_ref}.out").read_text()
    assert "training diverged" in out
    with pytest.raises(BackendError, match="failed") as e:
        b.apply(bad, Target(1, 1))
    assert not e.value.retryable
    assert b.apply(done, Target(1, 1)).method == NOOP  # done: nothing to start


def test_drain_and_resume_a_node(slurm, wait_for, tmp_path):
    b = backend(slurm, tmp_path / "state")
    nodes = {n.name: n for n in b.nodes()}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    assert all(n.usable and (n.gpus, n.cpus) == (4, 16) and n.mem_gb > 15 for n in nodes.values())
    b.drain("node3", "dl2d: agent stale")
    n3 = next(n for n in b.nodes() if n.name == "node3")
    assert not n3.usable and n3.reason == "dl2d: agent stale"
    b.resume("node3")
    # slurmctld may ping the node again first (idle+NOT_RESPONDING for a moment).
    wait_for(lambda: next(n for n in b.nodes() if n.name == "node3").usable, 30,
             "node3 usable after resume")
    with pytest.raises(BackendError) as e:
        b.drain("node99", "no such node")
    assert not e.value.retryable


def test_elastic_job_is_scaled_hot_inside_its_allocation(slurm, wait_for, tmp_path):
    """dl2-run inside the allocation: more workers and PS fit on the held node, so the backend
    scales the running job through its coordinator (HOT) instead of relaunching it."""
    b = backend(slurm, tmp_path / "state", hot_scale_timeout_s=20)
    command = (f"exec {sys.executable} -m dl2d.elastic.launcher --workers $DL2D_WORKERS"
               " --ps $DL2D_PS --epochs 200 --checkpoint-dir \"$DL2D_CHECKPOINT_DIR\""
               " --progress-file \"$DL2D_PROGRESS_FILE\" --progress-interval 0.2 --quiet")
    job = JobRequest(job_id=305, job_type="resnet-50", total_epochs=200,
                     spec={"command": command, "time_limit_min": 10, **DEMANDS})
    r = b.apply(job, Target(2, 1))  # 1 node x 2 GPUs
    assert r.method == START and b.observe()[305].hot_scaling
    wait_for(lambda: progress(b, 305).get("state") == "running"
             and progress(b, 305).get("workers") == 2, 60, "dl2-run training with 2 workers")
    # 1 more worker needs a 3rd GPU per node: not in the allocation -> would restart; 2 -> 1
    # worker and 1 -> 2 PS fits (PS need no GPU): hot.
    t0 = time.monotonic()
    r2 = b.apply(job, Target(1, 2))
    print(f"hot scaling: apply {time.monotonic() - t0:.2f}s")
    assert (r2.method, r2.backend_ref) == ("hot", r.backend_ref)
    wait_for(lambda: (p := progress(b, 305)).get("workers") == 1 and p.get("ps") == 2, 30,
             "the job's own report of 1 worker and 2 PS")
    st = b.observe()[305]
    assert (st.state, st.workers, st.ps, st.backend_ref) == (RUNNING, 1, 2, r.backend_ref)
    resize = progress(b, 305).get("last_resize") or {}
    assert resize.get("method") == "hot", resize
    print(f"hot {resize.get('kind')}: suspension {resize.get('suspension_s')} s, total {resize.get('t_total')} s")
    assert b.apply(job, Target(1, 2)).method == NOOP
    strangers_are_refused_and_the_job_trains_on(b, 305, wait_for, tmp_path)


def strangers_are_refused_and_the_job_trains_on(b: SlurmBackend, job_id: int, wait_for, tmp_path: Path) -> None:
    """Issue #14, acceptance: strangers at a running job's coordinator (its address is in the job's directory)
    are refused, and the job trains on at its size. Another unix user (nobody, through bash's /dev/tcp: no
    Python of ours) sends SHUTDOWN and SCALE frames; root without the job's secret, and with a wrong one, asks
    for a SCALE through dl2d's own client."""
    from dl2d.elastic import control
    from dl2d.elastic import protocol as P
    from dl2d.elastic.auth import AuthError

    coordinator, _ = b._dir(job_id).coordinator()
    host, port = coordinator["address"].rsplit(":", 1)
    frames = b"".join(bytes(x) for h in ({"op": "SHUTDOWN"}, {"op": "SCALE", "workers": 64, "ps": 8, "method": "hot",
                                                               "timeout": 5}) for x in P.encode(h))
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "bash", "-c",
                        f"exec 3<>/dev/tcp/{host}/{port}; cat >&3; timeout 10 head -c 4000 <&3"],
                       input=frames, capture_output=True, timeout=30, cwd="/")
    reply = r.stdout.decode("utf-8", "replace")
    assert "AUTH_CHALLENGE" in reply and re.search(r'"ok":\s*false', reply), (reply, r.stderr)
    assert not re.search(r'"ok":\s*true', reply), reply
    for secret in (None, "w" * 64):
        with pytest.raises((AuthError, ConnectionError)):
            control.scale(coordinator["address"], workers=1, ps=1, method="hot", timeout=5, secret=secret)
    before = progress(b, job_id).get("step", 0)
    wait_for(lambda: (p := progress(b, job_id)).get("step", 0) > before + 5 and p.get("state") == "running", 30,
             "the job training on after the strangers")
    p = progress(b, job_id)
    st = b.observe()[job_id]
    assert (p.get("workers"), p.get("ps"), st.state, st.workers, st.ps) == (1, 2, RUNNING, 1, 2), (p, st)


def test_a_dltap_placement_runs_on_exactly_its_nodes(slurm, wait_for, tmp_path):
    """A target placed by DLTAP (3 workers + 1 PS on node3/node2, as slurm_node_selection orders them)
    is submitted with --nodelist and runs on exactly those nodes, per squeue and scontrol."""
    b = backend(slurm, tmp_path / "state", placement="target")
    job = demo_request(306, epochs=60, seconds_per_epoch=0.5)
    t = Target(3, 1, ("node3", "node2", "node3"), ("node3",))
    assert b.apply(job, t).method == START
    st = status_when(b, 306, wait_for, 30, "the placed job running", state=RUNNING)
    assert sorted(st.nodes) == ["node2", "node3"]
    live = next(j for j in slurm.driver().jobs() if j.job_id == st.backend_ref)
    assert (live.num_nodes, live.gpus_per_node) == (2, 2)
    out = subprocess.run(["scontrol", "show", "job", st.backend_ref], capture_output=True, text=True,
                         env={**os.environ, **slurm.env}, timeout=15, check=True).stdout
    fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
    assert fields["ReqNodeList"] == "node[2-3]" and fields["NodeList"] == "node[2-3]", out
    hostfile = (b.job_dir(306) / "hostfile").read_text().split()
    assert hostfile == ["node3", "node3", "node2", "node3"]
    assert b.apply(job, Target(0, 0)).method == STOP


def test_a_two_gpu_per_worker_job_is_planned_and_run_with_two(slurm, wait_for, tmp_path):
    """One demand for everyone: a job whose spec asks 2 GPUs per worker is planned with 2 by the policy (DRF
    on the view of this Slurm's nodes) and by the guardrails, and Slurm runs it with 2 GPUs per worker."""
    from dl2d.daemon import plan as P
    from dl2d.policy import registry

    b = backend(slurm, tmp_path / "state")
    spec = {**demo_request(307, epochs=60).spec, "worker": {"gpus": 2, "cpus": 1, "mem_gb": 0}, "max_ps": 1}
    row = P.job_row(307, "resnet-50", 60.0, 0.0, 0, 0, 0, spec, "two-gpu")
    view = P.build_view(0, [row], b.nodes())
    assert view.worker_demand[0].tolist() == [2.0, 1.0, 0.0]
    g = P.guard(view, registry.build("drf"), registry.make_heuristic("fifo"), {}, 6)
    assert g.source == "policy" and P.check_allocation(view, g.allocation) is None
    workers = int(g.allocation.workers[0])
    assert workers == int(view.capacity[:, 0].sum()) // 2  # every GPU of the cluster, two per worker
    (planned,), _ = P.plan_targets(view, g.allocation, list(view.node_names), {307: (row.max_workers, 1)})
    assert b.apply(JobRequest(307, "resnet-50", 60.0, spec), planned.target).method == START
    st = status_when(b, 307, wait_for, 30, "the 2-GPU job running", state=RUNNING)
    live = next(j for j in slurm.driver().jobs() if j.job_id == st.backend_ref)
    assert live.num_nodes * live.gpus_per_node == 2 * workers  # Slurm gave it 2 GPUs per worker
    assert b.apply(JobRequest(307, "resnet-50", 60.0, spec), Target(0, 0)).method == STOP


def test_an_all_reduce_job_starts_as_nodes_x_gpus_and_is_shrunk(slurm, wait_for, tmp_path):
    """An all-reduce job of 8 one-GPU workers, planned as the daemon plans it (its view: kind, no PS, the 8
    workers it asked for; Slurm-as-it-is gives exactly those), is started on the 4-GPU nodes as 2 nodes x
    --gres=gpu:4 with no PS, then shrunk in place to the one node its 4 workers need, then stopped."""
    from dl2d.daemon import plan as P
    from dl2d.policy import registry

    b = backend(slurm, tmp_path / "state")
    spec = {**demo_request(308, epochs=60).spec, "kind": "allreduce", "batch_size": 96.0, "workers": 8, "launch": "once",
            "worker": {"gpus": 1, "cpus": 1, "mem_gb": 0}}
    del spec["ps"]
    row = P.job_row(308, "bert", 60.0, 0.0, 0, 0, 0, spec, "bert-8")
    view = P.build_view(0, [row], b.nodes())
    assert view.kind == ("allreduce",) and view.requested.tolist() == [8] and not view.ps_demand.any()
    g = P.guard(view, registry.build("slurm"), registry.make_heuristic("fifo"), {}, 6)
    assert g.source == "policy" and (int(g.allocation.workers[0]), int(g.allocation.ps[0])) == (8, 0)
    (planned,), _ = P.plan_targets(view, g.allocation, list(view.node_names), {308: (row.max_workers, row.max_ps)})
    job = JobRequest(308, "bert", 60.0, spec)
    assert (planned.target.workers, planned.target.ps) == (8, 0)

    r = b.apply(job, planned.target)
    assert r.method == START
    st = status_when(b, 308, wait_for, 30, "the all-reduce job running", state=RUNNING, epochs_min=1)
    assert (st.workers, st.ps, len(st.nodes)) == (8, 0, 2)
    live = next(j for j in slurm.driver().jobs() if j.job_id == r.backend_ref)
    assert (live.num_nodes, live.gpus_per_node) == (2, 4)  # nodes x GPUs per node, as Slurm holds it
    out = subprocess.run(["scontrol", "show", "job", r.backend_ref], capture_output=True, text=True,
                         env={**os.environ, **slurm.env}, timeout=15, check=True).stdout
    assert "gpu:4" in out and "NumNodes=2" in out, out
    assert json.loads((b.job_dir(308) / "target.json").read_text()) == {"workers": 8, "ps": 0}

    assert b.apply(job, Target(4, 0)).method == SHRINK  # 4 one-GPU workers fit one of its nodes
    st = status_when(b, 308, wait_for, 15, "the job on one node", state=RUNNING, workers=4)
    assert len(st.nodes) == 1 and st.ps == 0 and st.backend_ref == r.backend_ref
    live = next(j for j in slurm.driver().jobs() if j.job_id == r.backend_ref)
    assert (live.state, live.num_nodes, live.gpus_per_node) == ("RUNNING", 1, 4)
    assert b.apply(job, Target(4, 0)).method == NOOP
    assert b.apply(job, Target(0, 0)).method == STOP


def test_gpus_other_slurm_jobs_hold_are_never_counted_free(slurm, wait_for, tmp_path, strangers_job):
    """Another user's job holding a node's 4 GPUs (asked per job, ``--gpus=4``) and a job planted with a dl2d
    job's name and comment holding another node's: dl2d counts none of their GPUs free, sizes an all-reduce
    job that asks for 16 to the 8 left, and Slurm runs it at once beside them (not PENDING); its own GPUs are
    never counted as another's."""
    from dl2d.daemon import plan as P
    from dl2d.policy import registry
    from dl2d.slurm.driver import JobSpec

    strangers = {strangers_job(4)}
    strangers.add(slurm.driver().submit(JobSpec(name="dl2d-309", command="sleep 600", user="nobody", workdir="/tmp",
                                                output="/dev/null", gpus_per_node=4, dl2d_job_id="309")))
    wait_for(lambda: all(j.state == "RUNNING" for j in slurm.driver().jobs() if j.job_id in strangers), 30,
             "the two strangers' jobs running")
    b = backend(slurm, tmp_path / "state")
    assert sorted(n.gpus_other for n in b.nodes()) == [0, 0, 4, 4]

    spec = {**demo_request(309, epochs=60).spec, "kind": "allreduce", "batch_size": 192.0, "workers": 16,
            "launch": "once", "worker": {"gpus": 1, "cpus": 1, "mem_gb": 0}}
    del spec["ps"]
    row = P.job_row(309, "bert", 60.0, 0.0, 0, 0, 0, spec, "bert-16")
    view = P.build_view(0, [row], b.nodes())
    assert view.capacity[:, 0].sum() == 8 and view.free[:, 0].sum() == 8
    g = P.guard(view, registry.build("drf"), registry.make_heuristic("fifo"), {}, 6)
    assert g.source == "policy" and int(g.allocation.workers[0]) == 8
    (planned,), _ = P.plan_targets(view, g.allocation, list(view.node_names), {309: (row.max_workers, row.max_ps)})
    r = b.apply(JobRequest(309, "bert", 60.0, spec), planned.target)
    assert r.method == START
    st = status_when(b, 309, wait_for, 30, "the job running beside the strangers", state=RUNNING, epochs_min=1)
    assert (st.workers, len(st.nodes)) == (8, 2)
    others = {n.name: n.gpus_other for n in b.nodes()}
    assert all(others[n] == 0 for n in st.nodes) and sum(others.values()) == 8  # its own GPUs are its own
    assert all(slurm.driver().job(j).active for j in strangers)  # left alone
    assert b.apply(JobRequest(309, "bert", 60.0, spec), Target(0, 0)).method == STOP
