"""Issue #17 on the real local Slurm (4 nodes x 4 fake GPUs, 16 cores, 16000 MB; cores and memory are
consumable, see scripts/slurm-localhost.sh) with the real `dl2d` daemon under DRF and jobs from
`dl2ctl submit`:

1. every Slurm job asks for the CPUs, memory and GPUs its tasks need on each node (`scontrol show job -d`);
2. a job submitted without -t gets `[slurm] time_limit_min`;
3. the recorded finish time is Slurm's EndTime within a few seconds, also when the daemon was down when the
   job ended (it used to be the next slot or the restart);
4. a shrink that fits stays in the same Slurm job;
5. a job of 4 GPUs per worker takes 4 GPUs in the plan, and no pending job that fits waits beside idle nodes
   longer than the daemon takes to react (a slot plus the apply);

and the start-up check of the rights to drain nodes, run as a real non-operator user (`nobody`).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from test_daemon_on_slurm import SLOT_S, Harness, clean_env, demo_command, wait_alive

from dl2d.db.engine import session_scope
from dl2d.db.models import Allocation, Slot
from dl2d.slurm.parsing import expand_hostlist, parse_mem_mb

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
CLUSTER_GPUS = 16
#: per task: (GPUs, cores, MB) of the jobs below
TASKS = {"big": (4, 2, 1024), "mid": (2, 2, 1024), "small": (1, 1, 512)}
PS_TASK = (0, 1, 512)


def submit(h: Harness, name: str, kind: str, epochs: int, max_workers: int, limit: str | None) -> int:
    g, c, m = TASKS[kind]
    args = ["submit", "--db", h.db, "-J", name, "--type", "resnet-50", "--epochs", str(epochs),
            "--wrap", demo_command(epochs), "--gpus-per-worker", str(g), "--cpus-per-worker", str(c),
            "--mem-per-worker", f"{m}M", "--cpus-per-ps", "1", "--mem-per-ps", "512M", "--owner", name,
            "--max-workers", str(max_workers), "--json", *(["-t", limit] if limit else [])]
    return int(json.loads(h.dl2ctl(*args).stdout)["id"])


def show_job(slurm, slurm_id: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """`scontrol show job -d`: the job's fields and one dict per allocated node line
    (``Nodes=node1 CPU_IDs=0-2 Mem=1536 GRES=gpu:4(IDX:0-3)``)."""
    out = subprocess.run(["scontrol", "show", "job", "-d", slurm_id], capture_output=True, text=True,
                         env={**os.environ, **slurm.env}, check=True, timeout=15).stdout
    fields: dict[str, str] = {}
    nodes = []
    for line in out.splitlines():
        pairs = dict(re.findall(r"(\S+?)=(\S*)", line))
        if line.strip().startswith("Nodes=") and "CPU_IDs" in pairs:
            nodes.append(pairs)
        else:
            fields.update(pairs)
    return fields, nodes


def cpu_count(ids: str) -> int:
    return sum(int(b) - int(a) + 1 if b else 1
               for a, _, b in (r.partition("-") for r in ids.split(",")))


def check_requests(slurm, slurm_id: str, workers: int, ps: int, task: tuple[int, int, int],
                   record_alloc: dict) -> dict[str, str]:
    """Slurm shows, on every node of the job, the CPUs, memory and GPUs dl2d asked for, and they cover the
    tasks: the busiest node's share at least (workers spread evenly, PS anywhere)."""
    fields, nodes = show_job(slurm, slurm_id)
    g, c, m = task
    n = int(fields["NumNodes"])
    cpus, mem = record_alloc["cpus_per_node"], record_alloc["mem_mb_per_node"]
    assert fields["MinCPUsNode"] == str(cpus) and parse_mem_mb(fields["MinMemoryNode"]) == mem, fields
    # one line per group of nodes with the same allocation (Nodes=node[1-4] ...): together, all of its nodes
    assert sum(len(expand_hostlist(node["Nodes"])) for node in nodes) == n >= 1, nodes
    for node in nodes:  # each node: exactly what was asked
        assert cpu_count(node["CPU_IDs"]) == cpus and parse_mem_mb(node["Mem"]) == mem, node
        assert node["GRES"].startswith(f"gpu:{record_alloc['gpus_per_node']}("), node
    # ... and what is asked covers the tasks (the bug: NumCPUs=1 MinMemoryNode=0)
    busiest = -(-workers // n) if workers else 0
    assert record_alloc["gpus_per_node"] >= busiest * g and cpus >= busiest * c and mem >= busiest * m
    assert n * cpus >= workers * c + ps * PS_TASK[1] and n * mem >= workers * m + ps * PS_TASK[2]
    tres = dict(kv.split("=", 1) for kv in fields["TRES"].split(","))
    assert tres["cpu"] == str(n * cpus) and parse_mem_mb(tres["mem"]) == n * mem, tres
    return fields


class IdleWatch:
    """Samples Slurm every 0.25 s: idle nodes, and which of the given dl2d jobs wait (submitted, not done,
    no RUNNING Slurm job). ``longest()``: the longest span during which a node was idle and a job waited."""

    def __init__(self, h: Harness):
        self.h, self.samples, self.jobs = h, [], {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        driver = self.h.slurm.driver(timeout=5)
        while not self._stop.is_set():
            try:
                jobs, nodes = driver.jobs(), driver.nodes()
            except Exception:  # noqa: BLE001
                self._stop.wait(0.25)
                continue
            running = {int(j.dl2d_job_id) for j in jobs if j.state == "RUNNING" and j.dl2d_job_id
                       and j.name.startswith(self.h.prefix)}
            waiting = [i for i, since in list(self.jobs.items()) if time.monotonic() > since
                       and i not in running and self.h.progress(i).get("status") != "done"]
            idle = [n.name for n in nodes if n.state == "idle" and n.usable]
            self.samples.append((time.monotonic(), idle, waiting))
            self._stop.wait(0.25)

    def longest(self) -> tuple[float, list]:
        best, start, worst = 0.0, None, []
        for t, idle, waiting in self.samples:
            if idle and waiting:
                start = t if start is None else start
                if t - start > best:
                    best, worst = t - start, (idle, waiting)
            else:
                start = None
        return best, worst

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def planned_gpus(h: Harness, gpus_per_worker: dict[int, int]) -> list[tuple[int, int, dict]]:
    """(slot, GPUs the slot's plan gives our jobs, by their own demand, {job: workers})."""
    with session_scope(h.engine) as s:
        rows = s.execute(select(Slot.number, Allocation.job_id, Allocation.workers)
                         .join(Slot, Slot.id == Allocation.slot_id)).all()
    slots: dict[int, dict[int, int]] = {}
    for number, job_id, workers in rows:
        slots.setdefault(number, {})[job_id] = workers
    return [(n, sum(w * gpus_per_worker[j] for j, w in a.items()), a) for n, a in sorted(slots.items())]


def slurm_end(h: Harness, job_id: int) -> float:
    sid = h.record(job_id)["slurm_job_id"]
    job = h.slurm.driver().job(sid)
    assert job is not None and not job.active and job.end_time, (sid, job)
    return float(job.end_time)


@pytest.fixture
def h(slurm, tmp_path, request):
    harness = Harness(slurm, tmp_path, prefix=f"r{abs(hash(request.node.name)) % 10000}-")
    yield harness
    harness.close()
    print(f"--- dl2d logs (tail) ---\n{harness.logs()[-6000:]}")  # shown by pytest when the test failed


def test_jobs_ask_slurm_for_what_they_need_keep_the_time_limit_finish_on_time_and_shrink_in_place(h, wait_for):
    big = submit(h, "big", "big", epochs=70, max_workers=4, limit=None)  # no -t: [slurm] time_limit_min = 10
    daemon = h.start_daemon()
    wait_alive(h, daemon, wait_for, lambda: h.running_nodes(big) == 4, 60, "big RUNNING on 4 nodes")
    watch = IdleWatch(h)
    watch.jobs[big] = time.monotonic()
    first = h.record(big)["slurm_job_id"]
    rec = h.record(big)
    # 1: 4 workers of 4 GPUs, 2 cores, 1 GB each (and the PS) -> 4 nodes x (4 GPUs, >= 2 cores, >= 1 GB)
    fields = check_requests(h.slurm, first, 4, rec["applied"]["ps"], TASKS["big"], rec["allocation"])
    assert rec["allocation"]["gpus_per_node"] == 4 and fields["NumNodes"] == "4"  # one 4-GPU worker a node
    # 2: the configured default time limit, not Slurm's 365 days
    assert fields["TimeLimit"] == "00:10:00", fields["TimeLimit"]

    # Two more jobs: DRF shares the cluster; big shrinks in place (4: same Slurm job). Both reach the daemon in
    # the same slot (submitted while it is stopped), so big is shrunk once: a Slurm without slurmdbd refuses to
    # resize an already resized job (the backend would then relaunch it, tested with the in-memory Slurm).
    assert h.stop_daemon(daemon) == 0
    mid = submit(h, "mid", "mid", epochs=14, max_workers=2, limit="9")
    small = submit(h, "small", "small", epochs=10, max_workers=4, limit=None)
    daemon = h.start_daemon()
    watch.jobs.update({mid: time.monotonic(), small: time.monotonic()})
    wait_alive(h, daemon, wait_for, lambda: (h.running_nodes(big) or 4) < 4 and h.running_nodes(mid)
               and h.running_nodes(small), 45, "big shrunk, mid and small running")
    rec = h.record(big)
    # the shrink was carried out in place: the same Slurm job, resized (a later shrink of an already resized
    # job may be refused by a Slurm without slurmdbd and then done by a relaunch: not this first one)
    shrinks = [(k, d) for k, d in h.events(big) if k == "resize" and d.get("method") == "shrink"]
    assert rec["slurm_job_ids"][0] == first and shrinks, (rec, h.events(big))
    check_requests(h.slurm, rec["slurm_job_id"], rec["applied"]["workers"], rec["applied"]["ps"], TASKS["big"],
                   rec["allocation"])
    for job, kind, limit in ((mid, "mid", "00:09:00"), (small, "small", "00:10:00")):
        r = h.record(job)
        f = check_requests(h.slurm, r["slurm_job_id"], r["applied"]["workers"], r["applied"]["ps"], TASKS[kind],
                           r["allocation"])
        assert f["TimeLimit"] == limit, (kind, f["TimeLimit"])

    # mid and small finish; their recorded finish is Slurm's EndTime (3).
    wait_alive(h, daemon, wait_for, lambda: all(h.jobs()[j].finished_at for j in (mid, small)), 90,
               "mid and small recorded as finished")
    for job in (mid, small):
        recorded = h.jobs()[job].finished_at
        assert abs(recorded.timestamp() - slurm_end(h, job)) <= 2.5, (job, recorded, slurm_end(h, job))

    # The daemon stops; big ends while it is down; the restart records big's end, not the restart's time (3).
    assert h.stop_daemon(daemon) == 0
    watch.stop()
    assert h.record(big)["slurm_job_id"] != "" and h.progress(big).get("status") != "done", \
        "big finished before the daemon stopped: the restart case was not exercised"
    wait_for(lambda: h.progress(big).get("status") == "done" and not any(
        j.active for j in h.slurm.driver().jobs() if j.job_id == h.record(big)["slurm_job_id"]),
        90, "big done and its Slurm job ended")
    ended = slurm_end(h, big)
    time.sleep(max(0.0, ended + 8 - time.time()))
    daemon = h.start_daemon()
    wait_alive(h, daemon, wait_for, lambda: h.all_completed(3), 60, "all 3 COMPLETED after the restart")
    assert h.stop_daemon(daemon) == 0
    recorded = h.jobs()[big].finished_at.timestamp()
    assert abs(recorded - ended) <= 2.5, (recorded, ended)
    ev = h.events(big)
    assert ("resize", "shrink") in [(k, d.get("method")) for k, d in ev], ev

    # 5: every slot's plan fits the cluster with each job's own demand (a 4-GPU worker counted as 4) ...
    per_worker = {big: 4, mid: 2, small: 1}
    plans = planned_gpus(h, per_worker)
    assert plans and all(g <= CLUSTER_GPUS for _, g, _ in plans), plans
    assert any(a.get(big) == 4 and g == CLUSTER_GPUS for _, g, a in plans), plans  # big alone: the cluster
    # ... and no job that fits waited beside an idle node longer than the daemon takes to react.
    longest, worst = watch.longest()
    assert longest <= 3 * SLOT_S + 4, (longest, worst)
    assert not h.double, h.double
    print(f"\nplans (slot, GPUs, workers): {plans[:12]}...; longest wait beside an idle node {longest:.1f}s; "
          f"big's finish recorded {recorded - ended:+.1f}s from Slurm's EndTime")


def test_the_rights_check_names_what_a_non_operator_user_lacks(slurm):
    """Run as `nobody` (a real non-root user, setpriv): the check says in one line what is missing, and it
    tells the truth: the same user's drain is refused by slurmctld ("Invalid user id"), root's is not."""
    setpriv, python = shutil.which("setpriv"), shutil.which("python3", path="/usr/bin:/bin")
    if not setpriv or not python:
        pytest.skip("needs setpriv and a system python3 that the user nobody can run")
    env = {**clean_env(**slurm.env), "PYTHONPATH": str(REPO)}  # dl2d.slurm.rights needs only the stdlib
    as_nobody = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    cp = subprocess.run([*as_nobody, python, "-m", "dl2d.slurm.rights"], capture_output=True, text=True, env=env,
                        cwd="/", timeout=60)
    assert cp.returncode == 1, (cp.stdout, cp.stderr)
    lines = cp.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("user nobody (uid 65534) may not drain"), lines
    assert "not root, not SlurmUser root" in lines[0] and "AccountingStorageType=accounting_storage/none" in lines[0]
    refused = subprocess.run([*as_nobody, "scontrol", "update", "NodeName=node4", "State=DRAIN", "Reason=probe"],
                             capture_output=True, text=True, env=env, cwd="/", timeout=30)
    assert refused.returncode != 0 and "Invalid user id" in refused.stderr, refused
    cp = subprocess.run([sys.executable, "-m", "dl2d.slurm.rights"], capture_output=True, text=True, env=env,
                        timeout=60)
    assert cp.returncode == 0 and "may drain and resume" in cp.stdout, (cp.stdout, cp.stderr)
    driver = slurm.driver()
    driver.drain_node("node4", "rights probe")
    assert any(n.name == "node4" and n.drained for n in driver.nodes())
    driver.resume_node("node4")
