"""The planning scheduler (dl2d.policy.planning.lp_plan): the bound's program solved from the view each slot, its plan's
first slot carried out in the order of each job's alpha point."""
from __future__ import annotations

import numpy as np

from testkit.sim import make_view

from dl2d.policy import registry
from dl2d.policy.baselines.optimus import FittedOptimus
from dl2d.policy.planning.lp_plan import carry_out, first_slot, lp_plan, measured_view, plan
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
    p = plan(view)
    alpha, now = p.alpha, p.now
    assert alpha[1] < alpha[0] and now[1] >= 0
    # the first bucket is the short job's alone: all of it at the size it runs now, none of the long job's
    assert np.isclose(p.first_share[1].sum(), 1.0) and p.first_share[1][now[1]] == p.first_share[1].max()
    assert p.first_share[0].sum() < 1e-6
    # the program's value, the sum of the two completions' lower bounds: at most what the short one first and
    # then the long one (each at its fastest size that fits) gives, and no more than a bucket (a slot) a job
    # below each alone at its fastest (the program counts a bucket's work at the bucket's start)
    alone = view.remaining_epochs / np.array([p.options[j][2].max() for j in range(2)])
    assert alone.sum() - 2 * view.slot_seconds <= p.value <= alone.sum() + alone[1] + 1e-6
    alloc = lp_plan(view)
    assert alloc.workers[1] >= 1 and alloc.workers[0] == 0
    shared = registry.build("optimus-relative")(view)
    assert shared.workers[0] >= 1 and shared.workers[1] >= 1


def test_the_in_bucket_term_raises_the_plans_value_towards_a_schedule_and_keeps_its_choice():
    """The same two jobs: with the bound's in-bucket term the program's value (a lower bound on the sum of the
    completions) rises, stays below the short-first schedule's, and the plan still runs the short job now."""
    view = make_view(["resnet-50", "resnet-50"], spec=ClusterSpec(1), arrival=[0, 0], est=[100.0, 10.0],
                     max_workers=8, max_ps=8)
    plain, with_term = plan(view), plan(view, in_bucket=8)
    alone = view.remaining_epochs / np.array([plain.options[j][2].max() for j in range(2)])
    assert plain.value + 1.0 < with_term.value <= alone.sum() + alone[1] + 1e-6
    alloc = lp_plan(view, in_bucket=8)
    assert alloc.workers[1] >= 1 and alloc.workers[0] == 0


def test_a_job_no_size_of_which_fits_is_left_out():
    view = make_view(["resnet-50", "resnet-50"], spec=ClusterSpec(1, gpus=0.0), max_workers=4, max_ps=4)
    alloc = lp_plan(view)
    assert list(alloc.workers) == [0, 0] and list(alloc.ps) == [0, 0]


def test_it_runs_a_contended_trace_to_the_end_and_beats_fifo():
    tr = T.generate(T.TraceConfig(num_jobs=12), seed=3)
    cfg = E.SimConfig(cluster=preset("tiny"))
    planned = E.run(tr, FittedOptimus(rule=lp_plan, name="lp-plan"), cfg, seed=3)
    fifo = E.run(tr, registry.build("fifo"), cfg, seed=3)
    assert np.all(np.isfinite(planned.jct_slots)) and planned.avg_jct_slots < fifo.avg_jct_slots


def test_measured_view_scales_the_table_by_each_jobs_factor_and_carry_out_rounds_as_asked():
    view = make_view(["resnet-50", "vgg-16"], spec=ClusterSpec(8), arrival=[0, 0], max_workers=8, max_ps=8)
    from dl2d.sim.bound import ps_rates
    from dl2d.workload.speed import speed_table

    table = speed_table("measured")
    plain = measured_view(view, table)
    scaled = measured_view(view, table, np.array([0.5, 2.0]))
    assert np.allclose(plain.est_speed[1], ps_rates(int(view.type_idx[1]), table, 8, 8))
    assert np.allclose(scaled.est_speed, plain.est_speed * np.array([0.5, 2.0])[:, None, None])
    # the planner's own rounding through carry_out is lp_plan; another size for a job is carried out as given
    p = plan(plain)
    own = carry_out(plain, [int(j) for j in np.lexsort((p.alpha, p.now < 0))], np.where(p.now >= 0, p.now, p.most),
                    p.options)
    assert np.array_equal(own.workers, lp_plan(plain).workers) and np.array_equal(own.ps, lp_plan(plain).ps)
    assert np.array_equal(first_slot(plain, p).workers, own.workers) and np.array_equal(first_slot(plain, p).ps, own.ps)
    one = carry_out(plain, [0], np.array([0, -1]), p.options)
    assert (one.ps[0], one.workers[0]) == (int(p.options[0][0][0]), int(p.options[0][1][0]))
    assert one.workers[1] == one.ps[1] == 0


def test_the_teacher_with_the_views_factor_plans_on_the_table_times_each_jobs_measured_speed():
    """lp_plan.on_measured_speeds(view_factor=True): a job not measured yet (NaN, or a view with no
    measurements) reads as the table; a measured one as the table times its factor."""
    from dataclasses import replace

    from dl2d.policy.planning.lp_plan import on_measured_speeds, view_speed_factor
    from dl2d.workload.speed import speed_table

    view = make_view(["resnet-50", "vgg-16", "inception-bn"], spec=ClusterSpec(3), arrival=[0, 0, 0],
                     max_workers=8, max_ps=8)
    cfg = E.SimConfig(cluster=ClusterSpec(3))
    table = speed_table(cfg.speed_model)
    assert np.array_equal(view_speed_factor(view), np.ones(3))
    unmeasured = replace(view, job_speed_factor=np.full(3, np.nan))
    plain, with_factor = on_measured_speeds(cfg)(unmeasured), on_measured_speeds(cfg, view_factor=True)(unmeasured)
    assert np.array_equal(plain.workers, with_factor.workers) and np.array_equal(plain.ps, with_factor.ps)
    measured = replace(view, job_speed_factor=np.array([0.2, np.nan, 3.0]))
    assert np.allclose(view_speed_factor(measured), [0.2, 1.0, 3.0])
    want = lp_plan(measured_view(measured, table, np.array([0.2, 1.0, 3.0])))
    got = on_measured_speeds(cfg, view_factor=True)(measured)
    assert np.array_equal(got.workers, want.workers) and np.array_equal(got.ps, want.ps)
    assert not (np.array_equal(got.workers, plain.workers) and np.array_equal(got.ps, plain.ps))
