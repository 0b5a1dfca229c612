"""Placing many tasks at once (Placer.add_many, AllocationBuilder.add_up_to) places them exactly where as many
single placements would, on random clusters (hypothesis)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dl2d.core.placement import Placer

servers = st.integers(1, 12)


@st.composite
def clusters(draw):
    n = draw(servers)
    cap = np.array([[draw(st.sampled_from([0, 2, 4, 8])), draw(st.sampled_from([8, 16, 32])),
                     draw(st.sampled_from([32, 64]))] for _ in range(n)], float)
    used = np.array([[draw(st.integers(0, int(c[0]))), draw(st.integers(0, int(c[1]))), draw(st.integers(0, int(c[2])))]
                     for c in cap], float)
    demand = (draw(st.sampled_from([0, 1, 2])), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([2, 8, 16])))
    return cap - used, cap, demand, draw(st.integers(0, 40))


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_add_many_places_as_repeated_single_placements(case):
    free, cap, demand, count = case
    one, many = Placer(free, cap), Placer(free, cap)
    singles = []
    for _ in range(count):
        s = one.add(demand)
        if s < 0:
            break
        singles.append(s)
    assert many.add_many(demand, count) == singles
    assert np.array_equal(one.free, many.free)
    assert one.server_for(demand) == many.server_for(demand)  # the classes agree too


def test_add_up_to_stops_at_the_job_limit_and_at_the_first_task_that_does_not_fit():
    from dl2d.policy import registry
    from dl2d.policy.baselines.heuristics import AllocationBuilder
    from dl2d.sim import engine as E
    from dl2d.sim.trace import TraceConfig, generate
    from dl2d.sim.worlds import world

    cfg = world("dl2").sim_config("tiny")
    views = []
    E.run(generate(TraceConfig(num_jobs=6), seed=2), lambda v: (views.append(v), registry.build("drf")(v))[1], cfg)
    v = next(v for v in views if len(v) >= 3)
    bulk, single = AllocationBuilder(v), AllocationBuilder(v)
    for j in range(len(v)):
        for kind, want in (("ps", 3), ("worker", 40)):
            n = 0
            while n < want and single.add(j, kind):
                n += 1
            assert bulk.add_up_to(j, kind, want) == n
    a, b = bulk.allocation(), single.allocation()
    assert a.worker_servers == b.worker_servers and a.ps_servers == b.ps_servers
    assert a.workers.max() <= v.max_workers and b.workers.sum() > 0
