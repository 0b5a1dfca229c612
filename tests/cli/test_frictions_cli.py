"""What dl2ctl tells a user where it used to say too little: `show` names the file the job's Slurm output is in
(a failed job's state is often only Slurm's `NonZeroExitCode`), and a `submit` or `cancel` that no daemon
answered says so, and what became of it (written to the database, waiting for a daemon; or refused)."""
from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy import select

from dl2d.cli.jobs import output_file
from dl2d.cli.main import cli
from dl2d.db.engine import make_engine, session_scope
from dl2d.db.models import Job, JobState


def _set_slurm_id(engine, job_id: int, slurm_id: str, state=JobState.FAILED) -> None:
    with session_scope(engine) as s:
        job = s.get(Job, job_id)
        job.slurm_job_id, job.state = slurm_id, state


def test_output_file_is_the_job_directorys_slurm_output_of_the_latest_run():
    assert output_file("/shared/dl2d", 12, "4711") == "/shared/dl2d/jobs/12/job/slurm-4711.out"
    assert output_file("/shared/dl2d", 12, None) is None  # never reached Slurm: no output


def test_show_names_the_output_file_under_the_configs_slurm_state_dir(dl2ctl, seed, engine, tmp_path,
                                                                     monkeypatch):
    config = tmp_path / "dl2d.toml"
    config.write_text('state_dir = "/var/lib/dl2d-x"\n[slurm]\nstate_dir = "/shared/dl2d"\n')
    monkeypatch.setenv("DL2D_CONFIG", str(config))
    jid = seed("alice")
    _set_slurm_id(engine, jid, "4711")
    r = dl2ctl("show", str(jid), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["output"] == f"/shared/dl2d/jobs/{jid}/job/slurm-4711.out"
    r = dl2ctl("show", str(jid))
    assert r.exit_code == 0, r.output
    [line] = [x for x in r.stdout.splitlines() if x.startswith("output")]
    assert line.split() == ["output", f"/shared/dl2d/jobs/{jid}/job/slurm-4711.out"]


def test_show_defaults_to_the_state_dirs_slurm_directory_and_says_none_before_slurm(dl2ctl, seed, engine,
                                                                                    tmp_path, monkeypatch):
    monkeypatch.setenv("DL2D_STATE_DIR", "/srv/dl2d")
    ran, never = seed("alice"), seed("alice")
    _set_slurm_id(engine, ran, "9")
    assert json.loads(dl2ctl("show", str(ran), "--json").stdout)["output"] == \
        f"/srv/dl2d/slurm/jobs/{ran}/job/slurm-9.out"
    assert json.loads(dl2ctl("show", str(never), "--json").stdout)["output"] is None
    [line] = [x for x in dl2ctl("show", str(never)).stdout.splitlines() if x.startswith("output")]
    assert line.split() == ["output", "-"]


def _no_daemon_config(tmp_path, state_dir) -> str:
    """A config whose state dir has no daemon: its socket is <state_dir>/dl2d.sock, nobody listens."""
    config = tmp_path / "dl2d.toml"
    config.write_text(f'state_dir = "{state_dir}"\n')
    return str(config)


def test_a_submit_no_daemon_answered_says_it_was_written_to_the_database_and_waits(as_user, spec, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setenv("DL2D_CONFIG", _no_daemon_config(tmp_path, tmp_path))
    f = tmp_path / "job.json"
    f.write_text(json.dumps(spec))
    r = CliRunner().invoke(cli, ["submit", str(f)])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "Submitted job 1 (resnet-a, resnet-50, 30 epochs) for alice"
    sock, db = tmp_path / "dl2d.sock", tmp_path / "dl2d.sqlite"
    assert r.stderr.strip() == (f"note: no dl2d answers on {sock} (No such file or directory): job 1 was written to "
                                f"the database sqlite:///{db} directly; it waits there until dl2d starts, which acts "
                                "on it at its first slot")
    engine = make_engine(f"sqlite:///{db}")
    try:
        with session_scope(engine) as s:
            assert [(j.id, j.state) for j in s.scalars(select(Job))] == [(1, JobState.PENDING)]
    finally:
        engine.dispose()
    r = CliRunner().invoke(cli, ["submit", str(f), "--json"])  # --json: standard output stays JSON
    assert r.exit_code == 0 and json.loads(r.stdout)["id"] == 2 and "job 2 was written" in r.stderr
    r = CliRunner().invoke(cli, ["cancel", "1"])
    assert r.exit_code == 0 and r.stdout.strip() == "Cancelled job 1 (resnet-a)"
    assert "no dl2d answers on" in r.stderr and "the cancellation of job 1 was written to the database" in r.stderr


def test_a_submit_no_daemon_answered_and_the_database_refused_says_both(as_user, spec, tmp_path, monkeypatch):
    missing = tmp_path / "not-installed"
    monkeypatch.setenv("DL2D_CONFIG", _no_daemon_config(tmp_path, missing))
    f = tmp_path / "job.json"
    f.write_text(json.dumps(spec))
    r = CliRunner().invoke(cli, ["submit", str(f)])
    assert r.exit_code == 1 and "Submitted" not in r.stdout
    assert (f"no dl2d answers on {missing / 'dl2d.sock'}, so this went to the database directly, which only the "
            "daemon's account may write: start dl2d, or give DL2D_SOCKET") in r.stderr, r.stderr
    assert not missing.exists()


def test_a_database_named_on_the_command_line_adds_no_note(dl2ctl, spec, tmp_path):
    f = tmp_path / "job.json"
    f.write_text(json.dumps(spec))
    r = dl2ctl("submit", str(f))
    assert r.exit_code == 0 and r.stderr == ""  # --db: the database was meant, no daemon was asked
