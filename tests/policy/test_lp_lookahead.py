"""The one-slot lookahead over roundings of the planner's first slot (dl2d.policy.planning.lp_lookahead), a teacher for
plan_distill."""
from __future__ import annotations

import numpy as np
import pytest

from testkit.sim import make_view

from dl2d.policy.planning import plan_distill as D
from dl2d.policy.target import policy as T
from dl2d.policy.planning.lp_lookahead import Lookahead, after_slot, moves
from dl2d.policy.planning.lp_plan import carry_out, first_slot, lp_plan, on_measured_speeds, own_rounding, plan
from dl2d.sim import engine as E
from dl2d.sim import trace as TR
from dl2d.sim.cluster import ClusterSpec, preset
from dl2d.workload.speed import speed_table

TCFG = T.TargetConfig(max_workers=8, max_ps=8, hidden=16, teacher="optimus-relative")


def two_jobs(short_epochs: float):
    return make_view(["resnet-50", "resnet-50"], spec=ClusterSpec(1), arrival=[0, 0], est=[100.0, short_epochs],
                     max_workers=8, max_ps=8)


def test_a_slot_on_trains_each_job_at_the_believed_speed_and_finishes_the_short_one_within_it():
    view = two_jobs(10.0)
    alloc = lp_plan(view)  # the short job runs, the long one waits
    w, p = int(alloc.workers[1]), int(alloc.ps[1])
    assert w >= 1 and alloc.workers[0] == 0
    trained = view.est_speed[1][p, w] * view.slot_seconds
    nxt, finished = after_slot(view, alloc)
    assert trained < 10.0  # a slot trains less than the short job has left
    assert len(finished) == 0 and nxt.slot == view.slot + 1
    assert nxt.epochs_done[1] == pytest.approx(trained) and nxt.epochs_done[0] == 0.0
    assert (nxt.prev_workers[1], nxt.prev_ps[1]) == (w, p)
    # a short job with a tenth of a slot's work left finishes a tenth into the slot; the other job stays
    tiny = trained / 10
    nxt, finished = after_slot(two_jobs(tiny), alloc)
    assert finished == pytest.approx([view.slot_seconds / 10]) and len(nxt) == 1 and nxt.job_ids[0] == 0


def test_a_candidates_value_is_never_below_the_programs_from_the_same_view():
    """The lookahead scores a slot by simulating it and then the program's value: the program from the slot's
    start is a relaxation of any first slot, so it is below every candidate's score."""
    view = make_view(["resnet-50", "vgg-16", "seq2seq", "resnet-50"], servers=2, est=[40.0, 5.0, 20.0, 60.0],
                     max_workers=8, max_ps=8)
    look = Lookahead(None, candidates=4, horizon=2, in_bucket=0)
    p = plan(view)
    own = look.value(view, first_slot(view, p))
    assert own >= p.value * (1 - 1e-6)
    assert look.value(view, lp_plan(view)) == pytest.approx(own)


def test_one_candidate_and_a_one_slot_horizon_is_the_planner_and_labels_as_it_does():
    tr = TR.generate(TR.TraceConfig(num_jobs=6), seed=4)
    cfg = E.SimConfig(cluster=preset("tiny"), max_workers=8, max_ps=8)
    table = speed_table(cfg.speed_model)
    planner = E.run(tr, on_measured_speeds(cfg), cfg, seed=4)
    alone = Lookahead(table, candidates=1, horizon=1, seed=4, in_bucket=0)
    assert np.allclose(E.run(tr, alone, cfg, seed=4).jct_slots, planner.jct_slots)
    assert alone.changed == 0 and alone.slots > 3
    # as plan_distill's teacher it labels every slot with the planner's pairs
    theirs = D.collect(TCFG, cfg, [tr], [4])
    mine = D.collect(TCFG, cfg, [tr], [4], teacher=lambda seed: Lookahead(table, 1, 1, None, seed, 0))
    np.testing.assert_array_equal(mine.label, theirs.label)
    np.testing.assert_array_equal(mine.x, theirs.x)


def test_more_candidates_are_drawn_from_the_seed_and_bad_settings_are_refused():
    tr = TR.generate(TR.TraceConfig(num_jobs=6), seed=2)
    cfg = E.SimConfig(cluster=preset("tiny"), max_workers=8, max_ps=8)
    table = speed_table(cfg.speed_model)
    runs = [E.run(tr, Lookahead(table, 4, 2, None, 7, 0), cfg, seed=2).jct_slots for _ in range(2)]
    np.testing.assert_array_equal(runs[0], runs[1])
    for bad, match in (({"candidates": 0}, "candidates"), ({"horizon": 0}, "horizon"),
                       ({"in_bucket": -1}, "in_bucket"), ({"factor": "oracle"}, "factor")):
        with pytest.raises(ValueError, match=match):
            Lookahead(table, **bad)


def test_local_moves_start_a_waiting_job_first_shrink_the_largest_grow_the_first_the_same_whatever_the_seed():
    view = make_view(["resnet-50", "vgg-16", "seq2seq", "resnet-50"], servers=2, est=[40.0, 5.0, 20.0, 60.0],
                     max_workers=8, max_ps=8)
    p = plan(view)
    own = first_slot(view, p)

    def local_moves(starts, shrinks, grows=0):  # the moves of the planner's own rounding, carried out
        return [carry_out(view, o, s, p.options) for o, s in moves(p, *own_rounding(p), own, starts, shrinks, grows)]

    waiting = [j for j in range(len(view)) if own.workers[j] == 0]
    tasks = np.asarray(own.workers) + np.asarray(own.ps)
    assert waiting and tasks.max() > 1  # the case is one where both kinds of move apply
    found = local_moves(starts=1, shrinks=1)
    assert len(found) == 2
    started, shrunk = found
    first = min(waiting, key=lambda j: (p.now[j] >= 0, p.alpha[j]))  # the first waiting job in the plan's order
    assert started.workers[first] >= 1
    big = int(np.argmax(tasks))
    assert 1 <= shrunk.workers[big] + shrunk.ps[big] < tasks[big]
    assert local_moves(0, 0) == []
    (grown,) = local_moves(0, 0, grows=1)
    lead = next(j for j in sorted(range(len(view)), key=lambda j: (p.now[j] < 0, p.alpha[j])) if own.workers[j])
    assert grown.workers[lead] + grown.ps[lead] > tasks[lead]  # the first job it runs, one size larger
    # as candidates of the lookahead they are drawn from nothing: two seeds give one run
    tr = TR.generate(TR.TraceConfig(num_jobs=4), seed=3)
    cfg = E.SimConfig(cluster=preset("tiny"), max_workers=8, max_ps=8)
    table = speed_table(cfg.speed_model)
    runs = [Lookahead(table, 1, 2, None, seed, 0, starts=2, shrinks=2, grows=1, rounds=2) for seed in (1, 2)]
    jcts = [E.run(tr, look, cfg, seed=3).jct_slots for look in runs]
    np.testing.assert_array_equal(jcts[0], jcts[1])
    planner = E.run(tr, on_measured_speeds(cfg), cfg, seed=3).jct_slots
    assert runs[0].slots > 3
    # the planner's own rounding is a candidate: a move is taken only where it scores better
    assert runs[0].changed == 0 or not np.allclose(jcts[0], planner)
    with pytest.raises(ValueError, match="starts, shrinks and grows"):
        Lookahead(table, starts=-1)
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        Lookahead(table, rounds=0)
