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
