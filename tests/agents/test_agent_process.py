"""A real dl2-agent process and the real poller over real HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dl2d.daemon.poller import Poller


def test_once_prints_one_sample():
    out = subprocess.run([sys.executable, "-m", "dl2d.agents.main", "--once", "--node-name", "n9"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    s = json.loads(out)
    assert s["node"] == "n9" and s["schema"] == 1 and s["host"]["cpu_count"] >= 1
    if not os.path.exists("/dev/nvidiactl"):  # no driver here: zero GPUs, with the reason
        assert s["gpu_count"] == 0 and s["gpus"] == [] and "NVML" in s["gpu_error"]


def test_refuses_to_start_with_a_readable_token_file(token_file):
    os.chmod(token_file, 0o644)
    r = subprocess.run([sys.executable, "-m", "dl2d.agents.main", "--port", "0",
                        "--token-file", token_file], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "mode 0644" in r.stderr and "chmod 600" in r.stderr


def test_poll_real_agent_stale_and_recover(token_file, token, agent_factory):
    a = agent_factory(token_file, node="gpu01", extra=["--fake-gpus", "2"])
    events = []
    p = Poller([("gpu01", a.url)], token, timeout=1.0, stale_after=2,
               on_stale=lambda n, why: events.append(("stale", n, why)),
               on_recover=lambda n: events.append(("recovered", n)))
    r = p.poll_round()
    assert r.errors == {}
    s = r.samples["gpu01"]
    assert s["gpu_count"] == 2 and s["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert s["host"]["mem_total_bytes"] > 0

    # wrong token: refused by the real agent
    bad = Poller([("gpu01", a.url)], "wrong", timeout=1.0).poll_round()
    assert bad.errors == {"gpu01": "HTTP 401 unauthorized (token mismatch)"}

    a.stop()  # agent silent
    assert p.poll_round().transitions == [] and events == []
    r = p.poll_round()
    assert [t.kind for t in r.transitions] == ["stale"] and p.stale_nodes == {"gpu01"}
    assert events[0][:2] == ("stale", "gpu01") and "silent for 2 polls" in events[0][2]
    p.poll_round()
    assert len(events) == 1  # reported once

    agent_factory(token_file, node="gpu01", port=a.port, extra=["--fake-gpus", "2"])
    r = p.poll_round()
    assert [t.kind for t in r.transitions] == ["recovered"] and p.stale_nodes == set()
    assert events[-1] == ("recovered", "gpu01")
