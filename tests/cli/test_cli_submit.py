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
        "cnn-text-classification, dssm, wlm (a PS job's model is one of DL2's types; --arch allreduce takes any "
        "model)",  # a job asking for a PS CPU is a PS job
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


def test_submit_an_all_reduce_job_of_a_measured_model_by_flags(dl2ctl, db_url):
    r = dl2ctl("submit", "-J", "bert-a", "--arch", "allreduce", "--type", "BERT", "--batch-size", "96", "--workers",
               "8", "--epochs", "2", "--wrap", "torchrun train.py", "--cpus-per-worker", "8", "--mem-per-worker", "40G")
    assert r.exit_code == 0, r.output
    [(_, name, _, jtype, epochs, state, spec)] = jobs_in(db_url)
    assert (name, jtype, epochs, state) == ("bert-a", "bert", 2.0, "PENDING")
    assert (spec["kind"], spec["batch_size"], spec["workers"], spec["max_workers"], spec["max_ps"]) == \
        ("allreduce", 96.0, 8, 64, 0)
    assert spec["worker"] == {"gpus": 1.0, "cpus": 8.0, "mem_gb": 40.0}  # one GPU per worker by default
    assert spec["ps"] == {"gpus": 0.0, "cpus": 0.0, "mem_gb": 0.0} and "epoch_seconds" not in spec
    assert "launch" not in spec  # the kind's default: dl2d starts one process per worker (docs/jobs.md)


def test_submit_an_all_reduce_job_that_launches_its_own_processes(dl2ctl, db_url):
    r = dl2ctl("submit", "-J", "tr", "--arch", "allreduce", "--type", "x", "--epochs", "1", "--launch", "once",
               "--wrap", "srun torchrun train.py", "--cpus-per-worker", "1", "--mem-per-worker", "1G")
    assert r.exit_code == 0, r.output
    [(*_, spec)] = jobs_in(db_url)
    assert spec["launch"] == "once"


def test_submit_a_range_of_workers_as_slurms_min_max(dl2ctl, db_url):
    """--workers 2-8, as Slurm's --nodes=2-8: asked for 8 (the most it may get), never run with fewer than 2."""
    r = dl2ctl("submit", "-J", "rng", "--arch", "allreduce", "--type", "cifar10", "--batch-size", "512", "--workers",
               "2-8", "--epochs", "1", "--wrap", "run", "--cpus-per-worker", "1", "--mem-per-worker", "1G")
    assert r.exit_code == 0, r.output
    [(*_, spec)] = jobs_in(db_url)
    assert (spec["workers"], spec["min_workers"], spec["max_workers"]) == (8, 2, 8)


def test_submit_a_model_dl2d_has_never_seen(dl2ctl, db_url, tmp_path):
    """Any model name is an all-reduce job (no --arch needed); its speed hint is kept for the scheduler's prior."""
    f = tmp_path / "llm.toml"
    f.write_text('name = "llm"\njob_type = "My-LLM-7b"\ntotal_epochs = 3\ncommand = "torchrun llm.py"\n'
                 'workers = 16\nepoch_seconds = 900\n[worker]\ngpus = 2\ncpus = 16\nmem_gb = 80\n')
    r = dl2ctl("submit", str(f))
    assert r.exit_code == 0, r.output
    [(_, _, _, jtype, _, _, spec)] = jobs_in(db_url)
    assert jtype == "My-LLM-7b" and spec["kind"] == "allreduce" and "batch_size" not in spec
    assert (spec["workers"], spec["epoch_seconds"], spec["worker"]["gpus"]) == (16, 900.0, 2.0)


@pytest.mark.parametrize("flags, message", [
    (("--type", "bert"), "batch_size must be a number, got None (the total batch of the bert job"),
    (("--type", "bert", "--batch-size", "0"), "batch_size must be > 0"),
    (("--type", "bert", "--batch-size", "96", "--epoch-seconds", "60"), "epoch_seconds: bert's speed is measured"),
    (("--type", "bert", "--batch-size", "96", "--workers", "80"), "workers (80) must be <= max_workers (64)"),
    (("--type", "x", "--workers", "8-2"), "--workers: workers MIN-MAX needs 1 <= MIN <= MAX, got '8-2'"),
    (("--type", "x", "--workers", "two"), "--workers: workers must be N or MIN-MAX, got 'two'"),
    (("--type", "x", "--workers", "2-8", "--max-workers", "4"), "workers (8) must be <= max_workers (4)"),
    (("--type", "x", "--gpus-per-worker", "0.5"), "worker.gpus must be an integer, got 0.5 (an all-reduce worker"),
    (("--type", "x", "--gpus-per-worker", "0"), "worker.gpus must be >= 1"),
    (("--arch", "allreduce", "--type", "x", "--cpus-per-ps", "2"), "ps: an all-reduce job has no parameter servers"),
    (("--arch", "allreduce", "--type", "x", "--max-ps", "2"), "max_ps: an all-reduce job has no parameter servers"),
    (("--type", "resnet-50", "--batch-size", "32", "--cpus-per-ps", "1", "--mem-per-ps", "1G"),
     "batch_size: only an all-reduce job"),
    (("--arch", "ps", "--type", "bert", "--cpus-per-ps", "1", "--mem-per-ps", "1G"), "unknown job type 'bert'"),
    (("--type", "bad model!"), "job_type of an all-reduce job must be a model name"),
    (("--type", "resnet-50", "--launch", "srun", "--cpus-per-ps", "1", "--mem-per-ps", "1G"),
     'launch: a PS job\'s runtime (dl2-run) starts its own tasks; launch = "srun" is for all-reduce jobs'),
])
def test_bad_all_reduce_submissions_name_the_field_and_write_nothing(dl2ctl, tmp_path, flags, message):
    r = dl2ctl("submit", "-J", "j", "--epochs", "1", "--wrap", "run", "--cpus-per-worker", "1", "--mem-per-worker",
               "1G", *flags)
    assert r.exit_code == 1, r.output
    assert "invalid job submission (1 problem)" in r.output and message in r.output, r.output
    assert not (tmp_path / "dl2d.sqlite").exists()


def test_submit_names_its_slurm_account_qos_partition_and_environment(dl2ctl, db_url, tmp_path):
    """Issue #14 item 1: what the job runs with comes from its submission, never the submitting shell."""
    f = tmp_path / "job.toml"
    f.write_text('account = "proj-a"\n' + TOML_SPEC + '\n[env]\nWANDB_PROJECT = "resnet"\nA = "from the spec"\n')
    r = dl2ctl("submit", str(f), "-q", "high", "-p", "gpu,cpu", "--export", "A=1,2=3", "--export", "B=")
    assert r.exit_code == 0, r.output
    [(*_, spec)] = jobs_in(db_url)
    assert (spec["account"], spec["qos"], spec["partition"]) == ("proj-a", "high", "gpu,cpu")
    assert spec["env"] == {"WANDB_PROJECT": "resnet", "A": "1,2=3", "B": ""}  # --export adds, name by name
    plain = tmp_path / "plain.toml"
    plain.write_text(TOML_SPEC)
    r = dl2ctl("submit", str(plain))
    assert r.exit_code == 0 and not {"account", "qos", "partition", "env"} & set(jobs_in(db_url)[-1][-1])


@pytest.mark.parametrize("flags, message", [
    (("--export", "DL2D_DB_URL=postgresql://x"), "env.DL2D_DB_URL: names starting with DL2D_, SLURM_, SBATCH_ are "
                                                  "dl2d's and Slurm's"),
    (("--export", "SLURM_CONF=/tmp/evil.conf"), "env.SLURM_CONF: names starting with"),
    (("--export", "SBATCH_HOLD=1"), "env.SBATCH_HOLD: names starting with"),
    (("--export", "1X=1"), "env: '1X' is not a variable name"),
    (("--export", "ALL"), "--export: NAME=VALUE expected, got 'ALL'"),
    (("--account", "-x"), "account must be a name of 1-64 letters"),
    (("--qos", "a b"), "qos must be a name of 1-64 letters"),
    (("--partition", "gpu,"), "partition must be names of 1-64 letters"),
])
def test_bad_slurm_names_and_environments_name_the_field_and_write_nothing(dl2ctl, tmp_path, flags, message):
    f = tmp_path / "job.toml"
    f.write_text(TOML_SPEC)
    r = dl2ctl("submit", str(f), *flags)
    assert r.exit_code == 1, r.output
    assert "invalid job submission (1 problem)" in r.output and message in r.output, r.output
    assert not (tmp_path / "dl2d.sqlite").exists()
