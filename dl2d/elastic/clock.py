"""Scaling clock (DL2 section 5, step 2).

The coordinator picks a future model version (the *clock*) at which every PS
freezes and migrates parameters and every worker suspends.  It must be far
enough ahead that the PREPARE message reaches every PS and worker before they
pass it, but no further (waiting costs a little training progress before the
move).  With ``v`` the highest current version, ``rtt`` the largest measured
round trip to a PS/worker and ``t_iter`` the time of one version increment::

    clock = v + max(min_ahead, ceil(safety * rtt / t_iter))

In synchronous mode one version is one global step; in asynchronous mode a PS
version grows by one per worker push, so ``t_iter`` is the step time divided
by the number of workers.  If a peer has already passed the clock anyway it
answers "late" and the coordinator retries with :func:`retry_clock`.
"""

from __future__ import annotations

import math
from typing import Iterable


def scaling_clock(version: int, rtts: Iterable[float], iter_time: float | None,
                  safety: float = 2.0, min_ahead: int = 1, max_ahead: int = 1000) -> int:
    rtt = max(list(rtts) or [0.0])
    if version < 0 or rtt < 0:
        raise ValueError("negative version or rtt")
    if not iter_time or iter_time <= 0:
        ahead = min_ahead
    else:
        ahead = math.ceil(safety * rtt / iter_time)
    return int(version + min(max_ahead, max(min_ahead, ahead)))


def retry_clock(latest_version: int, previous_clock: int) -> int:
    """Clock after a "late" answer: strictly beyond both the old clock and the newest version seen."""
    return max(latest_version, previous_clock) + 2
