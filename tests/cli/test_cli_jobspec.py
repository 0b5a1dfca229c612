"""Pure helpers of the job commands: sbatch value parsing, spec merge, DB URL resolution, formatting."""
from __future__ import annotations

import json

from datetime import datetime, timezone

import click
import pytest

from dl2d.cli.dbconn import ConfigError, admin_group, load_config, resolve_db_url
from dl2d.cli.jobs import format_age, parse_states, resize_records
from dl2d.cli.jobspec import (
    merge_submission,
    normalize_job_type,
    parse_exports,
    parse_mem,
    parse_spec_text,
    parse_time,
)
from dl2d.db.models import JobState


@pytest.mark.parametrize("value,gb", [("8G", 8.0), ("8g", 8.0), ("512M", 0.5), ("2048", 2.0), ("1T", 1024.0),
                                      ("1.5GB", 1.5), ("1048576K", 1.0)])
def test_parse_mem(value, gb):
    assert parse_mem(value) == pytest.approx(gb)


@pytest.mark.parametrize("value", ["", "G", "-1G", "8X", "eight"])
def test_parse_mem_rejects(value):
    with pytest.raises(ValueError, match="memory must be a number"):
        parse_mem(value)


@pytest.mark.parametrize("value,minutes", [("90", 90), ("90:30", 91), ("2:00:00", 120), ("1-0", 1440),
                                           ("1-02:30", 1590), ("0-00:00:01", 1), ("1-00:00:00", 1440)])
def test_parse_time(value, minutes):
    assert parse_time(value) == minutes


@pytest.mark.parametrize("value", ["", "1h", "1-", "a:b", "1:2:3:4"])
def test_parse_time_rejects(value):
    with pytest.raises(ValueError, match="time must be MM"):
        parse_time(value)


def test_normalize_job_type():
    assert normalize_job_type("ResNet50") == "resnet-50"
    assert normalize_job_type("CTC") == "cnn-text-classification"
    assert normalize_job_type(" wlm ") == "wlm"
    assert normalize_job_type("alexnet") == "alexnet"  # left for the validator to report
    assert normalize_job_type(3) == 3


def test_merge_flags_win_and_owner_defaults():
    spec = {"name": "a", "script": "old.sh", "worker": {"cpus": 2, "mem_gb": 8}, "job_type": "vgg16"}
    out, errors = merge_submission(spec, {"command": "new.sh", "gpus_per_worker": 1, "mem_per_worker": "4G",
                                          "epochs": None}, "alice")
    assert errors == []
    assert out == {"name": "a", "command": "new.sh", "worker": {"cpus": 2, "mem_gb": 4.0, "gpus": 1},
                   "job_type": "vgg-16", "owner": "alice"}
    assert spec["worker"] == {"cpus": 2, "mem_gb": 8}  # the input is not modified
    out, _ = merge_submission({"owner": "bob"}, {}, "alice")
    assert out["owner"] == "bob"
    _, errors = merge_submission({}, {"time": "soon", "mem_per_ps": "x"}, "alice")
    assert [e.split(":")[0] for e in errors] == ["--time", "--mem-per-ps"]


def test_exports_merge_into_the_specs_environment():
    out, errors = merge_submission({"env": {"A": "spec", "B": "b"}}, {"export": ("A=flag", "C=x=y,z")}, "alice")
    assert errors == [] and out["env"] == {"A": "flag", "B": "b", "C": "x=y,z"}
    out, _ = merge_submission({}, {"export": ("A=1",), "account": "p", "qos": "q", "partition": "gpu"}, "alice")
    assert (out["env"], out["account"], out["qos"], out["partition"]) == ({"A": "1"}, "p", "q", "gpu")
    assert parse_exports(["EMPTY="]) == {"EMPTY": ""}
    for bad in ("NOVALUE", "=x"):
        with pytest.raises(ValueError, match=f"NAME=VALUE expected, got '{bad}'"):
            parse_exports([bad])
    _, errors = merge_submission({"env": {"A": "1"}}, {"export": ("oops",)}, "alice")
    assert errors[0].startswith("--export: NAME=VALUE expected")


def test_parse_spec_text_sniffs_json():
    assert parse_spec_text('  {"a": 1}') == {"a": 1}
    assert parse_spec_text("a = 1\n[worker]\ncpus = 2\n") == {"a": 1, "worker": {"cpus": 2}}


def test_resolve_db_url_order(tmp_path):
    cfg = {"db_url": "sqlite:////cfg.sqlite"}
    assert resolve_db_url("sqlite:////flag.sqlite", {"DL2D_DB_URL": "sqlite:////env.sqlite"}, cfg) == \
        "sqlite:////flag.sqlite"
    assert resolve_db_url(None, {"DL2D_DB_URL": "sqlite:////env.sqlite"}, cfg) == "sqlite:////env.sqlite"
    assert resolve_db_url(None, {}, cfg) == "sqlite:////cfg.sqlite"
    # one schema, the daemon's: a table it does not know is refused by dl2ctl too (it was read, and the daemon
    # refused it: a submission could land where no daemon reads)
    with pytest.raises(ConfigError, match="unknown key 'db'"):
        resolve_db_url(None, {}, {"db": {"url": "postgresql+psycopg://u@h/d"}})
    with pytest.raises(ConfigError, match="did you mean DL2D_SLOT_SECONDS"):
        resolve_db_url(None, {"DL2D_SLOT_SECOND": "5"}, {})
    assert resolve_db_url(None, {}, {"state_dir": str(tmp_path)}) == f"sqlite:///{tmp_path}/dl2d.sqlite"
    assert resolve_db_url(None, {"DL2D_STATE_DIR": str(tmp_path / "s")}, {"state_dir": "/x"}) == \
        f"sqlite:///{tmp_path}/s/dl2d.sqlite"
    assert resolve_db_url(None, {}, {}) == "sqlite:////var/lib/dl2d/dl2d.sqlite"
    with pytest.raises(ConfigError, match=r"db_url \(from config file\): must be a string, got int 3"):
        resolve_db_url(None, {}, {"db_url": 3})


def test_load_config(tmp_path):
    assert load_config(tmp_path / "missing.toml") == {}
    good = tmp_path / "dl2d.toml"
    good.write_text('db_url = "sqlite:////x.sqlite"\nadmin_group = "hpc-admins"\n')
    cfg = load_config(good)
    assert cfg["db_url"] == "sqlite:////x.sqlite" and admin_group(cfg) == "hpc-admins"
    assert admin_group({}) == "dl2d-admin"
    bad = tmp_path / "bad.toml"
    bad.write_text("db_url = \n")
    with pytest.raises(ConfigError, match=f"config file: {bad} is not valid TOML"):
        load_config(bad)


def test_config_file_is_used_by_the_commands(tmp_path, monkeypatch, as_user):
    from click.testing import CliRunner

    from dl2d.cli.main import cli

    cfg = tmp_path / "dl2d.toml"
    cfg.write_text(f'db_url = "sqlite:///{tmp_path}/from-config.sqlite"\n')
    monkeypatch.setenv("DL2D_CONFIG", str(cfg))
    for command in (["queue"], ["report", "--only", "jct_daily"]):  # report used to ignore DL2D_CONFIG
        (tmp_path / "from-config.sqlite").unlink(missing_ok=True)
        if command[0] == "report":
            CliRunner().invoke(cli, ["queue"])  # report reads an existing database only
        r = CliRunner().invoke(cli, command)
        assert r.exit_code == 0, r.output
        assert (tmp_path / "from-config.sqlite").exists()
    r = CliRunner().invoke(cli, ["daemon", "status", "--json"])  # the config's database, not the default one
    assert "error" not in json.loads(r.output)["database"], r.output
    monkeypatch.setenv("DL2D_DB_URL", f"sqlite:///{tmp_path}/from-env.sqlite")
    assert CliRunner().invoke(cli, ["queue"]).exit_code == 0
    assert (tmp_path / "from-env.sqlite").exists()
    # the daemon's schema: a table the daemon would refuse is refused here too, naming the key
    cfg.write_text(f'[db]\nurl = "sqlite:///{tmp_path}/x.sqlite"\n')
    r = CliRunner().invoke(cli, ["queue"])
    assert r.exit_code == 1 and "unknown key 'db'" in r.output


def test_format_age():
    assert [format_age(s) for s in (-1, 0, 59, 60, 3599, 3600, 3660 + 5, 86399, 86400, 2 * 86400 + 4 * 3600)] == \
        ["0s", "0s", "59s", "1m", "59m", "1h00m", "1h01m", "23h59m", "1d00h", "2d04h"]


def test_parse_states():
    assert parse_states(["running,Pending", "RUNNING"]) == [JobState.RUNNING, JobState.PENDING]
    assert parse_states(["active"]) == [JobState.PENDING, JobState.RUNNING]
    assert parse_states([]) == []
    with pytest.raises(click.BadParameter, match="unknown state 'done'"):
        parse_states(["done"])


def test_resize_records_keep_changes_in_slot_order():
    t = datetime(2025, 1, 1, tzinfo=timezone.utc)
    rows = [(3, t, 4, 2, 4, 2), (1, t, 0, 0, 2, 1), (2, t, 2, 1, 4, 2), (4, t, 4, 2, 3, 2)]
    assert [(r["slot"], r["workers_from"], r["workers_to"], r["ps_from"], r["ps_to"]) for r in
            resize_records(rows)] == [(1, 0, 2, 0, 1), (2, 2, 4, 1, 2), (4, 4, 3, 2, 2)]
