"""The Pollux baseline (dl2d.policy.baselines.pollux): its fitness, the repair of a candidate allocation, the
elitist search, and a run on a tuned Pollux workload in the reference preset, where its jobs adapt their batch."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dl2d.policy import registry
from dl2d.policy.baselines import pollux as PX
from dl2d.sim import engine as E
from dl2d.sim import presets
from dl2d.sim.trace import from_workload
from dl2d.sim.worlds import world
from dl2d.workload import batching, throughput
from dl2d.workload.catalog import model_index
from dl2d.workload.workloads import packaged_workload


def test_the_fitness_is_the_power_mean_minus_one_of_the_speedups():
    assert PX.power_mean(np.array([1.0, 3.0])) == pytest.approx(2 / (1 / 1.001 + 1 / 3.001))
    assert PX.power_mean(np.array([[0.0, 10.0]]))[0] < 0.002  # a job left with nothing sinks the allocation


def search(jobs=4, nodes=3, seed=0):
    rng = np.random.default_rng(seed)
    speedup = np.cumsum(rng.uniform(0.1, 1.0, (jobs, PX.MAX_NODES + 1, 9)), axis=2)
    caps = np.array([8, 2, 5, 1][:jobs])
    base = np.zeros((jobs, nodes), int)
    base[0, 0] = 2
    return PX.Search(speedup, caps, np.array([4, 4, 2][:nodes]), base, np.full(jobs, 0.5), 1 / 10, rng)


def test_a_repaired_allocation_keeps_every_rule():
    s = search()
    states = s.repair(s.rng.integers(0, 5, (200, 4, 3)))
    assert np.all(states.sum(axis=1) <= s.node_gpus)  # no node above its GPUs
    assert np.all(states.sum(axis=2) <= s.caps)  # no job above its cap
    spread = np.count_nonzero(states, axis=2) > 1
    assert np.all(((states > 0) & spread[..., None]).sum(axis=1) <= 1)  # one job over several nodes a node
    assert states.min() >= 0


def test_the_search_keeps_the_best_it_met_and_finds_better_than_the_allocation_it_starts_from():
    s = search()
    pop = s.run(s.base[None], generations=30, population=40)
    fit = s.fitness(pop)
    assert np.all(np.diff(fit) <= 1e-12)  # sorted, best first: elitist
    assert fit[0] > s.fitness(s.repair(s.base[None]))[0]


def test_the_goodput_table_is_pollux_s_model_of_the_job():
    """A fixed batch on r GPUs over k nodes: its gain over the fit's step time, accumulation included."""
    lim, fit = batching.limits("bert"), throughput.throughput_model("bert").fit
    table = PX.goodput_table("bert", 96.0, False, (1.0, 3.0), 12, PX.MAX_NODES)
    assert table[3, 2] == 0 and table[0, 4] == 0  # more nodes than GPUs, no node
    atomic, accum = batching.split(96.0, 4, lim)  # 24 a GPU over two passes of 12
    assert (atomic, accum) == (12, 1)
    step = float(fit.step_time(4, 2, atomic)) + accum * (fit.alpha_grad + fit.beta_grad * atomic)
    gain = (3.0 + 1.0) / (3.0 / (96 / 12) + 1.0)
    assert table[2, 4] == pytest.approx(gain / step)
    adaptive = PX.goodput_table("bert", 96.0, True, (1.0, 3.0), 12, PX.MAX_NODES)
    assert np.all(adaptive[1:, 1:] >= table[1:, 1:] * (1 - 1e-9))  # a batch of its own is never worse


def test_pollux_runs_a_tuned_workload_adapting_batches_and_beats_tiresias():
    settings = presets.resolve("reference", {})
    cfg = presets.sim_config(settings, world("today").sim_config("t4-16"))
    jobs = packaged_workload(2, "workloads")[:40]
    plain = from_workload(jobs, 60.0, interference_sigma=0.0)
    ncf = plain.type_idx == model_index("ncf")
    trace = replace(from_workload(jobs, 60.0, interference_sigma=0.0, adaptive=True), batch_size=np.where(
        ncf, 32768.0, plain.batch_size))
    trace = replace(trace, adaptive=trace.adaptive & ~ncf)
    batches = []
    res = E.run(trace, PX.Pollux(seed=0, generations=20), cfg, on_slot=lambda st: batches.append(st.batch.copy()))
    tiresias = E.run(plain, registry.build("tiresias", registry.PolicyOptions(baseline_rules="reference")), cfg)
    assert res.avg_jct_slots < tiresias.avg_jct_slots
    changed = np.any(np.array(batches) != trace.batch_size[None, :], axis=0)
    assert changed[trace.adaptive].mean() > 0.5 and not changed[ncf].any()
    assert registry.get("pollux").daemon is False
