"""`dl2ctl submit`: spec files (TOML, JSON, stdin), flags, validation messages, owner rules."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from dl2d.db.engine import make_engine, session_scope
from dl2d.db.models import Event, Job

TOML_SPEC = """
name = "resnet-a"
job_type = "resnet50"
total_epochs = 30
command = "python train.py --lr 0.1"
max_workers = 8
max_ps = 4
time_limit_min = 120

[worker]
gpus = 1
cpus = 2
mem_gb = 8

[ps]
cpus = 2
mem_gb = 4
"""


def jobs_in(db_url):
    e = make_engine(db_url)
    try:
        with session_scope(e) as s:
            return [(j.id, j.name, j.owner, j.job_type, j.total_epochs, j.state.value, j.spec)
                    for j in s.scalars(select(Job).order_by(Job.id))]
    finally:
        e.dispose()


def test_submit_toml_file_creates_schema_and_pending_job(dl2ctl, db_url, tmp_path):
    f = tmp_path / "job.toml"
    f.write_text(TOML_SPEC)
    r = dl2ctl("submit", str(f))
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "Submitted job 1 (resnet-a, resnet-50, 30 epochs) for alice"
    [(jid, name, owner, jtype, epochs, state, spec)] = jobs_in(db_url)
    assert (jid, name, owner, jtype, epochs, state) == (1, "resnet-a", "alice", "resnet-50", 30.0, "PENDING")
    assert spec["worker"] == {"gpus": 1.0, "cpus": 2.0, "mem_gb": 8.0}
    assert spec["ps"] == {"gpus": 0.0, "cpus": 2.0, "mem_gb": 4.0}
    assert (spec["command"], spec["max_workers"], spec["max_ps"], spec["time_limit_min"]) == \
        ("python train.py --lr 0.1", 8, 4, 120)
    e = make_engine(db_url)
    with session_scope(e) as s:
        assert s.scalar(select(func.count()).select_from(Event).where(Event.kind == "submit")) == 1
    e.dispose()


def test_submit_json_file_flags_override_and_json_output(dl2ctl, db_url, tmp_path, spec):
    f = tmp_path / "job.json"
    f.write_text(json.dumps(spec))
    r = dl2ctl("submit", str(f), "--epochs", "50", "-J", "renamed", "--mem-per-worker", "16G", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["id"] == 1 and out["name"] == "renamed" and out["total_epochs"] == 50.0
    assert out["state"] == "PENDING" and out["owner"] == "alice" and out["workers"] == 0
    [row] = jobs_in(db_url)
    assert row[6]["worker"]["mem_gb"] == 16.0 and row[6]["worker"]["cpus"] == 2.0  # file's cpus kept


def test_submit_by_flags_only_with_sbatch_syntax(dl2ctl, db_url):
    r = dl2ctl("submit", "-J", "vgg", "--type", "VGG16", "--epochs", "12.5", "--wrap", "python vgg.py",
               "--gpus-per-worker", "2", "--cpus-per-worker", "4", "--mem-per-worker", "512M",
               "--cpus-per-ps", "1", "--mem-per-ps", "2048", "--max-workers", "4", "--sync-mode", "async",
               "-t", "1-00:30")
    assert r.exit_code == 0, r.output
    [(_, name, owner, jtype, epochs, _, spec)] = jobs_in(db_url)
    assert (name, owner, jtype, epochs) == ("vgg", "alice", "vgg-16", 12.5)
    assert spec["worker"] == {"gpus": 2.0, "cpus": 4.0, "mem_gb": 0.5}
    assert spec["ps"]["mem_gb"] == 2.0  # 2048 without a suffix is megabytes, as in sbatch
    assert (spec["max_workers"], spec["max_ps"], spec["sync"], spec["time_limit_min"]) == (4, 16, "async", 1470)


def test_submit_from_stdin(dl2ctl, db_url, spec):
    r = dl2ctl("submit", "-", input=json.dumps(spec))
    assert r.exit_code == 0, r.output
    assert "Submitted job 1" in r.output and len(jobs_in(db_url)) == 1


def test_dry_run_writes_nothing(dl2ctl, db_url, spec, tmp_path):
    f = tmp_path / "job.json"
    f.write_text(json.dumps(spec))
    r = dl2ctl("submit", str(f), "--dry-run")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["worker"]["gpus"] == 1.0
    assert not (tmp_path / "dl2d.sqlite").exists()


@pytest.mark.parametrize("change,message", [
    ({"name": "bad name"}, "name must be 1-64 characters"),
    ({"job_type": "alexnet"}, "unknown job type 'alexnet'; known types: resnet-50, vgg-16"),
    ({"total_epochs": 0}, "total_epochs must be > 0"),
    ({"total_epochs": "ten"}, "total_epochs must be a number, got 'ten'"),
    ({"command": "  "}, "missing script"),
    ({"worker": {"gpus": -1, "cpus": 2, "mem_gb": 8}}, "worker.gpus must be >= 0"),
    ({"worker": {"gpus": 1, "cpus": 2, "mem_gb": 8, "disk": 3}}, "worker: unknown keys ['disk']"),
    ({"ps": {"gpus": 1, "cpus": 2, "mem_gb": 4}}, "ps.gpus must be >= 0 and <= 0"),
    ({"max_workers": 0}, "max_workers must be >= 1"),
    ({"max_ps": 2.5}, "max_ps must be an integer"),
    ({"sync": "lazy"}, "sync must be one of ('sync', 'async')"),
    ({"time_limit_min": -5}, "time_limit_min must be > 0"),
    ({"priority": 3}, "unknown keys ['priority']"),
    ({"script": "python x.py"}, "give either command or script, not both"),
    ({"worker": None}, "missing worker demand: give [worker] cpus and mem_gb in the spec, "
                       "or --cpus-per-worker and --mem-per-worker"),
    ({"ps": {"cpus": 1}}, "missing ps.mem_gb (give [ps] mem_gb, or --mem-per-ps)"),
])
def test_invalid_spec_is_rejected_with_its_message(dl2ctl, db_url, tmp_path, spec, change, message):
    spec.update(change)
    spec = {k: v for k, v in spec.items() if v is not None}
    f = tmp_path / "job.json"
    f.write_text(json.dumps(spec))
    r = dl2ctl("submit", str(f))
    assert r.exit_code == 1, r.output
    assert "invalid job submission (1 problem)" in r.output
    assert message in r.output
    assert not (tmp_path / "dl2d.sqlite").exists()  # rejected before the database is opened


def test_every_problem_is_listed(dl2ctl, tmp_path):
    r = dl2ctl("submit", "-J", "bad name", "--type", "foo", "--epochs", "-3", "--mem-per-worker", "4X",
               "-t", "soon", "--cpus-per-ps", "1")
    assert r.exit_code == 1
    lines = [ln.strip() for ln in r.output.splitlines() if ln.strip().startswith("- ")]
    assert r.output.startswith("Error: invalid job submission (8 problems):")
    assert lines == [
        "- --mem-per-worker: memory must be a number with an optional K, M, G or T suffix (megabytes "
        "without one, as in sbatch), got '4X'",
        "- --time: time must be MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, got 'soon'",
        "- name must be 1-64 characters of letters, digits, '.', '_', '-' starting with a letter or digit, "
        "got 'bad name'",
        "- unknown job type 'foo'; known types: resnet-50, vgg-16, resnext-110, inception-bn, seq2seq, "
        "cnn-text-classification, dssm, wlm",
        "- total_epochs must be > 0 and <= 1e+06, got -3.0",
        "- missing script: give the training command as `command` (or `script`) or --wrap",
        "- missing worker demand: give [worker] cpus and mem_gb in the spec, or --cpus-per-worker and "
        "--mem-per-worker",
        "- missing ps.mem_gb (give [ps] mem_gb, or --mem-per-ps)",
    ]
    assert not (tmp_path / "dl2d.sqlite").exists()


def test_unparsable_files(dl2ctl, tmp_path):
    bad_toml = tmp_path / "job.toml"
    bad_toml.write_text("name = \n")
    r = dl2ctl("submit", str(bad_toml))
    assert r.exit_code == 1 and f"{bad_toml}: invalid TOML" in r.output
    bad_json = tmp_path / "job.json"
    bad_json.write_text('{"name": "a",\n "x": }')
    r = dl2ctl("submit", str(bad_json))
    assert r.exit_code == 1 and f"{bad_json}: invalid JSON at line 2 column 7" in r.output
    arr = tmp_path / "list.json"
    arr.write_text("[1, 2]")
    r = dl2ctl("submit", str(arr))
    assert r.exit_code == 1 and "a job spec must be a JSON object, got list" in r.output
    r = dl2ctl("submit", str(tmp_path / "missing.toml"))
    assert r.exit_code == 2 and "No such file or directory" in r.output


def test_no_spec_and_no_flags_is_a_usage_error(dl2ctl):
    r = dl2ctl("submit")
    assert r.exit_code == 2
    assert "give a job spec file or the job's flags" in r.output


def test_owner_other_than_caller_needs_admin(dl2ctl, db_url, as_user, spec, tmp_path):
    f = tmp_path / "job.json"
    f.write_text(json.dumps({**spec, "owner": "bob"}))
    r = dl2ctl("submit", str(f))
    assert r.exit_code == 1
    assert "owner 'bob': only root or a dl2d admin may submit for another user (you are 'alice')" in r.output
    as_user("carol", admin=True)
    r = dl2ctl("submit", str(f))
    assert r.exit_code == 0, r.output
    r = dl2ctl("submit", str(f), "--owner", "dave")
    assert r.exit_code == 0, r.output
    assert [row[2] for row in jobs_in(db_url)] == ["bob", "dave"]


def test_missing_database_directory_is_a_clear_error(dl2ctl, tmp_path, spec, as_user):
    from click.testing import CliRunner

    from dl2d.cli.main import cli

    f = tmp_path / "job.json"
    f.write_text(json.dumps(spec))
    url = f"sqlite:///{tmp_path / 'nope' / 'dl2d.sqlite'}"
    r = CliRunner().invoke(cli, ["submit", "--db", url, str(f)])
    assert r.exit_code == 1
    assert f"no directory {tmp_path / 'nope'} for the database" in r.output
