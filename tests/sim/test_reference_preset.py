"""The twin's reference preset (dl2d.sim.presets) agrees with the Pollux artifact's simulator job by job: its
published per-job JCTs at job load 1.0 (dl2d/workload/data/pollux/results-jobload-1.0, credit there) against
dl2d's Tiresias and Optimus+Oracle on the same workload in the preset, and dl2d's own rules do not. The preset
is a setting of `dl2ctl sim`, each of its parts an option recorded in the JSON; the bounds hold under it and the
JAX environment refuses what it does not model."""
from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest
from click.testing import CliRunner
from testkit.as_user import dl2ctl

from dl2d.cli.main import cli
from dl2d.policy import registry
from dl2d.sim import bound as B
from dl2d.sim import engine as E
from dl2d.sim import presets
from dl2d.sim.trace import from_workload
from dl2d.sim.worlds import world
from dl2d.workload.workloads import packaged_workload

PUBLISHED = {"tiresias": "tiresias", "optimus-oracle": "optimus"}


def published(policy: str, k: int) -> dict[str, float]:
    path = resources.files("dl2d.workload").joinpath("data/pollux/results-jobload-1.0", f"{PUBLISHED[policy]}.json")
    return json.loads(path.read_text())["jcts"][f"workload-{k}"]


def run(policy: str, k: int, preset: str, **given):
    settings = presets.resolve(preset, given)
    cfg = presets.sim_config(settings, world("today").sim_config("t4-16"))
    jobs = packaged_workload(k, "workloads")
    trace = from_workload(jobs, cfg.slot_seconds, seed=k, interference_sigma=settings["interference"])
    res = E.run(trace, registry.build(policy, registry.PolicyOptions(baseline_rules=settings["baseline_rules"])),
                cfg, seed=k)
    return {j.name: float(t) * cfg.slot_seconds for j, t in zip(jobs, res.jct_slots)}, trace, cfg, res


def agreement(ours: dict, theirs: dict) -> tuple[float, float]:
    """(our average / theirs, the median per-job |ratio - 1|)."""
    a = np.array([ours[j] for j in theirs])
    b = np.array(list(theirs.values()))
    return float(a.mean() / b.mean()), float(np.median(np.abs(a / b - 1)))


@pytest.mark.parametrize("policy, k", [("tiresias", 8), ("optimus-oracle", 3)])
def test_the_reference_preset_agrees_with_the_artifact_job_by_job(policy, k):
    """The acceptance of the preset: the average within 5 %, the median job within 10 % (bench/bench_reference.py
    measures all eight workloads). dl2d's own rules, no interference either, are 10-25 % off the median job: the
    rules, not chance, make the agreement."""
    theirs = published(policy, k)
    avg, med = agreement(run(policy, k, "reference")[0], theirs)
    assert abs(avg - 1) < 0.05 and med < 0.10, (avg, med)
    _, own = agreement(run(policy, k, "dl2d", interference=0.0, slot_noise=0.0, shared_node_slowdown=0.0)[0],
                       theirs)
    assert own > 0.10 and own > 3 * med, (own, med)


def test_each_rule_of_the_preset_is_its_own_setting():
    """An option given beside a preset wins over it; the rest are the preset's; with neither, dl2d's own."""
    ref = presets.resolve("reference", {"work": "iterations"})
    assert ref["work"] == "iterations" and ref["accumulate"] == "artifact" and ref["off_table"] == "interpolate"
    assert ref["baseline_rules"] == "reference" and ref["interference"] == 0.0 and ref["batch_change"] == "in-place"
    own = presets.resolve("dl2d", {})
    assert own == {"interference": 0.27, "slot_noise": 0.1, "shared_node_slowdown": 0.1, "allreduce_placement": "pack",
                   "accumulate": "none", "off_table": "fit", "work": "iterations", "baseline_rules": "dl2d",
                   "batch_change": "restart"}
    assert presets.resolve("dl2d", {}, world("dl2"))["shared_node_slowdown"] == 0.0
    assert presets.speed_rules(own) == presets.speed_rules(presets.resolve("dl2d", {"accumulate": "none"}))
    with pytest.raises(ValueError, match="unknown preset"):
        presets.resolve("pollux", {})


def test_the_bounds_hold_in_the_preset():
    """Both lower bounds read the preset's speed rules (a bound on dl2d's rules would not be one here)."""
    from dl2d.sim.bound import _node_splits, fastest_placement_rate
    from dl2d.sim.lp_bound import lp_lower_bound
    from dl2d.workload import catalog

    rules = presets.speed_rules(presets.resolve("reference", {}))
    for model, batch in (("bert", 384.0), ("yolov3", 64.0), ("cifar10", 512.0)):
        for workers in (5, 9, 17):
            every = max(catalog.allreduce_epoch_rate(model, batch, p, rules) for p in _node_splits(workers, 4, 16))
            assert fastest_placement_rate(model, batch, workers, 1, 4, 16, rules) == pytest.approx(every, rel=1e-12)
    settings = presets.resolve("reference", {})
    cfg = presets.sim_config(settings, world("today").sim_config("t4-16"))
    trace = from_workload(packaged_workload(2, "workloads")[:30], cfg.slot_seconds, interference_sigma=0.0)
    bounds = (lp_lower_bound(trace, cfg).avg_jct_slots, B.lower_bound(trace, cfg).avg_jct_slots)
    for policy in ("tiresias", "optimus-oracle", "elastic"):
        res = E.run(trace, registry.build(policy, registry.PolicyOptions(baseline_rules="reference")), cfg)
        assert max(bounds) <= res.avg_jct_slots + 1e-9, (policy, bounds, res.avg_jct_slots)


def test_the_jax_environment_refuses_rules_it_does_not_model():
    from dl2d.sim import jaxenv as X

    cfg = presets.sim_config(presets.resolve("reference", {}), world("today").sim_config())
    with pytest.raises(ValueError, match="speed rules"):
        X.make_params(cfg, 8, has_allreduce=True, placement=True)


def test_the_simulator_command_takes_the_preset_and_records_each_setting():
    r = CliRunner().invoke(cli, ["sim", "--preset", "reference", "--workload", "pollux:1", "--policy", "tiresias",
                                 "--work", "iterations", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["sim"]["preset"] == "reference" and out["sim"]["baseline_rules"] == "reference"
    assert out["sim"]["speed_rules"] == {"accumulate": True, "one_gpu_accumulates": True, "off_table": "interpolate",
                                         "work": "iterations"}
    assert out["sim"]["slot_noise"] == 0.0 and out["sim"]["shared_node_slowdown"] == 0.0
    assert out["sim"]["allreduce_placement"] == "spread" and out["trace"]["interference"] == 0.0
    bad = CliRunner().invoke(cli, ["sim", "--world", "dl2", "--preset", "reference"])
    assert bad.exit_code == 2 and "--preset reference is a setting of today's world" in bad.output


def test_the_command_in_the_docs_as_typed():
    """docs/simulator.md's comparison with the artifact: both baselines, one workload, in the preset."""
    text = (resources.files("dl2d").parent / "docs" / "simulator.md").read_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("dl2ctl sim --preset reference"))
    r = dl2ctl(*line.split()[1:], "--json")
    assert r.returncode == 0, r.stderr
    rows = {x["policy"]: x for x in json.loads(r.stdout)["results"]}
    for policy in ("tiresias", "optimus-oracle"):
        theirs = published(policy, 1)
        assert rows[policy]["finished"] and abs(rows[policy]["avg_jct_hours"] * 3600 / np.mean(list(theirs.values()))
                                                - 1) < 0.05
