"""A site's calibrated speed model (dl2ctl calibrate's file) in the simulator: the truth and the scheduler's
estimate of the models it holds; the measured lookup for the others; the lower bound on the same curves."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dl2d.core.contract import Allocation
from dl2d.sim import engine
from dl2d.sim.bound import lower_bound
from dl2d.sim.cluster import preset
from dl2d.sim.trace import Trace
from dl2d.workload import catalog
from dl2d.workload.speedfit import SiteSpeeds, parse_speed_model

#: cifar10 on 1..16 GPUs: 100 s per epoch on one, 10 s more per GPU past 4 (a made-up site curve)
CURVE = [100.0 / g if g <= 4 else 25.0 + 10.0 * (g - 4) for g in range(1, 17)]
FILE = ('{"format": "dl2d-speed-model", "version": 1, "classes": {"cifar10": {"seconds_per_epoch": %s}}}'
        % CURVE)


def two_jobs() -> Trace:
    t = np.array([catalog.MODEL_INDEX["cifar10"], catalog.MODEL_INDEX["bert"]])
    return Trace(arrival_slot=np.array([0, 0]), type_idx=t, est_epochs=np.array([1e6, 1e6]),
                 true_epochs=np.array([1e6, 1e6]), speed_factor=np.ones(2), batch_size=np.array([512.0, 96.0]))


def trained(cfg: engine.SimConfig, workers: int) -> np.ndarray:
    trace = two_jobs()
    state = engine.SimState.initial(2)
    alloc = Allocation(np.array([workers, workers]), np.zeros(2, int))
    nxt, _, _ = engine.step(trace, state, alloc, cfg, np.random.default_rng(0))
    return nxt.epochs_done


def test_the_site_curve_is_the_truth_and_the_estimate_of_its_models_and_the_others_keep_the_lookup():
    site = SiteSpeeds.of(parse_speed_model(FILE))
    base = engine.SimConfig(cluster=preset("t4-16"), slot_seconds=600.0, slot_noise=0.0)
    cfg = replace(base, site_speeds=site)
    for w in (1, 4, 8):
        done_site, done_measured = trained(cfg, w), trained(base, w)
        assert done_site[0] == pytest.approx(600.0 / CURVE[w - 1])  # cifar10: the site's curve
        assert done_site[1] == pytest.approx(done_measured[1])  # bert: not in the file, the measured lookup
        assert done_site[0] != pytest.approx(done_measured[0])
    est = engine.trace_speed_estimate(two_jobs(), cfg)
    assert est[0, 0, 8] == pytest.approx(1 / CURVE[7]) and est[0, 0, 0] == 0.0
    assert est[1, 0, 8] == pytest.approx(engine.trace_speed_estimate(two_jobs(), base)[1, 0, 8])
    bound = lower_bound(two_jobs(), cfg)
    assert bound.min_seconds[0] == pytest.approx(1e6 * min(CURVE))  # fastest on the site's curve: 4 GPUs


def test_beyond_its_curve_a_class_trains_at_the_last_point():
    site = SiteSpeeds.of(parse_speed_model(FILE))
    assert site.epochs_per_s("cifar10", 64) == pytest.approx(1 / CURVE[-1])
    assert site.epochs_per_s("cifar10", 0) == 0.0 and site.epochs_per_s("resnet", 2) is None
    assert hash(replace(engine.SimConfig(), site_speeds=site))  # a config holding it is still a value


def test_dl2ctl_sim_runs_on_a_speed_model_file_and_names_what_it_does_not_use(tmp_path):
    import json

    from click.testing import CliRunner

    from dl2d.cli.main import cli

    f = tmp_path / "site.json"
    f.write_text('{"format": "dl2d-speed-model", "version": 1, "classes": {"cifar10": {"seconds_per_epoch": '
                 '[400, 220, 150, 120, 110, 100, 95, 90]}, "llama": {"seconds_per_epoch": [10]}}}')
    args = ["sim", "--policy", "elastic", "--jobs", "30", "--json"]
    measured = CliRunner().invoke(cli, args)
    site = CliRunner().invoke(cli, [*args, "--speed-model", str(f)])
    assert measured.exit_code == 0 and site.exit_code == 0, site.output + site.stderr
    a, b = json.loads(measured.stdout), json.loads(site.stdout)
    assert b["sim"]["speed_model"] == str(f) and a["sim"]["speed_model"] == "measured"
    assert b["results"][0]["avg_jct_slots"] != a["results"][0]["avg_jct_slots"]  # cifar10 jobs train at the site's speed
    assert b["lower_bound"]["avg_jct_slots"] != a["lower_bound"]["avg_jct_slots"]
    assert "llama: no all-reduce model of this trace" in site.stderr
    bad = CliRunner().invoke(cli, [*args, "--speed-model", str(tmp_path / "nope.json")])
    assert bad.exit_code == 2 and "--speed-model" in bad.stderr and "cannot read it" in bad.stderr


# ------------------------------------------------------------------------------------------ a site's own classes

LLM = ('{"format": "dl2d-speed-model", "version": 1, "classes": {"my-llm": {"seconds_per_epoch": [900, 500, 350, 300],'
       ' "jobs": 4, "epochs": 5}}}')


def llm_job(requested: int) -> Trace:
    """One job of a site's own class "my-llm", which no catalog model is: only the site's file says its speed."""
    return Trace(arrival_slot=np.array([0]), type_idx=np.array([catalog.UNSEEN]), est_epochs=np.array([5.0]),
                 true_epochs=np.array([5.0]), speed_factor=np.ones(1), requested=np.array([requested]),
                 site_class=np.array(["my-llm"], dtype=object))


def test_a_job_of_a_sites_own_class_trains_at_its_curve_and_the_bound_uses_it():
    site = SiteSpeeds.of(parse_speed_model(LLM))
    cfg = engine.SimConfig(cluster=preset("t4-16"), slot_seconds=60.0, slot_noise=0.0, resize_overhead_s=30.0,
                           site_speeds=site)
    from dl2d.policy import registry

    res = engine.run(llm_job(3), registry.build("slurm"), cfg)  # Slurm as it is: the 3 GPUs it asked for
    assert res.jct_slots[0] == pytest.approx((30.0 + 5 * 350.0) / 60.0)
    assert res.per_type_jct_hours() == {"site classes": pytest.approx(res.jct_slots[0] / 60.0)}
    # the bound: alone at its fastest (4 GPUs, the curve's last point and beyond), noise off
    assert lower_bound(llm_job(3), cfg).avg_jct_slots == pytest.approx((30.0 + 5 * 300.0) / 60.0)


def test_a_sites_class_without_a_curve_is_refused_naming_the_job_and_the_class(tmp_path):
    from click.testing import CliRunner

    from dl2d.cli.main import cli
    from dl2d.policy import registry
    from dl2d.sim import trace as T

    cfg = engine.SimConfig(cluster=preset("t4-16"), slot_seconds=60.0)
    with pytest.raises(T.TraceError, match="job 1: class 'my-llm' has no curve in the speed model"):
        engine.run(llm_job(2), registry.build("slurm"), cfg)
    path = tmp_path / "jobs.json"
    T.save(llm_job(2), path)
    assert '"type": "site:my-llm"' in path.read_text()  # a trace file names it site:CLASS
    back = T.load(path)
    assert list(back.site_class) == ["my-llm"] and back.type_idx[0] == catalog.UNSEEN
    r = CliRunner().invoke(cli, ["sim", "--trace", str(path), "--json"])
    assert r.exit_code == 2 and "class 'my-llm' has no curve" in r.output and "--trace" in r.output
    site = tmp_path / "site.json"
    site.write_text(LLM)
    r = CliRunner().invoke(cli, ["sim", "--trace", str(path), "--speed-model", str(site), "--policy", "slurm",
                                 "--slot-noise", "0", "--json"])
    assert r.exit_code == 0, r.output
    import json

    assert json.loads(r.output)["results"][0]["avg_jct_slots"] == pytest.approx((30.0 + 5 * 500.0) / 60.0, abs=1e-3)
    path.write_text(path.read_text().replace("site:my-llm", "site:my llm"))
    with pytest.raises(T.TraceError, match="job 1: site class 'my llm'"):
        T.load(path)


def test_training_traces_of_a_site_with_its_job_mix_hold_its_own_classes():
    """`dl2ctl train --speed-model FILE` on a calibrated file with the site's mix: the training traces are of
    its classes, as often as they came and as long, and the rest of the trace (arrivals, GPUs) is Philly's."""
    from dl2d.policy.target import train as TT
    text = LLM.replace('"jobs": 4', '"jobs": 1').replace('}}}', '}, "cifar10": {"seconds_per_epoch": [50, 30],'
                                                          ' "jobs": 3, "epochs": 8}}}')
    site = SiteSpeeds.of(parse_speed_model(text))
    assert site.mix == (("cifar10", 3, 8.0), ("my-llm", 1, 5.0))
    setup = TT.TrainSetup(jobs=400, clusters=1)
    plain = TT.make_trace(setup, TT.sim_config(setup), 3)
    tr = TT.make_trace(setup, TT.sim_config(setup, site), 3)
    llm = tr.type_idx == catalog.UNSEEN
    assert set(tr.site_class[llm]) == {"my-llm"} and set(tr.type_idx[~llm]) == {catalog.MODEL_INDEX["cifar10"]}
    assert 0.18 < llm.mean() < 0.32  # 1 job in 4
    assert set(tr.est_epochs[llm]) == {5.0} and set(tr.est_epochs[~llm]) == {8.0}
    np.testing.assert_array_equal(tr.arrival_slot, plain.arrival_slot)
    np.testing.assert_array_equal(tr.requested, plain.requested)


# ------------------------------------------------------------------------------------------ packed vs spread

SPREAD = ('{"format": "dl2d-speed-model", "version": 1, "classes": {"my-llm": {"seconds_per_epoch": [900, 500, 350,'
          ' 300], "spread": {"slowdown": 0.6}}}}')


def test_a_class_spread_over_more_nodes_than_it_needs_trains_slower_by_its_slowdown_in_both_simulators():
    """2 GPUs on one 4-GPU node (packed), on two (spread: 60 % longer an epoch), 4 GPUs on one and on two."""
    from dl2d.sim import allreduce
    from dl2d.sim import jaxenv as X

    site = SiteSpeeds.of(parse_speed_model(SPREAD))
    assert site.spread_slowdown("my-llm") == 0.6 and site.spread_slowdown("other") == 0.0
    placements = {(0, 0): 1 / 500, (0, 1): 1 / 500 / 1.6, (0, 0, 0, 0): 1 / 300, (0, 0, 1, 1): 1 / 300 / 1.6}
    got = allreduce.epoch_rates(["my-llm"] * 4, [0.0] * 4, [list(p) for p in placements], [1.0] * 4, site, 4)
    np.testing.assert_allclose(got, list(placements.values()))
    trace = Trace(arrival_slot=np.zeros(4, int), type_idx=np.full(4, catalog.UNSEEN), est_epochs=np.ones(4),
                  true_epochs=np.ones(4), speed_factor=np.ones(4), site_class=np.array(["my-llm"] * 4, dtype=object))
    cfg = engine.SimConfig(cluster=preset("t4-16"), site_speeds=site)
    params, state = X.from_trace(trace, cfg, 4)
    counts = np.zeros((4, 16), np.int32)
    for j, p in enumerate(placements):
        np.add.at(counts[j], list(p), 1)
    rate, _ = X._allreduce_rates(params, state.jobs, counts.sum(axis=1), counts)
    np.testing.assert_allclose(np.asarray(rate), list(placements.values()), rtol=1e-6)


def test_calibration_fits_the_packed_curve_and_the_spread_slowdown_and_skips_moves():
    from dl2d.workload.calibration import calibrate, calibrate_spread, gather

    spec = {"kind": "allreduce", "label": "my-llm", "workers": 2, "worker": {"gpus": 1}}

    def rows(job_id, workers, nodes, seconds, n=6):
        return [{"job_id": job_id, "number": k, "workers": workers, "epochs_per_s": 1 / seconds, "ended": False,
                 "nodes": nodes, "job_type": "llm", "spec": spec, "total_epochs": 5.0} for k in range(n)]

    data = rows(1, 2, 1, 500.0) + rows(2, 4, 1, 300.0) + rows(3, 2, 2, 800.0) + rows(4, 4, 2, 480.0)
    moved = rows(5, 2, 1, 500.0, n=2)
    moved[1].update(nodes=2, epochs_per_s=1 / 5000.0)  # same size, other nodes: a restart, no speed
    data += moved
    classes = calibrate(data, per_node=4, max_gpus=8)
    curve = classes["my-llm"][1]
    assert curve[2] == pytest.approx(500.0) and curve[4] == pytest.approx(300.0)
    slowdown, seen = calibrate_spread(gather(data, 4), classes)["my-llm"]
    assert slowdown == pytest.approx(0.6) and seen == {2: (5, 800.0), 4: (5, 480.0)}
    doc = __import__("dl2d.workload.speedfit", fromlist=["speed_model_doc"]).speed_model_doc(
        classes, "test", spread=calibrate_spread(gather(data, 4), classes))
    import json

    back = SiteSpeeds.of(parse_speed_model(json.dumps(doc)))
    assert back.spread_slowdown("my-llm") == pytest.approx(0.6)
