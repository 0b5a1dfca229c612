"""No job starts before it is submitted, in any configuration: a job submitted within a slot is first seen at the
next slot boundary (as a daemon deciding at slot boundaries sees it) and its JCT counts from its submission,
in the NumPy engine, the JAX environment, the bounds, trace files and the daemon's demo."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dl2d.sim import bound as B
from dl2d.sim import engine as E
from dl2d.sim import trace as T
from dl2d.sim.worlds import world
from dl2d.workload import philly
from dl2d.workload.workloads import WorkloadJob

SLOT = 60.0


def jobs_at(*seconds: float) -> list[WorkloadJob]:
    return [WorkloadJob(name=f"j{i}", arrival_s=s, model="cifar10", gpus=1, batch_size=128.0)
            for i, s in enumerate(seconds)]


def test_a_job_is_seen_at_the_slot_boundary_after_its_submission():
    tr = T.from_workload(jobs_at(0.0, 45.0, 60.0, 61.0), SLOT, interference_sigma=0.0)
    assert tr.arrival_slot.tolist() == [0, 1, 1, 2]
    assert tr.submitted.tolist() == pytest.approx([0.0, 0.75, 1.0, 61 / 60])


def contended(seed: int) -> T.Trace:
    wl = philly.generate(24, load=4.0, cluster_gpus=16, seed=seed, max_gpus=16)
    tr = T.from_workload(wl, SLOT, seed=seed)
    return replace(tr, est_epochs=np.minimum(tr.est_epochs, 2.0), true_epochs=np.minimum(tr.true_epochs, 2.0))


@pytest.mark.parametrize("policy, preset", [("elastic-chooser", "dl2d"), ("drf", "dl2d"), ("slurm", "dl2d"),
                                            ("tiresias", "dl2d"), ("optimus", "dl2d"), ("tiresias", "reference"),
                                            ("optimus-oracle", "reference"), ("elastic", "reference")])
def test_no_job_trains_before_its_submission_and_its_jct_counts_from_it(policy, preset):
    """In dl2d's own twin and in the reference preset (the Pollux artifact's rules: batch cap and accumulation,
    interpolated placements, progress as work, its baselines' rules), the bound's too."""
    from dl2d.policy import registry
    from dl2d.sim import presets
    from dl2d.sim.cluster import ClusterSpec, T4_NODE

    settings = presets.resolve(preset, {})
    cfg = presets.sim_config(settings, replace(world("today").sim_config(), cluster=ClusterSpec(4, **T4_NODE)))
    tr = contended(3)
    assert np.any(tr.submitted < tr.arrival_slot), "the trace must have jobs submitted within a slot"
    first_run = np.full(len(tr), np.inf)

    def watch(state):  # called after each slot: the slot that just ran is state.slot - 1
        ran = (state.workers > 0) & np.isinf(first_run)
        first_run[ran] = state.slot - 1

    res = E.run(tr, registry.build(policy, registry.PolicyOptions(baseline_rules=settings["baseline_rules"])), cfg,
                seed=0, on_slot=watch)
    assert np.all(first_run >= tr.arrival_slot) and np.all(tr.arrival_slot >= tr.submitted)
    finish = tr.submitted + res.jct_slots
    # a job trains from the start of a slot at or after its submission, and finishes after it started
    assert np.all(finish > first_run) and np.all(res.jct_slots > tr.arrival_slot - tr.submitted)
    bound = B.lower_bound(tr, cfg)
    assert res.avg_jct_slots >= bound.avg_jct_slots - 1e-9


def test_the_jax_environment_counts_jct_from_submission():
    from dl2d.sim import jaxenv as X

    tr = contended(5)
    _, state = X.from_trace(tr, world("today").sim_config(), max_jobs=len(tr) + 2)
    assert int(state.slot) == int(tr.arrival_slot.min())
    finish = np.concatenate([tr.arrival_slot + 2.5, [np.nan, np.nan]])
    ended = state.replace(finish_time=finish.astype(np.asarray(state.finish_time).dtype))
    jct = np.asarray(X.jct(ended))
    assert jct[:len(tr)] == pytest.approx(tr.arrival_slot + 2.5 - tr.submitted, abs=1e-3)
    assert np.all(jct[:len(tr)] > 2.5 - 1e-3) and np.isnan(jct[len(tr):]).all()


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_a_trace_file_keeps_each_submission(tmp_path, suffix):
    tr = T.from_workload(jobs_at(5.0, 45.0, 120.0), SLOT, interference_sigma=0.0)
    path = tmp_path / f"t{suffix}"
    T.save(tr, path)
    back = T.load(path)
    assert back.arrival_slot.tolist() == [1, 1, 2]
    assert back.submitted == pytest.approx(tr.submitted)


def test_a_submission_outside_the_slot_before_its_arrival_is_refused(tmp_path):
    rec = {"id": 0, "arrival_slot": 2, "type": "cifar10", "est_epochs": 1, "true_epochs": 1, "speed_factor": 1,
           "batch_size": 128, "requested_workers": 1}
    assert T.from_records([{**rec, "submitted_slot": 1.5}]).submitted.tolist() == [1.5]
    for bad in (2.5, 1.0, 0.2):  # after its arrival; a whole slot or more before it
        with pytest.raises(T.TraceError, match="submitted_slot"):
            T.from_records([{**rec, "submitted_slot": bad}])
    with pytest.raises(T.TraceError, match="ceil"):
        T.Trace(np.array([1]), np.array([0]), np.ones(1), np.ones(1), np.ones(1), submitted=np.array([1.5]))
