"""`dl2ctl train --policy dl2-target`: the target-size policy trained in today's world on a site's speed model
(the site's twin), and its error paths (each names the option, nothing is written)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from dl2d.cli.main import cli
from dl2d.policy.target import train as TT
from dl2d.policy.checkpoint import load_target
from dl2d.sim import jaxenv as X
from dl2d.workload.catalog import ALLREDUCE_MODELS
from dl2d.workload.speedfit import SiteSpeeds, load_speed_model

TINY = ["train", "--policy", "dl2-target", "--jobs", "6", "--clusters", "2", "--slots", "4", "--val-traces", "1",
        "--servers", "4"]
UNVALIDATED = [a for a in TINY if a not in ("--val-traces", "1")]  # the world's own number of validation traces


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def site_file(path, seconds_one_gpu: float, extra: dict | None = None):
    """A speed model holding every model of today's traces: ``seconds_one_gpu`` per epoch on one GPU, linear."""
    classes = {m: {"seconds_per_epoch": [seconds_one_gpu / g for g in range(1, 65)]} for m in ALLREDUCE_MODELS}
    path.write_text(json.dumps({"format": "dl2d-speed-model", "version": 1, "classes": {**classes, **(extra or {})}}))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("target")
    site = site_file(d / "site.json", 600.0, {"my-label": {"seconds_per_epoch": [100.0]}})
    out = d / "p.msgpack"
    r = invoke(*TINY, "--sl-iters", "1", "--rl-iters", "1", "--plan-rounds", "1", "--plan-traces", "1",
               "--plan-iters", "5", "--speed-model", str(site), "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    return site, out, json.loads(r.output[r.output.index("{"):]), r.output


@pytest.fixture(scope="module")
def dl2_world(tmp_path_factory):
    """A policy trained in the DL2 world with its defaults (the planner learned, every whole count a level)."""
    out = tmp_path_factory.mktemp("dl2") / "d.msgpack"
    r = invoke(*UNVALIDATED, "--world", "dl2", "--clusters", "1", "--sl-iters", "1", "--rl-iters", "1",
               "--plan-iters", "10", "--out", str(out))
    assert r.exit_code == 0, r.output
    return out, r.output


def test_trains_on_the_site_twin_and_records_it(trained):
    site, out, res, output = trained
    assert "my-label: not a model of the training traces" in output  # named, not silently dropped
    assert res["world"] == "today" and res["speed_model"] == str(site) and res["servers"] == 4
    # the planner is learned in today's world only when asked (it is elastic's equal there, and 15x slower)
    assert [(r["phase"], r["iter"]) for r in res["curve"]] == [("sl", 1), ("plan", 1), ("rl", 1)]
    assert res["teacher"] == "elastic"  # today's world's best heuristic, the default teacher there
    assert res["val_jct_slots"]["elastic"] > 0 and res["val_jct_slots"]["learned"] > 0
    ratio = res["val_jct_slots"]["learned"] / res["val_jct_slots"]["elastic"]
    assert res["verdict"] == ("better" if ratio < 0.995 else "worse" if ratio > 1.005 else "tie")
    bound = res["val_jct_slots"]["lower_bound"]  # how much room the teacher left: below every policy
    assert 0 < bound["every_run"] <= bound["nominal"]
    assert bound["every_run"] <= min(res["val_jct_slots"]["elastic"], res["val_jct_slots"]["learned"])
    ck = load_target(out)
    assert ck.config.max_workers == 64 and ck.meta["world"] == "today" and ck.meta["speed_model"] == str(site)
    assert ck.meta["setup"]["plan_rounds"] == 1 and not ck.config.every_count  # on the base levels there
    assert ck.meta["validation_seeds"] == [10_000, 10_000] and ck.meta["train_seeds"] == [0, 1]
    assert ck.meta["teacher_validation_jct_mean"] == pytest.approx(res["val_jct_slots"]["elastic"], abs=1e-3)
    assert ck.meta["command"].startswith("dl2ctl train --policy dl2-target")
    assert f"--speed-model {site}" in ck.meta["command"]


def test_a_rescored_checkpoint_records_what_training_scored_and_why(trained, tmp_path):
    """train.rescore scores a checkpoint again as training did (here the same simulator: the same figures), keeps
    the figures it replaced, and needs the speed model its meta names."""
    import shutil

    site, out, res, _ = trained
    copy = tmp_path / "copy.msgpack"
    shutil.copy(out, copy)
    with pytest.raises(ValueError, match="speed model"):
        TT.rescore(str(copy), "a test")
    before = load_target(copy).meta
    meta = TT.rescore(str(copy), "a test", site=SiteSpeeds.of(load_speed_model(site), source=str(site)))
    assert meta["validation_jct"] == before["validation_jct"]
    assert meta["teacher_validation_jct_mean"] == pytest.approx(res["val_jct_slots"]["elastic"], abs=1e-3)
    assert meta["rescored"]["why"] == "a test" and meta["rescored"]["before"]["validation_jct"] == before["validation_jct"]
    assert load_target(copy).meta == meta and load_target(copy).params.keys() == load_target(out).params.keys()


def test_the_trained_checkpoint_runs_in_the_simulator(trained):
    site, out, _, _ = trained
    r = invoke("sim", "--policy", "dl2-target", "--checkpoint", str(out), "--jobs", "6", "--servers", "4",
               "--speed-model", str(site), "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index("{"):])["results"][0]
    assert res["policy"] == "dl2-target" and res["avg_jct_slots"] > 0


def test_the_site_curves_are_the_training_environments_truth(tmp_path):
    """What --speed-model changes: every all-reduce job of the training traces runs at the file's curve (the
    environment's per-job site rates), and twice the seconds per epoch halves them."""
    setup = TT.TrainSetup(jobs=6, clusters=2, servers=4)
    rates = []
    for seconds in (600.0, 1200.0):
        site = SiteSpeeds.of(load_speed_model(site_file(tmp_path / f"s{seconds}.json", seconds)), "s")
        cfg = TT.sim_config(setup, site)
        trace = TT.make_trace(setup, cfg, 0)
        jobs = X.job_arrays(trace, cfg, setup.jobs)
        assert np.asarray(jobs.use_site).all()
        rates.append(np.asarray(jobs.site_rate))
        np.testing.assert_allclose(rates[-1][:, 4], 4 / seconds, rtol=1e-5)  # 4 GPUs: 4 x one GPU's rate
    np.testing.assert_allclose(rates[0], 2 * rates[1], rtol=1e-5)


def test_style_both_trains_on_jobs_as_submitted_and_as_tuned():
    """--style both: even trace seeds are the Philly jobs as submitted, odd ones the same kind of jobs with the
    configurations Pollux tuned (several GPUs and a larger batch each), recorded in the trace's config."""
    setup = TT.TrainSetup(jobs=40, style="both")
    cfg = TT.sim_config(setup)
    even, odd = TT.make_trace(setup, cfg, 4), TT.make_trace(setup, cfg, 5)
    assert even.config["style"] == "realistic" and odd.config["style"] == "tuned"
    tuned_alone = TT.make_trace(TT.TrainSetup(jobs=40, style="tuned"), cfg, 5)
    np.testing.assert_array_equal(odd.batch_size, tuned_alone.batch_size)
    assert np.median(odd.batch_size / np.maximum(odd.requested, 1)) > 2 * np.median(
        even.batch_size / np.maximum(even.requested, 1))
    assert np.mean(odd.requested > 1) > 0.5 > np.mean(even.requested > 1)


@pytest.mark.parametrize("args,message", [
    (["--speed-model", "SITE", "--world", "dl2"], "--world today only"),
    (["--speed-model", "ONLY_LABELS"], "none of its classes"),
    (["--speed-model", "MISSING"], "--speed-model"),
    (["--teacher", "drf"], "'drf' is not one --policy dl2-target learns from"),
    (["--sl-iters", "0", "--rl-iters", "0"], "nothing to train"),
    (["--plan-rounds", "1", "--plan-traces", "3"], "plan_traces (3) is more than the training traces (2)"),
    (["--val-seed", "1"], "validation must be held out"),
    (["--style", "tuned", "--world", "dl2"], "--world today only"),
    (["--clusters", "0"], "--clusters"),
    (["--init", "NOT_A_CHECKPOINT"], "--init"),
])
def test_bad_input_names_the_option_and_writes_nothing(tmp_path, args, message):
    subst = {"SITE": str(site_file(tmp_path / "site.json", 600.0)), "MISSING": str(tmp_path / "nope.json"),
             "NOT_A_CHECKPOINT": str(site_file(tmp_path / "x.json", 1.0))}
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"format": "dl2d-speed-model", "version": 1,
                                  "classes": {"my-label": {"seconds_per_epoch": [100.0]}}}))
    subst["ONLY_LABELS"] = str(labels)
    out = tmp_path / "out.msgpack"
    r = invoke(*TINY, *[subst.get(a, a) for a in args], "--out", str(out))
    assert r.exit_code != 0 and message in r.output, r.output
    assert not out.exists()


def test_target_options_are_refused_for_the_dl2_policy(tmp_path):
    r = invoke("train", "--policy", "dl2", "--world", "today", "--lr", "0.1", "--out", str(tmp_path / "o.ckpt"))
    assert r.exit_code == 2 and "--world, --lr only apply to --policy dl2-target" in r.output


def test_trains_from_elastic_with_the_slots_credit_and_reports_it_against_the_bound(tmp_path):
    """--teacher elastic: the features and the warm-up are elastic's, the checkpoint's config says so (and its
    --prior); resuming it needs the same teacher and prior. Without --json the report's table holds the teacher,
    the learned policy and the LP bound of the validation traces (at nominal speed and at the noise's upper end),
    each against the teacher."""
    out = tmp_path / "e.msgpack"
    r = invoke(*TINY, "--sl-iters", "1", "--rl-iters", "1", "--teacher", "elastic", "--credit", "slot",
               "--prior", "8", "--out", str(out))
    assert r.exit_code == 0, r.output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]]
            for line in r.output.splitlines() if line.startswith("│")}
    teacher = float(rows["elastic (teacher)"][0])
    every, nominal = (float(rows[f"lower bound, {k} (LP)"][0]) for k in ("every run", "nominal speed"))
    assert 0 < every <= nominal and every <= teacher
    assert rows["lower bound, every run (LP)"][1] == f"{every / teacher:.3f}"
    assert f"checkpoint written to {out}" in r.output
    ck = load_target(out)
    assert ck.config.teacher == "elastic" and ck.meta["teacher"] == "elastic" and ck.meta["setup"]["credit"] == "slot"
    assert ck.config.prior == 8.0 and ck.meta["teacher_validation_jct_mean"] == pytest.approx(teacher, abs=1e-2)
    assert ck.meta["setup"]["plan_rounds"] == 0 and "learning the planner" not in r.output  # not asked: none
    assert "--teacher elastic" in ck.meta["command"] and "--credit slot" in ck.meta["command"]
    again = CliRunner().invoke(cli, [*TINY, "--sl-iters", "0", "--rl-iters", "1", "--init", str(out),
                                     "--teacher", "optimus", "--out", str(tmp_path / "f.msgpack")])
    assert again.exit_code == 2 and "'teacher': 'elastic'" in again.output and "'teacher': 'optimus'" in again.output
    assert not (tmp_path / "f.msgpack").exists()


def test_in_the_dl2_world_it_learns_from_the_relative_optimus_then_the_planner_by_default(dl2_world):
    """The default teacher is the world's best heuristic: in the DL2 world the relative Optimus. There the planner
    on the measured speeds is learned by default too (two rounds between the warm-up and PPO, on every whole
    count as a level): its rounds are in the curve and the checkpoint, and the plan phase showed its progress.
    Without --val-traces the world says how many validation traces pick the policy: 5 in the DL2 world (20 in
    today's, where on 5 a few long traces decide)."""
    from dl2d.sim.worlds import WORLDS

    assert WORLDS["today"].val_traces == 20 and WORLDS["dl2"].val_traces == 5
    out, output = dl2_world
    assert "optimus-relative (teacher)" in output
    assert "learning the planner: 2 round(s)" in output  # its progress (stderr, which CliRunner mixes in)
    ck = load_target(out)
    assert ck.config.teacher == "optimus-relative" and ck.config.every_count
    assert ck.meta["setup"]["plan_rounds"] == 2 and ck.meta["setup"]["plan_traces"] == 1  # no more than --clusters
    assert ck.meta["validation_seeds"] == [10_000, 10_004]  # the first and last of the world's 5


def test_resuming_a_checkpoint_with_every_count_as_a_level_keeps_its_levels(dl2_world, tmp_path):
    """The DL2 world's policy has every whole count as a level (dl2d.policy.planning.plan_distill.widen, after its
    planner phase): --init from such a checkpoint trains on its levels, not the base ones."""
    wide = load_target(dl2_world[0])
    assert wide.config.every_count and wide.config.num_actions == 17 * 16
    out = tmp_path / "again.msgpack"
    r = invoke(*TINY, "--world", "dl2", "--sl-iters", "0", "--rl-iters", "1", "--plan-rounds", "0", "--init",
               str(dl2_world[0]), "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    again = load_target(out)
    assert again.config == wide.config and again.meta["setup"]["every_count"] is True
