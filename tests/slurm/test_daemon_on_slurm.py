"""The real `dl2d` daemon (a subprocess, `backend = "slurm"` from its TOML config) on the real local
Slurm (4 nodes x 4 fake GPUs, see conftest), with jobs submitted through `dl2ctl submit` that run the
demo training program (epochs, checkpoint on SIGUSR1, resume from the checkpoint).

* a natural resize cycle under DRF: a job alone gets 4 workers (4 nodes), shrinks in place when two
  more jobs arrive, is relaunched from its checkpoint at a larger size when they finish and resumes at
  its saved epoch; all finish and `dl2ctl report` shows their JCT;
* kill -9 of the daemon at journal points, restarted: one Slurm job per dl2d job, none lost, none
  submitted twice, the journal replayed once;
* slurmctld stopped for a while: the daemon skips slots and backs off, recovers when it is back, and
  the jobs finish; malformed submissions are rejected and write nothing.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dl2d.db.engine import make_engine, session_scope
from dl2d.db.models import Event, EventKind, Intent, IntentState, Job, JobState, Slot

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
SLOT_S = 2.0
SECONDS_PER_EPOCH = 0.5
APPLY_LINE = re.compile(r"job (\d+): Current\(.*\) -> (\d+)/(\d+): (\w+)$")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DL2D_", "SLURM_"))}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def demo_command(epochs: int) -> str:
    return (f"exec {sys.executable} -m dl2d.slurm.demo_job --epochs {epochs}"
            ' --checkpoint "$DL2D_CHECKPOINT_DIR/ckpt.json" --progress "$DL2D_PROGRESS_FILE"'
            f" --seconds-per-epoch {SECONDS_PER_EPOCH}")


class Harness:
    """One test's daemon state dir, DB, config, daemon processes and a squeue sampler."""

    def __init__(self, slurm, tmp_path: Path, prefix: str, slurm_extra: str = ""):
        self.slurm, self.dir, self.prefix = slurm, tmp_path, prefix
        self.db = f"sqlite:///{tmp_path / 'dl2d.sqlite'}"
        self.config = tmp_path / "dl2d.toml"
        self.config.write_text(f"""
state_dir = "{tmp_path}"
backend = "slurm"
slot_seconds = {SLOT_S}
log_level = "info"
[policy]
name = "drf"
[metrics]
enabled = false
[slurm]
slurm_conf = "{slurm.conf}"
workdir = "{REPO}"
job_name_prefix = "{prefix}"
checkpoint_timeout_s = 20
time_limit_min = 10
run_jobs_as = "daemon"
{slurm_extra}
""")
        self.engine = make_engine(self.db)
        self.runs: list[tuple[subprocess.Popen, Path]] = []
        # sampler: (time, dl2d id, slurm id, state, num_nodes) of this test's active Slurm jobs
        self.samples: list[tuple[float, int, str, str, int]] = []
        self.double: list[tuple[int, list[str]]] = []  # moments with two active Slurm jobs for one dl2d job
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    # -- dl2ctl ----------------------------------------------------------------------------------
    def dl2ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cp = subprocess.run([sys.executable, "-m", "dl2d.cli.main", *args], capture_output=True, text=True,
                            timeout=60, env=clean_env(), cwd=REPO)
        if check:
            assert cp.returncode == 0, (args, cp.stdout, cp.stderr)
        return cp

    def submit_args(self, name: str, epochs: int, owner: str, max_workers: int | None = None) -> list[str]:
        # 4 GPUs per worker: one worker per node, so a job's workers are its node count in squeue.
        return ["submit", "--db", self.db, "-J", name, "--type", "resnet-50", "--epochs", str(epochs),
                "--wrap", demo_command(epochs), "--gpus-per-worker", "4", "--cpus-per-worker", "1",
                "--mem-per-worker", "100M", "--cpus-per-ps", "1", "--mem-per-ps", "100M", "--owner", owner,
                "-t", "10", "--json", *(["--max-workers", str(max_workers)] if max_workers else [])]

    def submit(self, name: str, epochs: int, owner: str) -> int:
        return int(json.loads(self.dl2ctl(*self.submit_args(name, epochs, owner)).stdout)["id"])

    def submit_together(self, *jobs: tuple) -> list[int]:
        """Several `dl2ctl submit` processes at once (so they likely arrive in the same slot)."""
        procs = [subprocess.Popen([sys.executable, "-m", "dl2d.cli.main", *self.submit_args(*j)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                                  cwd=REPO) for j in jobs]
        ids = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, (out, err)
            ids.append(int(json.loads(out)["id"]))
        return ids

    # -- the daemon ------------------------------------------------------------------------------
    def start_daemon(self, crash: str | None = None) -> subprocess.Popen:
        log = self.dir / f"dl2d-{len(self.runs)}.log"
        env = clean_env(**({"DL2D_DEBUG_CRASH": crash} if crash else {}))
        p = subprocess.Popen([sys.executable, "-m", "dl2d.daemon.main", "--config", str(self.config)],
                             stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=self.dir)
        self.runs.append((p, log))
        return p

    def stop_daemon(self, p: subprocess.Popen) -> int:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        return p.wait(timeout=60)

    def logs(self) -> str:
        return "\n".join(log.read_text() for _, log in self.runs)

    def applies(self) -> list[tuple[int, int, int, str]]:
        """Every SlurmBackend.apply across all daemon runs: (job, workers, ps, method)."""
        out = []
        for line in self.logs().splitlines():
            m = APPLY_LINE.search(line)
            if m:
                out.append((int(m[1]), int(m[2]), int(m[3]), m[4]))
        return out

    # -- Slurm -----------------------------------------------------------------------------------
    def _sample(self) -> None:
        driver = self.slurm.driver(timeout=5)
        while not self._stop.is_set():
            try:
                jobs = driver.jobs()
            except Exception:  # noqa: BLE001 - the controller may be down on purpose
                self._stop.wait(0.3)
                continue
            now = time.monotonic()
            active: dict[int, list[str]] = defaultdict(list)
            for j in jobs:
                if j.active and j.name.startswith(self.prefix) and j.dl2d_job_id:
                    self.samples.append((now, int(j.dl2d_job_id), j.job_id, j.state, j.num_nodes))
                    active[int(j.dl2d_job_id)].append(j.job_id)
            self.double.extend((k, v) for k, v in active.items() if len(v) > 1)
            self._stop.wait(0.25)

    def slurm_history(self, job_id: int) -> list[tuple[str, str, int]]:
        """(slurm id, state, nodes) as seen by squeue, consecutive duplicates dropped."""
        out: list[tuple[str, str, int]] = []
        for _, jid, sid, state, nodes in list(self.samples):
            if jid == job_id and (not out or out[-1] != (sid, state, nodes)):
                out.append((sid, state, nodes))
        return out

    def running_nodes(self, job_id: int) -> int | None:
        for _, jid, _, state, nodes in reversed(list(self.samples)):
            if jid == job_id:
                return nodes if state == "RUNNING" else None
        return None

    def job_dir(self, job_id: int) -> Path:
        return self.dir / "slurm" / "jobs" / str(job_id)

    def record(self, job_id: int) -> dict:
        return json.loads((self.job_dir(job_id) / "record.json").read_text())

    def progress(self, job_id: int) -> dict:
        try:
            return json.loads((self.job_dir(job_id) / "job" / "progress.json").read_text())
        except (OSError, ValueError):
            return {}

    # -- DB --------------------------------------------------------------------------------------
    def jobs(self) -> dict[int, Job]:
        with session_scope(self.engine) as s:
            jobs = list(s.scalars(select(Job)))
            s.expunge_all()
        return {j.id: j for j in jobs}

    def all_completed(self, n: int) -> bool:
        jobs = self.jobs()
        return len(jobs) == n and all(j.state == JobState.COMPLETED for j in jobs.values())

    def events(self, job_id: int | None = None) -> list[tuple[str, dict]]:
        with session_scope(self.engine) as s:
            q = select(Event).order_by(Event.id)
            if job_id is not None:
                q = q.where(Event.job_id == job_id)
            return [(EventKind(e.kind).value, dict(e.detail or {})) for e in s.scalars(q)]

    def open_slots(self) -> list[int]:
        with session_scope(self.engine) as s:
            return list(s.scalars(select(Slot.number).where(Slot.ended_at.is_(None))))

    def last_slot(self) -> int:
        with session_scope(self.engine) as s:
            return s.scalar(select(func.max(Slot.number)))

    def close(self) -> None:
        self._stop.set()
        self._sampler.join(timeout=10)
        for p, _ in self.runs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        self.engine.dispose()


@pytest.fixture
def harness(slurm, tmp_path, request):
    # The outage test: a failing squeue takes ~4 s here (MessageTimeout); 2 tries per backend call keep
    # a skipped slot at ~10 s instead of the default ~20 s.
    extra = "backoff = { base = 0.2, max_attempts = 2 }" if "outage" in request.node.name else ""
    h = Harness(slurm, tmp_path, prefix=f"t{abs(hash(request.node.name)) % 10000}-", slurm_extra=extra)
    yield h
    h.close()
    print(f"--- dl2d logs (tail) ---\n{h.logs()[-6000:]}")  # shown by pytest when the test failed


def wait_alive(h: Harness, p: subprocess.Popen, wait_for, pred, timeout: float, what: str):
    """wait_for(pred) but fail at once, with the daemon's log, if the daemon died."""
    def check():
        assert p.poll() is None, f"dl2d exited {p.returncode} while waiting for {what}:\n{h.logs()[-4000:]}"
        return pred()
    return wait_for(check, timeout, what, interval=0.25)


def out_files(h: Harness, job_id: int) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((h.job_dir(job_id) / "job").glob("slurm-*.out"))}


def test_daemon_resizes_relaunches_from_checkpoint_and_reports_jct(harness, wait_for):
    h = harness
    t0 = time.monotonic()
    a = h.submit("long-a", epochs=50, owner="alice")
    daemon = h.start_daemon()

    # Alone, DRF gives the job the cluster: a worker wants 4 GPUs (the policy and the backend both size it
    # by its spec), so 4 workers on 4 nodes x 4 GPUs.
    wait_alive(h, daemon, wait_for, lambda: h.running_nodes(a) == 4, 45, "job a RUNNING on 4 nodes")
    first_sid = h.record(a)["slurm_job_id"]
    wait_alive(h, daemon, wait_for, lambda: h.progress(a).get("epoch", 0) >= 2, 20, "job a past epoch 2")

    # Two more arrive: DRF shares the cluster, job a shrinks in place (same Slurm job, fewer nodes).
    # b and c take one worker at most, so each runs as one Slurm job on one node throughout.
    b, c = h.submit_together(("short-b", 12, "bob", 1), ("short-c", 16, "carol", 1))
    wait_alive(h, daemon, wait_for, lambda: (h.running_nodes(a) or 4) < 4 and h.running_nodes(b)
               and h.running_nodes(c), 45, "a shrunk, b and c running")
    assert h.record(a)["slurm_job_id"] == first_sid

    # b and c finish; a grows back beyond its nodes: checkpoint, relaunch, resume.
    wait_alive(h, daemon, wait_for, lambda: h.all_completed(3), 150, "all 3 jobs COMPLETED")
    assert h.stop_daemon(daemon) == 0
    elapsed = time.monotonic() - t0

    # squeue: a's first Slurm job ran at 4 nodes, then on fewer (shrunk in place); the relaunches
    # ran on more nodes than it had shrunk to.
    hist = h.slurm_history(a)
    running = [(sid, n) for sid, st, n in hist if st == "RUNNING"]
    first = [n for sid, n in running if sid == first_sid]
    assert first[0] == 4 and min(first) < 4 and first == sorted(first, reverse=True), hist
    relaunched = [(sid, n) for sid, n in running if sid != first_sid]
    assert relaunched and all(n > min(first) for _, n in relaunched), hist
    rec = h.record(a)
    assert rec["slurm_job_ids"][0] == first_sid and len(rec["slurm_job_ids"]) == 1 + len({s for s, _ in relaunched})
    for job in (b, c):  # on one node throughout; relaunched only to grow (a PS more than its cores hold)
        assert {n for _, st, n in h.slurm_history(job) if st == "RUNNING"} == {1}, h.slurm_history(job)
        grows = [(w, p) for j, w, p, m in h.applies() if j == job and m == "restart"]
        # a job still PENDING when its size changes is submitted again at the new size (a second "start": on a
        # loaded machine the first may not have started before the next slot)
        starts = [(w, p) for j, w, p, m in h.applies() if j == job and m == "start"]
        assert len(h.record(job)["slurm_job_ids"]) == len(starts) + len(grows), (starts, grows)
        assert starts and all(p > 1 for _, p in grows), (starts, grows)

    # The DB's events: start, an in-place shrink, relaunch(es), finish.
    ev = h.events(a)
    kinds = [k for k, _ in ev]
    assert kinds[:2] == ["submit", "start"] and kinds[-1] == "finish", ev
    assert ("resize", "shrink") in [(k, d.get("method")) for k, d in ev], ev
    assert ("relaunch", "restart") in [(k, d.get("method")) for k, d in ev], ev
    assert kinds.index("resize") < kinds.index("relaunch")

    # Every relaunch resumed at the epoch its predecessor checkpointed, never from 0.
    outs = out_files(h, a)
    chain = [(int(m[1]) if (m := re.search(r"checkpointed at epoch (\d+)", t)) else None,
              int(m2[1]) if (m2 := re.search(r"resumed from (\d+)\)", t)) else None)
             for t in (outs[f"slurm-{sid}.out"] for sid in rec["slurm_job_ids"])]
    assert chain[0][0] and chain[0][0] > 0, (chain, outs)
    for (saved, _), (_, resumed) in zip(chain, chain[1:]):
        assert saved is not None and resumed is None or resumed == saved, chain
    p = h.progress(a)
    assert p["status"] == "done" and p["epoch"] == 50 and p["runs"] == len(rec["slurm_job_ids"]) >= 2
    assert p["resumed_from"] and p["resumed_from"] > 0
    for job in (b, c):
        assert h.progress(job)["runs"] == len(h.record(job)["slurm_job_ids"]) and h.progress(job)["status"] == "done"

    # dl2ctl report: one job per owner here, so the per-owner JCT is each job's.
    jobs = h.jobs()
    rep = json.loads(h.dl2ctl("report", "--db", h.db, "--json").stdout)
    by_owner = {r["owner"]: r for r in rep["jct_by_owner"]}
    for j in jobs.values():
        jct = (j.finished_at - j.submitted_at).total_seconds()
        assert by_owner[j.owner]["n_jobs"] == 1 and by_owner[j.owner]["avg_jct_s"] == pytest.approx(jct, abs=1)
        assert 0 < jct < elapsed
    assert rep["resizes_per_job"][0]["job_id"] == a and rep["resizes_per_job"][0]["n_relaunch"] >= 1
    assert not h.double, h.double
    print(f"\nresize cycle: {elapsed:.0f}s; a's Slurm jobs {rec['slurm_job_ids']}, squeue {hist}; "
          f"JCT s: { {j.name: round((j.finished_at - j.submitted_at).total_seconds(), 1) for j in jobs.values()} }")


def test_kill_9_mid_slot_and_restart_loses_and_duplicates_nothing(harness, wait_for):
    h = harness
    a, b = h.submit("crash-a", 30, "alice"), h.submit("crash-b", 10, "bob")

    def issued() -> list[int]:
        with session_scope(h.engine) as s:
            return list(s.scalars(select(Intent.job_id).where(Intent.state == IntentState.ISSUED)))

    # 1: killed after the slot's sbatch calls (one each), before the journal marks them done.
    p = h.start_daemon(crash="applied:1")
    assert p.wait(timeout=60) == -9, h.logs()[-3000:]
    assert [len(h.record(j)["slurm_job_ids"]) for j in (a, b)] == [1, 1] and sorted(issued()) == [a, b]
    # 2: replays both (NOOPs: their Slurm jobs are there), runs slots until b finishes and a is to
    #    grow; killed after journalling that intent as issued, before it reaches Slurm.
    p = h.start_daemon(crash="issued:3")
    assert p.wait(timeout=90) == -9, h.logs()[-3000:]
    assert "replayed 2 journal intent(s)" in h.runs[1][1].read_text()
    assert issued() == [a]
    # 3: replays a's growth for real (checkpoint, relaunch); killed by a plain SIGKILL mid-slot.
    p = h.start_daemon()
    wait_alive(h, p, wait_for, lambda: len(h.record(a)["slurm_job_ids"]) == 2 and h.running_nodes(a), 45,
               "a relaunched and running")
    # The daemon logs the replay when the apply returns, which may be after the relaunch is seen running.
    wait_for(lambda: "replayed 1 journal intent(s)" in h.runs[2][1].read_text(), 10, "run 3's replay logged")
    time.sleep(SLOT_S * 1.3)
    p.kill()
    assert p.wait(timeout=30) == -9
    # 4: runs until both finish.
    p = h.start_daemon()
    wait_alive(h, p, wait_for, lambda: h.all_completed(2), 120, "both jobs COMPLETED")
    assert h.stop_daemon(p) == 0

    jobs = h.jobs()
    assert sorted(j.name for j in jobs.values()) == ["crash-a", "crash-b"]  # none lost, none doubled
    with session_scope(h.engine) as s:
        intents = [(i.job_id, IntentState(i.state)) for i in s.scalars(select(Intent))]
    assert all(st in (IntentState.DONE, IntentState.FAILED) for _, st in intents), intents
    assert h.open_slots() in ([], [h.last_slot()])  # only the slot SIGTERM interrupted (closed at next start)
    # Slurm: never two live Slurm jobs for one dl2d job; every Slurm job of ours is in a record.
    assert not h.double, h.double
    seen: dict[int, set[str]] = defaultdict(set)
    for _, jid, sid, _, _ in h.samples:
        seen[jid].add(sid)
    assert set(seen) == {a, b}
    applies = h.applies()
    for job in (a, b):
        ids = h.record(job)["slurm_job_ids"]
        assert len(ids) == len(set(ids)) and seen[job] == set(ids), (job, ids, seen[job])
        # each submission was issued once: the backend's start/restart actions are its Slurm jobs
        assert len([m for j, _, _, m in applies if j == job and m in ("start", "restart")]) == len(ids), applies
    # every intent reached the backend once, plus run 2's replays of the two that had (NOOPs: sizes in place)
    replays = sum(int(m) for m in re.findall(r"replayed (\d+) journal intent", h.logs()))
    assert replays == 3 and len(applies) == len(intents) + 2, (applies, intents)
    run2 = [APPLY_LINE.search(x) for x in h.runs[1][1].read_text().splitlines() if APPLY_LINE.search(x)]
    assert [(int(m[1]), m[4]) for m in run2[:2]] == [(a, "noop"), (b, "noop")]
    run3 = [APPLY_LINE.search(x) for x in h.runs[2][1].read_text().splitlines() if APPLY_LINE.search(x)]
    assert (int(run3[0][1]), run3[0][4]) == (a, "restart")
    print(f"\ncrash test: Slurm jobs {dict(seen)}, {len(intents)} intents, {replays} replayed, {len(applies)} applies")


def test_controller_outage_daemon_backs_off_and_recovers_bad_submissions_write_nothing(harness, slurm, wait_for):
    h = harness
    a, b = h.submit_together(("outage-a", 60, "alice"), ("outage-b", 40, "bob"))
    p = h.start_daemon()
    wait_alive(h, p, wait_for, lambda: h.running_nodes(a) and h.running_nodes(b), 45, "a and b running")
    with session_scope(h.engine) as s:
        slots_before = s.scalar(select(func.count()).select_from(Slot))

    def counts():
        with session_scope(h.engine) as s:
            return tuple(s.scalar(select(func.count()).select_from(t)) for t in (Job, Event, Intent))

    # slurmctld goes away (SIGTERM, like `systemctl stop slurmctld`); running jobs go on under slurmd.
    slurm.stop_controller()
    t_down = time.monotonic()
    # Meanwhile: malformed submissions are rejected, nothing is written.
    before = counts()
    bad_spec = h.dir / "bad.toml"
    bad_spec.write_text('name = "x"\njob_type = "resnet-50"\ntotal_epochs = [\n')
    good = h.submit_args("ok", 5, "alice")
    bad = [
        [x for i, x in enumerate(good) if x != "--epochs" and (i == 0 or good[i - 1] != "--epochs")],
        [("resnet-51" if x == "resnet-50" else x) for x in good],
        [("-1" if good[i - 1] == "--gpus-per-worker" else x) for i, x in enumerate(good)],
        [("12Q" if good[i - 1] == "--mem-per-worker" else x) for i, x in enumerate(good)],
        ["submit", "--db", h.db, str(bad_spec)],
    ]
    procs = [subprocess.Popen([sys.executable, "-m", "dl2d.cli.main", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=REPO) for args in bad]
    results = [(pr.wait(timeout=60), pr.stderr.read()) for pr in procs]
    assert all(rc != 0 for rc, _ in results), results
    for needle, (_, err) in zip(["epochs", "resnet-51", "gpus", "12Q", "invalid TOML"], results):
        assert needle in err, (needle, err)
    assert counts() == before

    wait_alive(h, p, wait_for, lambda: "backend unavailable, slot skipped" in h.logs(), 60,
               "the daemon to log the outage")
    assert json.loads((h.dir / "dl2d.status.json").read_text())["state"] == "degraded"
    remaining = 20 - (time.monotonic() - t_down)
    if remaining > 0:
        time.sleep(remaining)  # several slots' worth of outage
    assert p.poll() is None, h.logs()[-3000:]
    t_up = time.monotonic()
    slurm.start()
    wait_alive(h, p, wait_for, lambda: "backend available again" in h.logs(), 60, "the daemon to recover")
    recovered_s = time.monotonic() - t_up
    wait_alive(h, p, wait_for, lambda: h.all_completed(2), 120, "both jobs COMPLETED after the outage")
    assert h.stop_daemon(p) == 0
    log = h.logs()
    skipped = log.count("backend unavailable, slot skipped")
    assert skipped >= 2 and "Traceback" not in log, log[-3000:]
    with session_scope(h.engine) as s:
        slots_after = s.scalar(select(func.count()).select_from(Slot))
    assert h.open_slots() in ([], [h.last_slot()])
    assert slots_after > slots_before + 1
    assert not h.double, h.double
    for job in (a, b):
        assert h.progress(job)["status"] == "done"
    print(f"\noutage: controller down {t_up - t_down:.0f}s, {skipped} slots skipped, daemon recovered "
          f"{recovered_s:.1f}s after restarting slurmctld")


def test_daemon_starts_and_resizes_a_real_adaptive_jax_job_with_its_batch(harness, wait_for):
    """`dl2ctl submit --adaptive-batch` of the JAX example (one process per worker, docs/jobs.md): the daemon
    starts it at DRF's size with the goodput batch of its GPUs, relaunches it smaller when two jobs arrive and
    larger when they are done, each time at the batch of its new GPUs; the job resumes from its checkpoint at
    that batch with its learning rate scaled, runs every global step once, reports its gradient noise, and the
    daemon stores its batch, what it learned of its noise, and its speed per slot. (That a resize leaves the
    parameters as an uninterrupted run's is tests/slurm/test_allreduce_job_real.py's.)"""
    from dl2d.db.models import JobSlotStat
    from dl2d.workload.efficiency import NoiseFit

    h = harness
    steps, example = 800, REPO / "examples" / "jax_allreduce.py"
    command = (f"{sys.executable} {example} --steps {steps} --global-batch 128 --step-seconds 0.05"
               ' --checkpoint-every 100 --step-log "$DL2D_JOB_DIR/steps.log"')
    out = h.dl2ctl("submit", "--db", h.db, "-J", "jax-a", "--arch", "allreduce", "--type", "cifar10",
                   "--batch-size", "128", "--adaptive-batch", "--max-batch-size", "1024", "--epochs", "1",
                   "--wrap", command, "--gpus-per-worker", "4", "--cpus-per-worker", "1", "--mem-per-worker", "500M",
                   "--max-workers", "3", "--owner", "alice", "-t", "10", "--json").stdout
    a = int(json.loads(out)["id"])
    daemon = h.start_daemon()
    wait_alive(h, daemon, wait_for, lambda: h.progress(a).get("step", 0) > 20, 90, "the JAX job training")
    first = h.progress(a)["world_size"]
    b, c = h.submit_together(("short-b", 12, "bob", 1), ("short-c", 16, "carol", 1))
    wait_alive(h, daemon, wait_for, lambda: h.progress(a).get("world_size", first) < first, 90,
               "the JAX job relaunched smaller")
    wait_alive(h, daemon, wait_for, lambda: h.all_completed(3), 240, "all 3 jobs COMPLETED")
    assert h.stop_daemon(daemon) == 0

    log = [tuple(map(int, line.split())) for line in (h.job_dir(a) / "job" / "steps.log").read_text().splitlines()]
    assert [s for _, s in log] == list(range(1, steps + 1))  # none repeated, none skipped
    sizes = [w for i, (w, _) in enumerate(log) if i == 0 or log[i - 1][0] != w]
    assert len(sizes) >= 3 and min(sizes[1:-1]) < sizes[0] and sizes[-1] > min(sizes), sizes
    # each run's output file (slurm-<id>.out), in run order: the run number each prints, not the file names
    # (Slurm ids sort as text: slurm-10 before slurm-9)
    outputs = [f.read_text() for f in (h.job_dir(a) / "job").glob("slurm-*.out")]
    output = "".join(sorted(outputs, key=lambda text: int(re.search(r"run (\d+):", text)[1])))
    runs = [(int(m[1]), int(m[2]), int(m[3])) for m in
            re.finditer(r"run \d+: (\d+) processes, resuming at step (\d+), batch (\d+)", output)]
    lrs = [(float(m[1]), int(m[2])) for m in re.finditer(r"learning rate x([\d.e+-]+) at batch (\d+)", output)]
    assert [w for w, _, _ in runs] == sizes and len(lrs) == len(runs), output[-3000:]
    assert all(at > 0 for _, at, _ in runs[1:])  # every relaunch resumed from its checkpoint
    by_size = {w: batch for w, _, batch in runs}
    assert all(128 < batch <= 1024 for batch in by_size.values()) and by_size[min(sizes)] < by_size[max(sizes)]
    assert [batch for _, batch in lrs] == [batch for _, _, batch in runs] and all(x > 1 for x, _ in lrs)
    p = h.progress(a)
    assert (p["state"], p["lost_steps"]) == ("done", 0) and p["runs"] == len(sizes)
    assert p["grad_sqr"] > 0 and p["grad_var"] > 0 and p["batch_size"] == runs[-1][2]
    assert [k for k, _ in h.events(a)].count("relaunch") >= 2
    with session_scope(h.engine) as s:
        job = s.get(Job, a)
        stored, fit = job.batch_size, NoiseFit.from_json(job.batch_noise)
        stats = [(st.workers, st.epochs_per_s) for st in s.scalars(select(JobSlotStat).where(JobSlotStat.job_id == a))]
    assert stored == runs[-1][2] and fit.reports >= 3, (stored, fit)
    measured = {w for w, speed in stats if speed > 0}
    assert len(measured) >= 2, stats  # its speed, measured in slots at more than one size
    print(f"\nadaptive JAX job: (processes, resumed at, batch) {runs}, learning-rate factors {lrs}; noise fit "
          f"{fit}")
    shown = h.dl2ctl("show", "--db", h.db, str(a)).stdout
    assert "all-reduce" in shown and "COMPLETED" in shown and "lost to restarts" not in shown
    assert f"{runs[-1][2]} now (submitted 128; at most 1024" in shown and f"{fit.reports} reports" in shown
