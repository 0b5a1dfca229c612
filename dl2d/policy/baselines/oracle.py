"""The speed oracle: a yardstick for the simulator, not a scheduler for a real cluster.

It gives every job the (PS, workers) that is fastest on the very speed table the simulator trains jobs with
(within the per-job limits), shortest remaining time first, while the tasks fit. It knows what no real
scheduler knows: the simulator's ground truth.

Why it is a bound: a job's speed in a slot is table[type, PS, workers] times its hidden interference factor
and the slot's noise, and no allocation changes the factor or the noise. So if the oracle never has to give a
job less than its fastest configuration (`short_job_slots == 0`: the cluster never binds), every job trains
at the highest speed any scheduler could give it in every slot, and no scheduler can finish any job earlier:
the oracle's average JCT is a lower bound on the trace. With slot noise on the bound holds in distribution
(the noise is drawn per active job, so other schedulers see other draws); with `slot_noise = 0` it is exact.
It does not hold with the cross-node traffic model or heterogeneous servers on (placement changes speed).
"""
from __future__ import annotations

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.baselines.heuristics import AllocationBuilder, remaining_time_estimate
from dl2d.policy.registry import IgnoresFeedback, PolicyOptions
from dl2d.workload.speed import speed_table


def fastest_configs(table: np.ndarray, max_ps: int, max_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Per job type, the (PS, workers) with the highest speed on `table` within the limits (ties: fewest PS,
    then fewest workers)."""
    sub = table[:, : max_ps + 1, : max_workers + 1]
    flat = sub.reshape(len(sub), -1).argmax(axis=1)
    ps, workers = np.unravel_index(flat, sub.shape[1:])
    return ps.astype(int), workers.astype(int)


class SpeedOracle(IgnoresFeedback):
    """Every job its fastest configuration on the simulator's own speed table; counts the job-slots it could
    not give one (`short_job_slots`), which is what decides whether its JCT is a bound (module docstring)."""

    name = "oracle"

    def __init__(self, speed_model: str = "measured"):
        self.table = speed_table(speed_model)
        self.short_job_slots = 0

    def __call__(self, view: SlotView) -> Allocation:
        ps, workers = fastest_configs(self.table, view.max_ps, view.max_workers)
        # all-reduce jobs: the view's estimate is the measured speed of the packed placement, their truth
        # before interference and noise (dl2d.workload.catalog)
        fastest_allreduce = view.est_speed[:, 0, :].argmax(axis=1)
        b = AllocationBuilder(view)
        for j in np.lexsort((view.arrival_slot, remaining_time_estimate(view))):
            j = int(j)
            if view.allreduce[j]:
                want_p, want_w = 0, int(fastest_allreduce[j])
            else:
                want_p, want_w = ps[view.type_idx[j]], workers[view.type_idx[j]]
            pairs = min(want_p, want_w)
            for kind, n in (("bundle", pairs), ("ps", want_p - pairs), ("worker", want_w - pairs)):
                for _ in range(n):
                    b.add(j, kind)
            self.short_job_slots += (b.ps(j), b.workers(j)) != (want_p, want_w)
        return b.allocation()


def build(options: PolicyOptions) -> SpeedOracle:
    return SpeedOracle(options.speed_model)
