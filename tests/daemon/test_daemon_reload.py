"""SIGHUP reloads the configuration (as admins do with slurmctld): the real daemon process keeps running and
keeps its jobs, takes the new policy and guardrails after the slot in progress, tells systemd (RELOADING=1,
then READY=1), and refuses a file that does not validate, naming the key, without changing anything."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from dl2d.db.engine import make_engine, session_scope
from dl2d.db.jobs import submit_job
from dl2d.db.models import Job
from testkit.daemon import NotifySocket


def write_config(path, state_dir, policy: str, extra: str = "") -> None:
    path.write_text(f'state_dir = "{state_dir}"\nslot_seconds = 0.2\n[sim]\ncluster = "tiny"\npace = true\n'
                    f'[metrics]\nenabled = false\n[policy]\nname = "{policy}"\n{extra}')


def status(tmp_path) -> dict:
    try:
        return json.loads((tmp_path / "dl2d.status.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def wait(pred, timeout: float = 60.0, what: str = "") -> None:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_sighup_reloads_the_policy_keeps_the_jobs_and_refuses_a_bad_file(tmp_path):
    cfg = tmp_path / "dl2d.toml"
    write_config(cfg, tmp_path, "drf")
    sock_path = str(tmp_path / "notify.sock")
    srv = NotifySocket(sock_path)
    msgs = srv.msgs
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL2D_")}
    env.update(PYTHONUNBUFFERED="1", NOTIFY_SOCKET=sock_path)
    p = subprocess.Popen([sys.executable, "-m", "dl2d.daemon.main", "--config", str(cfg)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        wait(lambda: status(tmp_path).get("slot") is not None, what="the first slot")
        eng = make_engine(f"sqlite:///{tmp_path / 'dl2d.sqlite'}")
        with session_scope(eng) as s:
            for i in range(3):
                submit_job(s, {"name": f"j{i}", "owner": "alice", "job_type": "resnet-50", "total_epochs": 5000,
                               "command": "python t.py", "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8},
                               "ps": {"cpus": 2, "mem_gb": 4}})

        def running() -> dict:
            with session_scope(eng) as s:
                return {j.name: (j.state.value, j.started_at) for j in s.query(Job)}

        wait(lambda: all(st == "RUNNING" for st, _ in running().values()), what="the jobs running")
        before = running()
        assert status(tmp_path)["policy"] == "drf"

        write_config(cfg, tmp_path, "srtf", "[guardrails]\nstarve_slots = 3\n")
        p.send_signal(signal.SIGHUP)
        wait(lambda: status(tmp_path).get("policy") == "srtf", what="the reloaded policy")
        slot = status(tmp_path)["slot"]
        wait(lambda: status(tmp_path)["slot"] >= slot + 3, what="slots after the reload")
        assert p.poll() is None
        after = running()
        assert set(after) == set(before) and all(after[n][1] == before[n][1] for n in before)  # not restarted
        assert all(st in ("RUNNING", "PENDING") for st, _ in after.values())
        assert any(m.startswith("RELOADING=1") for m in msgs) and sum(m.startswith("READY=1") for m in msgs) >= 2

        write_config(cfg, tmp_path, "no-such-policy")
        p.send_signal(signal.SIGHUP)
        slot = status(tmp_path)["slot"]
        wait(lambda: status(tmp_path)["slot"] >= slot + 3, what="slots after the refused reload")
        assert p.poll() is None and status(tmp_path)["policy"] == "srtf"

        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out[-3000:]
        assert "configuration reloaded: policy srtf, fallback elastic, starve_slots 3" in out
        assert "reload refused, the running configuration stays: config error: policy.name" in out
        eng.dispose()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        srv.close()
