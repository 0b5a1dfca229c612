"""`dl2ctl train` on a tiny configuration, and its error paths."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dl2d.cli.main import cli
from dl2d.policy.checkpoint import load

TINY = ["train", "--policy", "dl2", "--cluster", "tiny", "--jobs", "6", "--max-jobs", "8", "--hidden", "32"]


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "p.ckpt"
    r = invoke(*TINY, "--sl-epochs", "2", "--rl-steps", "5", "--val-every", "2", "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    return out, json.loads(r.output)


def test_train_sl_then_rl_writes_checkpoint(trained):
    out, res = trained
    assert set(res["val_jct_slots"]) == {"drf", "sl", "sl+rl"}
    assert all(v > 0 for v in res["val_jct_slots"].values())
    assert len(res["sl"]["losses"]) == 2 and res["sl"]["samples"] > 0
    assert res["rl"]["slots"] == 5 and [s for s, _ in res["rl"]["val_curve"]] == [2, 4]
    ck = load(out)
    assert ck.config.max_jobs == 8 and ck.config.hidden == 32
    assert ck.opt_state is not None
    assert ck.meta["teacher"] == "drf" and ck.meta["sl_epochs"] == 2 and ck.meta["val_seed"] == 10000


def test_resume_from_checkpoint_with_table(trained, tmp_path):
    init, _ = trained
    out = tmp_path / "q.ckpt"
    r = invoke(*TINY, "--init", str(init), "--rl-steps", "3", "--out", str(out), "--teacher", "fifo",
               "--n-step", "3", "--entropy-weight", "0.01", "--updates-per-slot", "2")
    assert r.exit_code == 0, r.output
    assert "avg JCT" in r.output and "fifo (teacher)" in r.output and "init" in r.output and "rl" in r.output
    ck = load(out)
    assert ck.meta["sl_epochs"] == 2  # carried over from the initial checkpoint
    assert (ck.config.n_step, ck.config.entropy_weight, ck.config.updates_per_slot) == (3, 0.01, 2)
    assert ck.config.max_jobs == 8 and ck.config.hidden == 32


@pytest.mark.parametrize("args,message", [
    (["--val-seed", "1"], "--val-seed"),
    (["--seed", "5", "--val-seed", "7", "--rl-steps", "3"], "training trace seed"),
    (["--teacher", "random"], "'random' is not one of"),
    (["--sl-epochs", "-1"], "--sl-epochs"),
    (["--sl-epochs", "0"], "nothing to train"),
    (["--jobs", "0"], "--jobs"),
    (["--n-step", "0"], "--n-step"),
    (["--servers", "0"], "--servers"),
    (["--cluster", "huge"], "'huge' is not one of"),
    (["--out", "no/such/dir/p.ckpt"], "does not exist"),
])
def test_bad_input(args, message):
    r = CliRunner().invoke(cli, TINY + args)
    assert r.exit_code == 2, r.output
    assert message in r.output


def test_bad_init_checkpoint(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    r = CliRunner().invoke(cli, TINY + ["--init", str(bad)])
    assert r.exit_code == 1 and "not a dl2d policy checkpoint" in r.output
    r = CliRunner().invoke(cli, TINY + ["--init", str(tmp_path / "missing.ckpt")])
    assert r.exit_code == 1 and "cannot read" in r.output


def test_init_config_conflict(trained):
    init, _ = trained
    r = CliRunner().invoke(cli, ["train", "--policy", "dl2", "--cluster", "tiny", "--init", str(init), "--max-jobs", "16",
                                 "--rl-steps", "1"])
    assert r.exit_code == 2 and "differs from the checkpoint" in r.output


def test_train_is_registered():
    from dl2d.cli.main import COMMANDS

    assert COMMANDS["train"] == "dl2d.cli.train:train"
    r = CliRunner().invoke(cli, ["train", "--help"])
    assert r.exit_code == 0 and "--teacher" in r.output and "--val-seed" in r.output
