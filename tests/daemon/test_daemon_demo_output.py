"""`dl2d --demo` is quiet: its report and the lines that matter, not Alembic's set-up and
a line per slot; `--log-level info` shows the work, each line with its logger's name, changes only."""
from __future__ import annotations

import os
import subprocess
import sys


def demo(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL2D_")}
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "none.toml").write_text("")  # no site configuration
    cmd = [sys.executable, "-m", "dl2d.daemon.main", "--demo", "--world", "dl2", "--demo-jobs", "6", "--demo-types", "resnext-110,wlm",
           "--cluster", "tiny", "--state-dir", str(tmp_path), "--config", str(tmp_path / "none.toml"), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_the_demo_prints_its_report_in_under_40_lines(tmp_path):
    r = demo(tmp_path / "quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = (r.stdout + r.stderr).splitlines()
    assert len(lines) < 40, "\n".join(lines)
    assert any("jobs completed" in line for line in lines)
    assert not any("alembic" in line or "setup plugin" in line for line in lines)


def test_info_logs_name_the_logger_and_skip_slots_that_changed_nothing(tmp_path):
    r = demo(tmp_path / "info", "--log-level", "info")
    assert r.returncode == 0, r.stdout + r.stderr
    log = [line for line in r.stdout.splitlines() if " INFO " in line]
    assert log and all(" INFO dl2d: " in line for line in log)  # the logger's name on every line
    assert any(" INFO dl2d: policy: dl2-target from " in line for line in log)  # the shipped DL2-world policy
    slots = [line for line in log if " INFO dl2d: slot " in line]
    assert slots and all(" 0 intents" not in line for line in slots)  # quiet slots are DEBUG
    assert not any("setup plugin" in line for line in log)


def test_the_demo_runs_todays_world_by_default(tmp_path):
    """No --world: all-reduce jobs drawn from the Philly trace on the measured 16 x 4 T4 cluster, 60 s slots."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL2D_")}
    (tmp_path / "none.toml").write_text("")
    cmd = [sys.executable, "-m", "dl2d.daemon.main", "--demo", "--demo-jobs", "6", "--state-dir", str(tmp_path),
           "--config", str(tmp_path / "none.toml")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in r.stdout.splitlines()
            if line.count("│") == 3}
    assert (rows["world"], rows["cluster"], rows["jobs completed"]) == ("today", "t4-16", "6")
    # the recommended policy (the daemon's default), and the best heuristic on the same trace beside it
    assert rows["policy"] == "elastic-chooser" and rows["best heuristic"] == "elastic"
    assert float(rows["its avg JCT, bare simulator (h)"]) > 0
    from dl2d.db.engine import make_engine, session_scope
    from dl2d.db.jobs import list_jobs

    engine = make_engine(f"sqlite:///{tmp_path / 'dl2d.sqlite'}")
    with session_scope(engine) as s:
        jobs = list_jobs(s)
        assert len(jobs) == 6 and {j.spec["kind"] for j in jobs} == {"allreduce"}
        # virtual time in 60 s slots: each job submitted at its trace's second, within a slot (the daemon sees it
        # at the next slot's start; its JCT counts from the submission, as the bare simulator's does)
        slots = [(j.submitted_at - jobs[0].submitted_at).total_seconds() / 60 for j in jobs]
        assert max(slots) > 0 and any(abs(k - round(k)) > 1e-3 for k in slots)
    engine.dispose()
    bad = subprocess.run([*cmd[:4], "--demo-types", "wlm", *cmd[4:]], capture_output=True, text=True, timeout=60,
                         env=env)
    assert bad.returncode == 2 and "--world dl2" in bad.stderr
