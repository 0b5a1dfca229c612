"""The planning scheduler (dl2d.policy.lp_plan): the bound's program solved from the view each slot, its plan's
first slot carried out in the order of each job's alpha point."""
from __future__ import annotations

import numpy as np

from testkit.sim import make_view

from dl2d.policy import registry
from dl2d.policy.lp_plan import lp_plan, plan
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.sim.cluster import ClusterSpec, preset


def test_a_job_alone_gets_its_fastest_size():
    view = make_view(["resnet-50"], spec=ClusterSpec(8), max_workers=8, max_ps=8)
    alloc = lp_plan(view)
    fastest = np.unravel_index(np.argmax(view.est_speed[0]), view.est_speed[0].shape)
    assert (alloc.ps[0], alloc.workers[0]) == tuple(int(x) for x in fastest)


def test_where_one_job_fits_the_shorter_runs_first():
    """Two jobs of one type on one server, one with a tenth of the other's epochs left: the plan finishes the
    short one first (its alpha point is earlier) and gives it the server now; the relative Optimus shares it."""
    view = make_view(["resnet-50", "resnet-50"], spec=ClusterSpec(1), arrival=[0, 0], est=[100.0, 10.0],
                     max_workers=8, max_ps=8)
    alpha, now, _, _ = plan(view)
    assert alpha[1] < alpha[0] and now[1] >= 0
    alloc = lp_plan(view)
    assert alloc.workers[1] >= 1 and alloc.workers[0] == 0
    shared = registry.build("optimus-relative")(view)
    assert shared.workers[0] >= 1 and shared.workers[1] >= 1


def test_a_job_no_size_of_which_fits_is_left_out():
    view = make_view(["resnet-50", "resnet-50"], spec=ClusterSpec(1, gpus=0.0), max_workers=4, max_ps=4)
    alloc = lp_plan(view)
    assert list(alloc.workers) == [0, 0] and list(alloc.ps) == [0, 0]


def test_it_runs_a_contended_trace_to_the_end_and_beats_fifo():
    tr = T.generate(T.TraceConfig(num_jobs=12), seed=3)
    cfg = E.SimConfig(cluster=preset("tiny"))
    planned = E.run(tr, registry.build("lp-plan"), cfg, seed=3)
    fifo = E.run(tr, registry.build("fifo"), cfg, seed=3)
    assert np.all(np.isfinite(planned.jct_slots)) and planned.avg_jct_slots < fifo.avg_jct_slots
