"""`dl2d --demo` resizes jobs: by default its trace contends for the cluster (40 Philly jobs at 3 times the Pollux
rate on t4-16), so the default policy (`elastic-chooser`) changes sizes, the report counts each kind of resize beside the
starts, `dl2ctl report`'s resizes table lists jobs, and the daemon's JCT is the bare simulator's on the same
trace (the daemon's view and plan are the simulator's: dl2d.daemon.plan.known_servers, moves).

A demo of 20 jobs at load 1 never contends: each job starts at its fastest size and no schedule, daemon or
simulator, has a reason to resize one; that case is pinned too."""
from __future__ import annotations

import os
import subprocess
import sys


def demo(tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL2D_")}
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "none.toml").write_text("")  # no site configuration
    cmd = [sys.executable, "-m", "dl2d.daemon.main", "--demo", "--state-dir", str(tmp_path),
           "--config", str(tmp_path / "none.toml"), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in r.stdout.splitlines()
            if line.count("│") == 3}
    return r, rows


def resize_rows(rows: dict[str, str]) -> dict[str, int]:
    return {k: int(v) for k, v in rows.items() if k.startswith("resizes:")}


def test_the_default_demo_resizes_jobs_as_the_bare_simulator_does(tmp_path):
    r, rows = demo(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (rows["world"], rows["cluster"], rows["policy"], rows["jobs completed"]) == \
        ("today", "t4-16", "elastic-chooser", "40")
    resized = resize_rows(rows)
    assert set(resized) == {"resizes: shrink or stop", "resizes: grown in place", "resizes: relaunched"}
    # the policy's own resizes: jobs shrunk for new ones and grown into what they left
    assert resized["resizes: shrink or stop"] > 0 and resized["resizes: grown in place"] > 0
    assert int(rows["job starts"]) >= 40 and rows["guardrail fallbacks"] == "0"
    assert rows["avg JCT (h, from the DB)"] == rows["avg JCT, bare simulator (h)"]

    from dl2d.db.engine import make_engine
    from dl2d.db.report import run_report

    engine = make_engine(f"sqlite:///{tmp_path / 'dl2d.sqlite'}")
    try:
        per_job = run_report(engine, "resizes_per_job")
    finally:
        engine.dispose()
    assert per_job and sum(row["n_resize"] + row["n_hot_scale"] for row in per_job) > 0


def test_an_uncontended_demo_starts_every_job_once_at_its_size(tmp_path):
    """20 jobs at load 1: their fastest sizes add up to 44 of the 64 GPUs, each starts at its fastest size and
    keeps it; nothing is resized, here as in the bare simulator (same JCT)."""
    r, rows = demo(tmp_path, "--demo-jobs", "20", "--demo-load", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert rows["arrival load (x Pollux's rate)"] == "1.0" and rows["job starts"] == "20"
    assert resize_rows(rows)["resizes: shrink or stop"] == 0 and resize_rows(rows)["resizes: grown in place"] == 0
    assert rows["avg JCT (h, from the DB)"] == rows["avg JCT, bare simulator (h)"]


def test_the_demo_load_is_for_todays_world(tmp_path):
    for bad in (["--demo-load", "0"], ["--world", "dl2", "--demo-load", "2"]):
        r, _ = demo(tmp_path / "bad", *bad)
        assert r.returncode == 2 and "--demo-load" in r.stderr, r.stderr
