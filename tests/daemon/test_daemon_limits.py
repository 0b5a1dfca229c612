"""What one user may ask of the daemon (dl2d.daemon.quota, the ``[limits]`` table) and the tick's bound however
many jobs wait (dl2d.daemon.plan.scheduling_window): pure decisions, and the loop over a real SQLite database."""
from __future__ import annotations

import os
import pwd

import pytest

from dl2d.daemon.config import build_config
from dl2d.daemon.loop import SlotLoop
from dl2d.daemon.plan import scheduling_window
from dl2d.daemon.quota import RATE_WINDOW_S, Limits, RateState, admit_rate, submission_refusal
from dl2d.daemon.sim_backend import SimBackend
from dl2d.db.engine import make_engine, session_scope, upgrade
from dl2d.db.jobs import submit_job, user_job_counts
from dl2d.policy.registry import make_heuristic
from dl2d.sim.cluster import ClusterSpec

ME = pwd.getpwuid(os.geteuid()).pw_name


def test_the_window_keeps_every_running_job_and_the_first_waiting_ones():
    waiting = [False, True, True, False, True, True, True]
    assert scheduling_window(waiting, 2) == [0, 1, 2, 3]
    assert scheduling_window(waiting, 0) == list(range(7))  # 0: every job
    assert scheduling_window(waiting, 10) == list(range(7))
    assert scheduling_window([True] * 5, 1) == [0]


def test_limits_like_slurms_association_limits():
    limits = Limits(max_submit_jobs=10, max_pending_jobs=4, submit_rate=3)
    assert submission_refusal(limits, "ann", pending=3, active=9) is None
    assert submission_refusal(limits, "ann", pending=4, active=5) == (
        "user 'ann' has 4 jobs waiting to start, the most allowed (limits.max_pending_jobs = 4); wait for some to "
        "start, or cancel some")
    assert "limits.max_submit_jobs = 10" in submission_refusal(limits, "ann", pending=0, active=10)
    assert submission_refusal(Limits(), "ann", pending=10 ** 6, active=10 ** 6) is None  # 0: no limit


def test_the_submission_rate_is_per_user_and_its_memory_bounded():
    state, rate = RateState(), 3
    assert [admit_rate(state, 1, t, rate) for t in (0.0, 1.0, 2.0)] == [None, None, None]
    wait = admit_rate(state, 1, 3.0, rate)
    assert wait == pytest.approx(RATE_WINDOW_S - 3.0)  # the first of the three leaves the window then
    assert admit_rate(state, 2, 3.0, rate) is None  # another user is not held by the first one's
    assert admit_rate(state, 1, RATE_WINDOW_S + 0.5, rate) is None
    assert len(state.times[1]) <= rate
    for uid in range(100, 1100):  # a thousand users, each once: their records leave with the window
        admit_rate(state, uid, 10.0, rate)
    admit_rate(state, 7, 2 * RATE_WINDOW_S + 1, rate)
    assert set(state.times) == {7}
    assert admit_rate(state, 1, 0.0, 0) is None  # 0: no limit


def test_limits_are_checked_as_config():
    with pytest.raises(Exception, match="limits.max_pending_jobs: must be in 0..10000000"):
        build_config({"limits": {"max_pending_jobs": -1}}, {})
    with pytest.raises(Exception, match="limits.submit_rate"):
        build_config({"limits": {"submit_rate": "fast"}}, {})


def test_a_flood_of_waiting_jobs_costs_the_policy_only_its_window(tmp_path):
    """3 000 waiting jobs of one user, a cluster with room for a few: the policy's view holds the running jobs and
    the first 16 waiting ones, the others keep their place (PENDING, nothing recorded for them in the slot)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'dl2d.sqlite'}")
    upgrade(engine)
    with session_scope(engine) as s:
        for i in range(3000):
            submit_job(s, {"name": f"f{i}", "owner": ME, "job_type": "resnet-50", "total_epochs": 1e4,
                           "command": "x", "worker": {"gpus": 1, "cpus": 1, "mem_gb": 1},
                           "ps": {"cpus": 1, "mem_gb": 1}})
        assert user_job_counts(s, ME) == (3000, 3000)
    seen: list[int] = []
    drf = make_heuristic("drf")

    def policy(view):
        seen.append(len(view.job_ids))
        return drf(view)

    loop = SlotLoop(engine, SimBackend(ClusterSpec(2), slot_seconds=60), None, policy, slot_seconds=60, pace=False,
                    pending_window=16)
    loop.run(max_slots=2)
    assert seen[0] == 16 and 16 < seen[1] <= 32  # then: the jobs started in slot 0, and 16 waiting ones
    with session_scope(engine) as s:
        pending, active = user_job_counts(s, ME)
        assert active == 3000 and pending == 3000 - (seen[1] - 16)


#: A stdlib-only submitter, run as another user: N submissions as fast as the socket answers them; prints how
#: many were accepted, the distinct refusals, and how long it took.
SUBMITTER = r"""
import json, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
sub = {"name": "flood", "job_type": "resnet-50", "total_epochs": 1, "command": "true",
       "worker": {"gpus": 1, "cpus": 1, "mem_gb": 1}, "ps": {"cpus": 1, "mem_gb": 1}}
ok, refusals, t0 = 0, {}, time.monotonic()
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(path)
    s.sendall(json.dumps({"op": "submit", "submission": sub}).encode() + b"\n")
    reply = json.loads(s.makefile("rb").readline())
    s.close()
    if reply.get("ok"):
        ok += 1
    else:
        why = "; ".join(reply.get("errors") or [reply.get("error", "")])
        key = why.split(" (")[0]
        refusals[key] = why
print(json.dumps({"ok": ok, "refusals": refusals, "seconds": time.monotonic() - t0}), flush=True)
"""


@pytest.fixture
def open_dir():
    import shutil
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp(prefix="dl2d-limits-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_users_flood_of_submissions_is_refused_past_their_limits_and_root_still_answered(open_dir):
    """`nobody` submits 300 jobs as fast as the daemon's real control socket answers (the unlimited daemon took
    3 143 in a minute): the rate limit stops them at 40 in the minute, with a clear refusal; with a higher rate
    the pending limit stops them at 25; root is exempt and answered meanwhile."""
    import json
    import shutil
    import subprocess

    from dl2d.daemon.control import ControlServer, ask
    from dl2d.daemon.quota import Limits

    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or not python or not shutil.which("setpriv"):
        pytest.skip("needs root, setpriv and a system python3 that nobody may run")
    engine = make_engine(f"sqlite:///{open_dir / 'dl2d.sqlite'}")
    upgrade(engine)

    def flood(limits: Limits, n: int, name: str) -> dict:
        sock = str(open_dir / f"{name}.sock")
        server = ControlServer(sock, engine, "dl2d-admin", limits=limits)
        server.start()
        try:
            p = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", python, "-c",
                                SUBMITTER, sock, str(n)], capture_output=True, text=True, timeout=120, cwd="/",
                               env={})
            assert p.returncode == 0, p.stderr
            out = json.loads(p.stdout)
            for _ in range(3):  # root: exempt from every limit
                assert ask(sock, {"op": "submit", "submission": {
                    "name": "root-job", "owner": "root", "job_type": "resnet-50", "total_epochs": 1,
                    "command": "true", "worker": {"gpus": 1, "cpus": 1, "mem_gb": 1},
                    "ps": {"cpus": 1, "mem_gb": 1}}})["ok"]
            return out
        finally:
            server.close()

    got = flood(Limits(max_submit_jobs=1000, max_pending_jobs=500, submit_rate=40), 300, "rate")
    assert got["ok"] == 40, got
    [why] = got["refusals"].values()
    assert why.startswith("user 'nobody' submitted 40 jobs in the last minute, the most allowed "
                          "(limits.submit_rate = 40); try again in ")
    got = flood(Limits(max_submit_jobs=1000, max_pending_jobs=65, submit_rate=1000), 100, "pending")
    assert got["ok"] == 25, got  # 40 already wait: 25 more reach the 65
    [why] = got["refusals"].values()
    assert why == ("user 'nobody' has 65 jobs waiting to start, the most allowed (limits.max_pending_jobs = 65); "
                   "wait for some to start, or cancel some")
    with session_scope(engine) as s:
        assert user_job_counts(s, "nobody") == (65, 65) and user_job_counts(s, "root") == (6, 6)
