"""The installed `dl2ctl` console script, run as a subprocess against a SQLite file: submit, queue, show,
cancel, and --help listing the commands."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run(tmp_path):
    exe = shutil.which("dl2ctl")
    if exe is None:
        pytest.fail("the dl2ctl console script is not installed (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL2D_")}
    # import this checkout's dl2d even when the package was installed in editable mode from elsewhere
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["DL2D_DB_URL"] = f"sqlite:///{tmp_path / 'dl2d.sqlite'}"
    env["DL2D_CONFIG"] = str(tmp_path / "absent.toml")

    def go(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([exe, *args], env=env, input=input, capture_output=True, text=True, timeout=120)

    return go


def test_dl2ctl_subprocess_round_trip(run, tmp_path):
    helped = run("--help")
    assert helped.returncode == 0
    for name in ("submit", "queue", "show", "cancel"):
        assert f"  {name} " in helped.stdout

    spec = tmp_path / "job.toml"
    spec.write_text('name = "sub"\njob_type = "dssm"\ntotal_epochs = 4\ncommand = "python t.py"\n'
                    "[worker]\ncpus = 1\nmem_gb = 2\n[ps]\ncpus = 1\nmem_gb = 1\n")
    sub = run("submit", str(spec), "--json")
    assert sub.returncode == 0, sub.stderr
    jid = json.loads(sub.stdout)["id"]

    q = run("queue", "--json")
    assert q.returncode == 0, q.stderr
    assert [(j["id"], j["job_type"], j["state"]) for j in json.loads(q.stdout)] == [(jid, "dssm", "PENDING")]

    shown = run("show", str(jid))
    assert shown.returncode == 0 and "submit" in shown.stdout and "dssm" in shown.stdout

    cancelled = run("cancel", str(jid))  # the test runs as the owner it submitted as
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"Cancelled job {jid} (sub)"
    assert run("queue", "--json").stdout.strip() == "[]"

    bad = run("submit", "--arch", "ps", "--type", "nope", "-J", "x")  # a PS job's model is one of DL2's types
    assert bad.returncode == 1 and "unknown job type 'nope'" in bad.stderr
    missing = run("show", "999")
    assert missing.returncode == 1 and "no job with id 999" in missing.stderr
