"""`dl2ctl sim` through click's CliRunner: the table, --json, --compare, trace files and the error paths."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from testkit.sim import make_trace

from dl2d.cli.main import cli
from dl2d.sim import trace as T

SMALL = ["sim", "--world", "dl2", "--cluster", "tiny", "--jobs", "4", "--max-arrivals", "2"]
KEYS = {"policy", "jobs", "avg_jct_slots", "avg_jct_hours", "makespan_slots", "makespan_hours", "gpu_util",
        "cpu_util", "total_reward", "per_type_jct_hours", "gpu_util_per_slot", "wall_s"}


def invoke(*args):
    # a wide terminal, so rich does not wrap the table's headers
    return CliRunner(env={"COLUMNS": "250"}).invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def short_trace(tmp_path_factory):
    """Three short jobs (a few slots each) as a CSV trace file."""
    path = tmp_path_factory.mktemp("trace") / "jobs.csv"
    T.save(make_trace([(0, "resnet-50", 3), (1, "dssm", 20), (1, "wlm", 15)]), path)
    return path


def test_default_policy_prints_a_table(short_trace):
    r = invoke("sim", "--world", "dl2", "--cluster", "tiny", "--trace", str(short_trace))
    assert r.exit_code == 0, r.output
    header = next(line for line in r.output.splitlines() if "avg JCT h" in line).split()
    assert header[:2] == ["policy", "avg"] and "makespan" in header
    row = next(line for line in r.output.splitlines() if line.strip().startswith("drf ") and "━" not in line)
    assert len(row.split()) >= 8  # policy, JCT h, JCT slots, makespan, GPU, CPU, sparkline, ms, wall
    assert f"3 jobs (trace {short_trace}) on 4 servers" in r.output


def test_json_is_valid_and_carries_the_summary_and_settings():
    r = invoke(*SMALL, "--policy", "srtf", "--seed", "3", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)  # pure JSON on stdout: no progress bar, no table
    assert out["trace"]["seed"] == 3 and out["cluster"]["servers"] == 4 and out["sim"]["speed_model"] == "measured"
    (res,) = out["results"]
    assert KEYS <= set(res) and res["policy"] == "srtf" and res["jobs"] == 4
    assert res["avg_jct_hours"] == pytest.approx(res["avg_jct_slots"] / 3, abs=1e-3)
    assert len(res["gpu_util_per_slot"]) >= res["makespan_slots"] - 1
    assert res["total_reward"] == pytest.approx(4.0, abs=1e-3)  # exact estimates: one per job


def test_same_seed_same_json_numbers():
    a, b = (json.loads(invoke(*SMALL, "--seed", "5", "--json").stdout)["results"][0] for _ in range(2))
    for key in ("avg_jct_slots", "makespan_slots", "gpu_util", "gpu_util_per_slot", "per_type_jct_hours"):
        assert a[key] == b[key]


def test_compare_runs_every_policy_on_the_same_trace(short_trace):
    r = invoke("sim", "--world", "dl2", "--cluster", "tiny", "--trace", str(short_trace), "--compare", "all", "--json")
    assert r.exit_code == 0, r.output
    results = json.loads(r.stdout)["results"]
    from dl2d.policy import registry

    assert [x["policy"] for x in results] == list(registry.names())  # 'all': every registered policy, a row each
    ran = [x for x in results if x["finished"]]
    assert all(x["jobs"] == 3 for x in ran) and {"drf", "elastic", "dl2-target", "oracle"} <= {x["policy"] for x in ran}
    # the learned policies that ship no checkpoint get a row saying what they need; the others still ran
    unbuilt = {x["policy"]: x["error"] for x in results if not x["finished"]}
    assert set(unbuilt) == {"dl2", "chic", "chic-pair"}, unbuilt
    assert all("needs a trained" in why for why in unbuilt.values())
    table = invoke("sim", "--world", "dl2", "--cluster", "tiny", "--trace", str(short_trace), "--compare", "fifo,optimus", "--per-type")
    assert table.exit_code == 0, table.output
    assert "fifo" in table.output and "optimus" in table.output and "Average JCT per job type" in table.output
    assert "dssm" in table.output


def test_tetris_threshold_is_passed_on(short_trace):
    r = invoke("sim", "--world", "dl2", "--cluster", "tiny", "--trace", str(short_trace), "--policy", "tetris",
               "--tetris-threshold", "2", "--json")
    assert json.loads(r.stdout)["results"][0]["policy"] == "tetris(k=2)"


def test_trace_file_gives_the_same_result_as_the_generated_trace(tmp_path):
    saved = tmp_path / "t.json"
    gen = invoke(*SMALL, "--seed", "2", "--save-trace", str(saved), "--json")
    assert gen.exit_code == 0, gen.output
    assert np.array_equal(T.load(saved).true_epochs, T.generate(
        T.TraceConfig(num_jobs=4, max_arrivals_per_slot=2), seed=2).true_epochs)
    again = invoke("sim", "--world", "dl2", "--cluster", "tiny", "--seed", "2", "--trace", str(saved), "--json")
    assert again.exit_code == 0, again.output
    a, b = json.loads(gen.stdout)["results"][0], json.loads(again.stdout)["results"][0]
    assert a["avg_jct_slots"] == b["avg_jct_slots"] and a["makespan_slots"] == b["makespan_slots"]
    assert json.loads(again.stdout)["trace"] == {"file": str(saved)}


@pytest.mark.parametrize("args, message", [
    (["--policy", "drf", "--compare", "fifo"], "either --policy or --compare"),
    (["--compare", "drf,sjf"], "unknown policy 'sjf'"),
    (["--compare", "drf,drf"], "listed twice"),
    (["--compare", ","], "comma-separated list"),
    (["--policy", "sjf"], "'sjf' is not one of"),
    (["--policy", "dl2"], "--policy dl2 needs --checkpoint"),
    (["--policy", "drf", "--checkpoint", "x.ckpt"], "--checkpoint only applies to the learned policies"),
    (["--policy", "chic"], "--policy chic needs --checkpoint"),
    (["--compare", "dl2,chic", "--checkpoint", "x.ckpt"], "give --checkpoint NAME=PATH for each"),
    (["--compare", "drf,chic", "--checkpoint", "dl2=x.ckpt"], "dl2 is not among the policies"),
    (["--jobs", "0"], "0 is not in the range 1<=x<=50000"),
    (["--estimate-error", "1.5"], "--estimate-error"),
    (["--cluster", "huge"], "'huge' is not one of"),
    (["--slot-noise", "1"], "--slot-noise"),
])
def test_bad_options_fail_with_a_clear_message(args, message):
    r = invoke("sim", "--world", "dl2", "--cluster", "tiny", "--jobs", "2", *args) if "--cluster" not in args and "--jobs" not in args \
        else invoke("sim", *args)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, message", [
    (["--max-arrivals", "3"], "--max-arrivals only shape the dl2 world's traces (--world dl2)"),
    (["--world", "dl2", "--load", "2"], "--load only shape the today world's traces (--world today)"),
    (["--workload", "pollux:9"], "give philly, pollux:K or pollux-realistic:K"),
    (["--workload", "pollux:2", "--jobs", "5"], "--jobs shape a generated Philly workload, not the packaged pollux:2"),
    (["--load", "0"], "--load"),
    (["--workload", "pollux:2", "--style", "tuned"], "--style shape a generated Philly workload"),
    (["--world", "dl2", "--style", "tuned"], "--style only shape the today world's traces"),
    (["--world", "mars"], "'mars' is not one of"),
])
def test_options_of_the_other_world_fail_with_a_clear_message(args, message):
    r = invoke("sim", *args)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


def test_trace_file_errors_are_reported_not_raised(tmp_path, short_trace):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "dl2d-trace", "version": 1, "jobs": [{"type": "wlm"}]}')
    r = invoke("sim", "--trace", str(bad))
    assert r.exit_code == 2 and "job 1: missing field 'arrival_slot'" in r.output
    r = invoke("sim", "--trace", str(tmp_path / "missing.csv"))
    assert r.exit_code == 2 and "cannot read trace" in r.output
    r = invoke("sim", "--trace", str(short_trace), "--jobs", "9")
    assert r.exit_code == 2 and "--jobs only shape a generated trace" in r.output
    r = invoke(*SMALL, "--save-trace", str(tmp_path / "t.yaml"))
    assert r.exit_code == 2 and "must end in .json or .csv" in r.output


def test_whole_nodes_only_for_the_policies_that_give_them_and_before_anything_is_written(tmp_path):
    saved = tmp_path / "t.json"
    r = invoke(*SMALL, "--compare", "elastic,drf", "--whole-nodes", "--save-trace", str(saved))
    assert r.exit_code == 2 and "--whole-nodes: drf cannot give whole nodes (only elastic, dl2-target" in r.output
    assert not saved.exists()
    r = invoke("sim", "--jobs", "12", "--seed", "1", "--policy", "elastic", "--whole-nodes", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["sim"]["whole_nodes"] is True


def test_a_learned_policy_that_ships_one_needs_no_checkpoint():
    r = invoke("sim", "--jobs", "12", "--seed", "1", "--compare", "elastic,elastic-chooser,dl2-target", "--json")
    assert r.exit_code == 0, r.output
    assert [x["policy"] for x in json.loads(r.stdout)["results"]] == ["elastic", "elastic-chooser", "dl2-target"]


def test_dl2_policy_with_a_bad_checkpoint_is_a_clear_error(tmp_path):
    ckpt = tmp_path / "p.ckpt"
    ckpt.write_text("not a checkpoint")
    r = invoke(*SMALL, "--policy", "dl2", "--checkpoint", str(ckpt))
    assert r.exit_code == 1 and "cannot load dl2 checkpoint" in r.output and "Traceback" not in r.output


def test_chic_checkpoints_run_side_by_side_by_name(tmp_path):
    from dl2d.policy.seeds import chic as CH
    paths = {}
    for name, pair in (("chic", False), ("chic-pair", True)):
        cfg = CH.ChicConfig(pair=pair)
        paths[name] = tmp_path / f"{name}.npz"
        CH.save_checkpoint(paths[name], cfg, CH.init_params(cfg, 0))
    r = invoke(*SMALL, "--compare", "drf,chic,chic-pair", "--checkpoint", f"chic={paths['chic']}",
               "--checkpoint", f"chic-pair={paths['chic-pair']}", "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)["results"]
    assert [row["policy"] for row in res] == ["drf", "chic", "chic-pair"]
    assert all(row["jobs"] == 4 and row["avg_jct_slots"] > 0 for row in res)


# ---------------------------------------------------------------- today's world (the default)

def test_default_world_is_today_with_its_cluster_slots_and_a_bound():
    r = invoke("sim", "--jobs", "8", "--compare", "slurm,drf", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["world"] == "today" and out["trace"]["workload"] == "philly" and out["trace"]["jobs"] == 8
    assert out["cluster"] == {"servers": 16, "gpus": 4.0, "cpus": 48.0, "mem_gb": 192.0}
    assert out["sim"]["slot_seconds"] == 60.0 and out["sim"]["restart_seconds"] == 30.0
    assert out["sim"]["max_workers"] == 64
    bound = out["lower_bound"]["avg_jct_slots"]
    for res in out["results"]:
        assert res["jobs"] == 8 and "p99_jct_hours" in res
        assert res["avg_jct_slots"] >= bound - 1e-9, res["policy"]
        assert set(res["per_type_jct_hours"]) <= {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}


def test_a_packaged_pollux_workload_runs_and_slurm_never_resizes():
    r = invoke("sim", "--workload", "pollux:2", "--policy", "slurm", "--restart-seconds", "0", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    (res,) = out["results"]
    assert res["jobs"] == 160 and out["sim"]["restart_seconds"] == 0.0
    assert res["resizes"] == 160  # each job started once, never changed
    assert 0 < res["gpu_util"] <= 1


def test_generated_jobs_as_tuned_ask_for_more_gpus_than_as_submitted():
    """--style tuned: the same Philly jobs, each with a configuration Pollux tuned; Slurm as it is runs every job at
    the GPUs it asks for, so the tuned jobs keep more of the cluster busy."""
    util = {}
    for style in ("realistic", "tuned"):
        r = invoke("sim", "--jobs", "30", "--style", style, "--policy", "slurm", "--json")
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert out["trace"]["style"] == style
        util[style] = out["results"][0]["gpu_util"]
    assert util["tuned"] > 1.5 * util["realistic"]


def test_the_dl2_world_is_one_flag_away():
    r = invoke("sim", "--world", "dl2", "--cluster", "tiny", "--jobs", "3", "--json")
    out = json.loads(r.stdout)
    assert out["world"] == "dl2" and out["sim"]["slot_seconds"] == 1200.0 and out["cluster"]["gpus"] == 2.0
    assert set(out["results"][0]["per_type_jct_hours"]) <= set(T.TYPE_NAMES)


def test_the_lp_bound_is_reported_on_request_and_below_every_policy():
    r = invoke("sim", "--jobs", "8", "--compare", "slurm,elastic", "--lp-bound", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    lp = out["lp_bound"]["avg_jct_slots"]
    assert lp >= out["lower_bound"]["avg_jct_slots"] - 1e-9
    assert out["lp_bound"]["avg_jct_hours"] == pytest.approx(lp / 60, abs=1e-3)
    for res in out["results"]:
        assert res["avg_jct_slots"] >= lp - 1e-9, res["policy"]
    plain = json.loads(invoke("sim", "--jobs", "8", "--policy", "slurm", "--json").stdout)
    assert "lp_bound" not in plain


def test_a_policy_that_does_not_finish_is_a_row_and_the_others_print(short_trace, monkeypatch):
    """A comparison never dies for one row: a registered policy that never gives a job a GPU hits the engine's
    give-up (its row says so, with how far it got), and the policies around it print their results."""
    from dataclasses import replace

    import numpy as np

    from dl2d.core.contract import Allocation
    from dl2d.policy import registry
    from dl2d.sim import engine

    run = engine.run
    monkeypatch.setattr(engine, "run", lambda trace, sched, cfg, **kw: run(trace, sched, replace(cfg, max_slots=200),
                                                                           **kw))
    idle = registry.StatelessPolicy(lambda v: Allocation(np.zeros(len(v), int), np.zeros(len(v), int)), "idle")
    monkeypatch.setitem(registry._ENTRIES, "idle", registry.PolicyEntry("idle", "gives nothing", lambda o: idle))
    monkeypatch.setattr("dl2d.cli.sim.POLICIES", (*registry.names(), "idle"))
    args = ("sim", "--world", "dl2", "--cluster", "tiny", "--trace", str(short_trace), "--compare", "drf,idle,fifo")
    r = invoke(*args, "--json")
    assert r.exit_code == 0, r.output
    rows = {x["policy"]: x for x in json.loads(r.stdout)["results"]}
    assert list(rows) == ["drf", "idle", "fifo"]
    assert rows["drf"]["jobs"] == rows["fifo"]["jobs"] == 3
    assert rows["idle"]["finished"] is False
    assert "did not finish within 200 slots" in rows["idle"]["error"] and "0 of 3 jobs done" in rows["idle"]["error"]
    table = invoke(*args)
    assert table.exit_code == 0, table.output
    assert "idle: simulation did not finish within 200 slots" in " ".join(table.output.split())
    assert "drf" in table.output and "fifo" in table.output
