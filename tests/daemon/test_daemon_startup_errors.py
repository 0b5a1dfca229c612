"""Start-up problems are one clear line and exit status 2, never a traceback: a database
server that refuses, an unknown driver, a file that is not a database; a second daemon on the same state dir is
refused while the first runs; `dl2ctl report` on a bad URL is a clear error too."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DL2D_")} | {"PYTHONUNBUFFERED": "1"}


def dl2d(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dl2d.daemon.main", "--sim", "--no-metrics", *args],
                          capture_output=True, text=True, timeout=timeout, env=env())


@pytest.mark.parametrize("url, message", [
    ("postgresql+psycopg://nobody@127.0.0.1:1/dl2d", "Connection refused"),
    ("foo://x", "Can't load plugin: sqlalchemy.dialects:foo"),
    ("NOTADB", "file is not a database"),
])
def test_database_problems_are_one_line_and_exit_2(tmp_path, url, message):
    if url == "NOTADB":
        (tmp_path / "junk.sqlite").write_text("this is not a database\n" * 100)
        url = f"sqlite:///{tmp_path / 'junk.sqlite'}"
    (tmp_path / "none.toml").write_text("")  # no site configuration
    r = dl2d("--state-dir", str(tmp_path / "state"), "--db", url, "--slots", "1",
             "--config", str(tmp_path / "none.toml"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dl2d: database ") and message in lines[0]


def test_a_second_daemon_on_the_same_state_dir_is_refused(tmp_path):
    (tmp_path / "dl2d.toml").write_text(f'state_dir = "{tmp_path}"\nslot_seconds = 30\n[sim]\npace = true\n'
                                        '[metrics]\nenabled = false\n')
    first = subprocess.Popen([sys.executable, "-m", "dl2d.daemon.main", "--config", str(tmp_path / "dl2d.toml")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
    try:
        deadline = time.time() + 60
        while not (tmp_path / "dl2d.status.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "dl2d.lock").read_text().strip() == str(first.pid)
        r = dl2d("--config", str(tmp_path / "dl2d.toml"))
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert f"another dl2d (pid {first.pid}) is running with state dir {tmp_path}" in r.stderr
        assert first.poll() is None
    finally:
        first.terminate()
        first.wait(60)
    r = dl2d("--config", str(tmp_path / "dl2d.toml"), "--slots", "1", "--slot-seconds", "0.01")
    assert r.returncode == 0, r.stderr  # the lock went with the first daemon


def test_dl2ctl_report_on_a_bad_url_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dl2d.cli.main", "report", "--db", "foo://x"], capture_output=True,
                       text=True, timeout=60, env=env())
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "cannot open the database foo://x" in r.stderr


@pytest.mark.parametrize("toml, extra_env, message", [
    ("[slurm]\ntime_limit_min = -5\n", {}, "slurm.time_limit_min: must be >= 0, got -5"),
    ('[policy]\nname = "drf"\ncheckpoint = "/x.msgpack"\n', {},
     "policy.checkpoint: policy drf reads no checkpoint (it would be ignored)"),
    ('[db]\nurl = "sqlite:////x.sqlite"\n', {}, "unknown key 'db'"),
    ("", {"DL2D_SLOT_SECOND": "5"},
     "environment variable DL2D_SLOT_SECOND is not a dl2d setting; did you mean DL2D_SLOT_SECONDS (slot_seconds)?"),
])
def test_bad_settings_are_refused_naming_the_key_before_anything_is_written(tmp_path, toml, extra_env, message):
    """Issue #15, item 5: each was accepted (and a bad [slurm] table created and migrated the database first)."""
    (tmp_path / "dl2d.toml").write_text(toml)
    state = tmp_path / "state"
    for check in ([], ["--check-config"]):
        r = subprocess.run([sys.executable, "-m", "dl2d.daemon.main", "--sim", "--no-metrics", *check, "--config",
                            str(tmp_path / "dl2d.toml"), "--state-dir", str(state), "--slots", "1"],
                           capture_output=True, text=True, timeout=120, env=env() | extra_env)
        assert r.returncode == 2, r.stdout + r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dl2d: config error: ") and message in lines[0], r.stderr
        assert not state.exists()  # nothing written: no state dir, no database


def test_check_config_and_version(tmp_path):
    (tmp_path / "dl2d.toml").write_text('slot_seconds = 60\nmode = "advise"\n[policy]\nname = "optimus"\n')
    state = tmp_path / "state"
    r = subprocess.run([sys.executable, "-m", "dl2d.daemon.main", "--check-config", "--config",
                        str(tmp_path / "dl2d.toml"), "--state-dir", str(state)], capture_output=True, text=True,
                       timeout=120, env=env())
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"config OK: {tmp_path / 'dl2d.toml'}"
    assert "  mode: advise" in lines and "  policy: optimus" in lines and "  slot_seconds: 60" in lines
    assert f"  control socket: {state / 'dl2d.sock'}" in lines
    assert not state.exists()
    r = subprocess.run([sys.executable, "-m", "dl2d.daemon.main", "--version"], capture_output=True, text=True,
                       timeout=60, env=env())
    from importlib.metadata import version

    assert r.returncode == 0 and r.stdout.strip() == f"dl2d, version {version('dl2d')}"
