"""Per-user limits on submissions, as Slurm's association limits (``MaxSubmitJobs``) and its submission rate
limit (``SlurmctldParameters=rl_*``) protect slurmctld: one user's flood of jobs must not make every other user's
wait longer. Pure decisions (:func:`submission_refusal`, :func:`admit_rate`) and the small state they keep.

The daemon's ``[limits]`` table (dl2d.daemon.config.LimitsSection) sets them; root is exempt (an admin's
tooling may submit in bulk, and root's word is final on the host anyway), dl2d admins are not.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque

#: The window of :func:`admit_rate`, seconds: ``submit_rate`` is per minute.
RATE_WINDOW_S = 60.0


@dataclass(frozen=True)
class Limits:
    max_submit_jobs: int = 0  # pending or running at once, per user; 0: no limit
    max_pending_jobs: int = 0  # waiting at once, per user; 0: no limit
    submit_rate: int = 0  # submissions per minute, per user; 0: no limit


def submission_refusal(limits: Limits, user: str, pending: int, active: int) -> str | None:
    """Why ``user``'s next submission is refused, with ``pending`` of their jobs waiting and ``active`` pending or
    running (None: it is accepted). The message says the limit, what the user has, and what to do."""
    if limits.max_submit_jobs and active >= limits.max_submit_jobs:
        return (f"user {user!r} has {active} jobs pending or running, the most allowed (limits.max_submit_jobs = "
                f"{limits.max_submit_jobs}); wait for some to finish, or cancel some")
    if limits.max_pending_jobs and pending >= limits.max_pending_jobs:
        return (f"user {user!r} has {pending} jobs waiting to start, the most allowed (limits.max_pending_jobs = "
                f"{limits.max_pending_jobs}); wait for some to start, or cancel some")
    return None


@dataclass
class RateState:
    """The submission times of each user within the last :data:`RATE_WINDOW_S` (at most ``submit_rate`` each)."""

    times: dict[int, Deque[float]] = field(default_factory=dict)


def admit_rate(state: RateState, uid: int, now: float, rate: int) -> float | None:
    """Record one submission of ``uid`` at ``now`` (monotonic seconds) when ``rate`` a minute allows it and return
    None; else return the seconds until it would be allowed (nothing recorded). ``state`` is changed in place; a
    user's record never holds more than ``rate`` times, and users with none are dropped."""
    if rate <= 0:
        return None
    for key in [k for k, q in state.times.items() if not q or now - q[-1] >= RATE_WINDOW_S]:
        del state.times[key]  # nobody's record outlives the window: memory is bounded by the active submitters
    q = state.times.setdefault(uid, deque())
    while q and now - q[0] >= RATE_WINDOW_S:
        q.popleft()
    if len(q) >= rate:
        return RATE_WINDOW_S - (now - q[0])
    q.append(now)
    return None


def rate_refusal(user: str, rate: int, wait_s: float) -> str:
    return (f"user {user!r} submitted {rate} jobs in the last minute, the most allowed (limits.submit_rate = "
            f"{rate}); try again in {max(wait_s, 1):.0f} s")


class SubmitGate:
    """The limits as the control socket applies them (its shell around the decisions above). ``check`` runs with
    the gate held, from counting the user's jobs to writing the new one (``with gate.held():``), so concurrent
    submissions of one user cannot each see room for one more."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self.clock = limits, clock
        self.rates = RateState()
        self._lock = threading.Lock()

    def held(self) -> threading.Lock:
        return self._lock

    def check(self, uid: int, user: str, counts: Callable[[], tuple[int, int]]) -> str | None:
        """Why this submission of ``user`` (uid ``uid``; root is exempt) is refused, None to accept it (then it
        counts towards the rate). ``counts()``: (the owner's waiting jobs, their pending or running ones)."""
        if uid == 0:
            return None
        if self.limits.max_submit_jobs or self.limits.max_pending_jobs:
            pending, active = counts()
            refusal = submission_refusal(self.limits, user, pending, active)
            if refusal:
                return refusal
        wait = admit_rate(self.rates, uid, self.clock(), self.limits.submit_rate)
        return None if wait is None else rate_refusal(user, self.limits.submit_rate, wait)
