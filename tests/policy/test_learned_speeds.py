"""The speed table learned from observations (dl2d.policy.planning.learned_speeds) and the policy that plans on it
(``lp-lookahead``)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from dl2d.policy.planning import learned_speeds as LS
from dl2d.policy.planning import lp_plan as LP
from dl2d.policy import registry
from dl2d.sim import engine as E
from dl2d.sim.cluster import preset
from dl2d.sim.trace import TraceConfig, generate
from dl2d.workload.speed import speed_table


def synthetic(seed=0, jobs=300, slots=20, sigma=0.27, noise=0.1):
    """Observations of a known table [2, 5, 5] (cell (0, 0) of type 1 never run) by jobs with hidden factors
    (job j of type j % 2; each type's factors scaled to a mean of 1, the fit's premise, exactly)."""
    rng = np.random.default_rng(seed)
    table = rng.uniform(1.0, 10.0, (2, 5, 5))
    factor = np.exp(rng.normal(-sigma ** 2 / 2, sigma, jobs))
    for t in (0, 1):
        factor[t::2] /= factor[t::2].mean()
    job = np.repeat(np.arange(jobs), slots)
    t = job % 2
    ps, w = rng.integers(0, 5, job.size), rng.integers(0, 5, job.size)
    keep = ~((t == 1) & (ps == 0) & (w == 0))
    job, t, ps, w = job[keep], t[keep], ps[keep], w[keep]
    rate = table[t, ps, w] * factor[job] * (1 + noise * rng.uniform(-1, 1, job.size))
    return table, LS.Observations(job, t, ps, w, rate)


def test_the_fit_takes_each_jobs_hidden_factor_out_and_leaves_unseen_cells_at_zero():
    table, obs = synthetic()
    fitted, counts = LS.fit_table(obs, 2, 5)
    assert counts[1, 0, 0] == 0 and fitted[1, 0, 0] == 0.0
    seen = counts > 0
    err = np.abs(fitted[seen] / table[seen] - 1)
    naive, _ = LS.fit_table(obs, 2, 5, iters=1)  # one pass: each cell's mean, the job factors still in it
    err_naive = np.abs(naive[seen] / table[seen] - 1)
    assert err.mean() < 0.01 and err.max() < 0.04
    assert err.mean() < err_naive.mean() / 3  # the factors, not the noise, were the larger error
    assert counts.sum() == len(obs.rate)


def test_the_fit_leaves_out_pairs_beyond_the_table_and_refuses_nothing_to_fit():
    table, obs = synthetic(jobs=20)
    small, counts = LS.fit_table(obs, 2, 3)
    assert small.shape == (2, 3, 3) and counts.sum() == np.sum((obs.ps < 3) & (obs.workers < 3))
    empty = LS.Observations(*(np.zeros(0, int) for _ in range(4)), np.zeros(0))
    with pytest.raises(ValueError, match="no observation"):
        LS.fit_table(empty, 2, 5)


def noiseless_run(explorer_seed=0):
    """A tiny DL2 trace under the explorer, no noise and no hidden interference, through the Recorder."""
    tr = generate(TraceConfig(num_jobs=6, max_arrivals_per_slot=3), seed=3)
    tr = replace(tr, speed_factor=np.ones(len(tr)))
    cfg = E.SimConfig(cluster=preset("tiny"), max_workers=4, max_ps=4, slot_noise=0.0)
    rec = LS.Recorder(tr, cfg.slot_seconds, job_base=7_000_000)
    res = E.run(tr, LS.Explorer(explorer_seed), cfg, seed=0, on_slot=rec)
    return rec.observations(), cfg, tr, res


def test_the_recorder_reads_the_speed_each_job_trained_at_in_full_slots_and_finishing_ones():
    obs, cfg, tr, res = noiseless_run()
    assert len(obs.rate) > 20 and np.all(obs.job >= 7_000_000)
    assert set(obs.job - 7_000_000) == set(range(len(tr)))  # every job, those that ended in their first slot too
    per_job = np.bincount(obs.job - 7_000_000, minlength=len(tr))
    assert per_job.sum() == len(obs.rate) and np.all(per_job <= np.ceil(res.jct_slots) + 1)
    true = speed_table(cfg.speed_model)[obs.type_idx, obs.ps, obs.workers]
    np.testing.assert_allclose(obs.rate, true, rtol=1e-9)
    assert len({(p, w) for p, w in zip(obs.ps, obs.workers)}) > 5  # the explorer tries many pairs
    assert np.all((obs.ps >= 1) & (obs.ps <= 4) & (obs.workers >= 1) & (obs.workers <= 4))


def test_learning_refuses_a_simulator_with_a_resize_overhead_before_it_runs_anything():
    tr = generate(TraceConfig(num_jobs=4), seed=1)
    cfg = E.SimConfig(cluster=preset("tiny"), resize_overhead_s=30.0)
    seen = []
    with pytest.raises(ValueError, match="resize_overhead_s is 30.0"):
        LS.learn(cfg, [(1, tr)], on_trace=lambda *a: seen.append(a))
    assert seen == []


def test_learning_on_noiseless_runs_gives_the_simulators_table_where_it_ran():
    tr = generate(TraceConfig(num_jobs=6, max_arrivals_per_slot=3), seed=3)
    tr = replace(tr, speed_factor=np.ones(len(tr)))
    cfg = E.SimConfig(cluster=preset("tiny"), max_workers=4, max_ps=4, slot_noise=0.0)
    table, counts, obs = LS.learn(cfg, [(0, tr), (1, tr)])
    assert table.shape == (8, 5, 5) and counts.sum() == len(obs.rate)
    true = speed_table(cfg.speed_model)[:, :5, :5]
    np.testing.assert_allclose(table[counts > 0], true[counts > 0], rtol=1e-9)


def test_a_saved_table_loads_and_a_damaged_or_foreign_file_is_refused(tmp_path):
    table, obs = synthetic(jobs=40)
    fitted, counts = LS.fit_table(obs, 2, 5)
    path = tmp_path / "t.npz"
    LS.save(path, fitted, counts, {"command": "made here"})
    back, back_counts, meta = LS.load(path)
    np.testing.assert_allclose(back, fitted.astype(np.float32))
    assert (back_counts == counts).all() and meta["command"] == "made here" and meta["format"] == LS.FORMAT
    edited = tmp_path / "edited.npz"
    np.savez(edited, table=back.astype(np.float32) * 1.01, counts=counts, meta=np.array(json.dumps(meta)))
    with pytest.raises(ValueError, match="edited.npz: the table does not match"):
        LS.load(edited)
    future = tmp_path / "future.npz"
    np.savez(future, table=back.astype(np.float32), counts=counts,
             meta=np.array(json.dumps({**meta, "format": LS.FORMAT + 1})))
    with pytest.raises(ValueError, match="future.npz: format 2"):
        LS.load(future)
    junk = tmp_path / "junk.npz"
    junk.write_text("not numpy")
    with pytest.raises(ValueError, match="junk.npz: not a learned speed table"):
        LS.load(junk)


def test_the_shipped_table_loads_and_says_how_it_was_made():
    table, counts, meta = LS.load()
    true = speed_table("measured")[:, :table.shape[1], :table.shape[2]]
    assert meta["world"] == "dl2" and meta["command"].startswith("python bench/bench_learned_speeds.py")
    lo, hi = meta["seeds"]
    assert lo > 504 and not set(range(lo, hi + 1)) & set(range(20))  # never the held-out or validation traces
    assert np.all(counts[true > 0] > 0)  # every pair with a speed was run
    # a reference, not something the fit read: close to the simulator's table, within the noise
    rel = np.abs(table[counts > 0] / true[counts > 0] - 1)
    assert np.median(rel) < 0.01 and rel.mean() < 0.02


def test_the_planner_keeps_its_belief_for_a_job_type_the_table_lacks():
    tr = generate(TraceConfig(num_jobs=3), seed=2)
    cfg = E.SimConfig(cluster=preset("tiny"))
    view = E.view_of(tr, E.SimState.initial(len(tr)), cfg)
    view = replace(view, type_idx=np.array([0, 1, 2]))
    table = np.zeros((2, 17, 17))
    table[0] = 5.0  # type 0 known, type 1 all zero, type 2 beyond the table
    est = LP.measured_view(view, table).est_speed
    assert not np.allclose(est[0], view.est_speed[0])
    np.testing.assert_array_equal(est[1], view.est_speed[1])
    np.testing.assert_array_equal(est[2], view.est_speed[2])


def test_lp_lookahead_is_registered_on_the_shipped_table_and_schedules_a_dl2_trace():
    entry = registry.get("lp-lookahead")
    assert not entry.heuristic and entry.daemon and entry.trained_by.startswith("python bench/bench_learned_speeds")
    policy = registry.build("lp-lookahead", registry.PolicyOptions(world="dl2"))
    tr = generate(TraceConfig(num_jobs=5, max_arrivals_per_slot=3), seed=4)
    cfg = E.SimConfig(cluster=preset("tiny"), max_workers=4, max_ps=4)
    res = E.run(tr, policy, cfg, seed=0)
    assert np.isfinite(res.jct_slots).all() and policy.rule.slots > 0


def test_the_shipped_table_gives_its_recorded_validation_jct_under_the_planner():
    from dl2d.policy.target import train as TT
    table, _, meta = LS.load()
    v = meta["validation"]
    setup = TT.TrainSetup(world=meta["world"], cluster=meta["cluster"], jobs=meta["jobs"])
    cfg = TT.sim_config(setup)
    res = E.run(TT.make_trace(setup, cfg, v["seed"]), LP.on_table(table, in_bucket=8), cfg, seed=v["seed"])
    assert float(res.jct_slots.mean()) == pytest.approx(v["jct_slots"], abs=1e-2)
