"""`dl2d` with its metrics port already taken says so first: one line and exit 2 before the database is opened
and the policy loaded (the slow part of a start), not after them."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_metrics_port_in_use_is_refused_before_the_database_and_the_policy(tmp_path):
    config = tmp_path / "dl2d.toml"
    config.write_text("")  # not the host's /etc/dl2d/dl2d.toml
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DL2D_")}
        r = subprocess.run([sys.executable, "-m", "dl2d.daemon.main", "--sim", "--state-dir", str(tmp_path),
                            "--config", str(config), "--metrics-port", str(port),
                            "--policy", "dl2-target", "--slots", "1"],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == [f"dl2d: cannot serve metrics on 127.0.0.1:{port}: Address already in use"]
    assert not (tmp_path / "dl2d.sqlite").exists()  # the database was never opened: the port was checked first
