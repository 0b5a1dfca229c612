"""The service surface: sd_notify over a real unix datagram socket, SIGTERM -> clean exit 0, the Prometheus
endpoint over real HTTP, and `dl2ctl daemon status`."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from dl2d.daemon.notify import Notifier
from testkit.daemon import NotifySocket


def test_notifier_sends_datagrams_and_rate_limits_watchdog(tmp_path):
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as srv:
        srv.bind(path)
        srv.settimeout(2)
        n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"})
        assert n.enabled and n.watchdog_s == 4.0 and n.max_sleep == 1.0
        assert n.ready("hello")
        assert srv.recv(1024) == b"READY=1\nSTATUS=hello"
        assert n.ping() and not n.ping()  # second ping within watchdog/4 is skipped
        assert srv.recv(1024) == b"WATCHDOG=1"
        assert n.stopping() and srv.recv(1024) == b"STOPPING=1"
        for _ in range(1000):  # nobody reads: the queue fills, sends fail fast instead of blocking
            n.status("x")
        t0 = time.monotonic()
        # a blocking send would never return; a failing one returns in microseconds (5 s: a loaded machine's margin)
        assert not n.status("dropped") and time.monotonic() - t0 < 5
    assert not Notifier({}).ready()  # outside systemd: a no-op
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")}).ready()  # never raises


def test_daemon_under_notify_socket_with_metrics_sigterm_and_status(tmp_path):
    path = str(tmp_path / "notify.sock")
    srv = NotifySocket(path)
    (tmp_path / "dl2d.toml").write_text(
        f'state_dir = "{tmp_path}"\nslot_seconds = 0.2\n[sim]\ncluster = "tiny"\npace = true\n'
        '[metrics]\nport = 0\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL2D_")}
    env.update(NOTIFY_SOCKET=path, WATCHDOG_USEC="2000000", PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "dl2d.daemon.main", "--config", str(tmp_path / "dl2d.toml")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    msgs = srv.msgs

    def wait_msg(pred, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            if any(pred(m) for m in list(msgs)):
                return True
            time.sleep(0.05)
        return False

    try:
        assert wait_msg(lambda m: m.startswith("READY=1"))
        assert wait_msg(lambda m: m.startswith("STATUS=slot 2"))
        assert "WATCHDOG=1" in msgs
        # a job submitted meanwhile (as dl2ctl submit does) gets scheduled
        from dl2d.db.engine import make_engine, session_scope
        from dl2d.db.jobs import submit_job

        eng = make_engine(f"sqlite:///{tmp_path / 'dl2d.sqlite'}")
        with session_scope(eng) as s:
            submit_job(s, {"name": "j1", "owner": "alice", "job_type": "resnet-50", "total_epochs": 5000,
                           "command": "python t.py", "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8},
                           "ps": {"cpus": 2, "mem_gb": 4}})
        eng.dispose()
        status = json.loads((tmp_path / "dl2d.status.json").read_text())
        url = status["metrics_url"]
        deadline = time.time() + 30
        while time.time() < deadline:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            if re.search(r'dl2d_resizes_total\{method="start"\} 1\.0', text) and \
                    'dl2d_jobs{state="RUNNING"} 1.0' in text:
                break
            time.sleep(0.2)
        assert 'dl2d_decisions_total{source="policy"}' in text
        assert "dl2d_slot_tick_seconds_bucket" in text and 'dl2d_jobs{state="RUNNING"} 1.0' in text
        assert re.search(r'dl2d_resizes_total\{method="start"\} 1\.0', text)
        r = subprocess.run([sys.executable, "-m", "dl2d.cli.main", "daemon", "status", "--state-dir", str(tmp_path),
                            "--config", str(tmp_path / "none.toml"), "--json"], capture_output=True, text=True,
                           timeout=60)
        st = json.loads(r.stdout)
        assert r.returncode == 0 and st["status"] == "running" and st["daemon"]["pid"] == p.pid
        assert st["database"]["jobs"] == {"RUNNING": 1} and st["database"]["pending_intents"] == 0
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out[-3000:]
        assert wait_msg(lambda m: m == "STOPPING=1", 10)
        assert "SIGTERM received" in out
        r = subprocess.run([sys.executable, "-m", "dl2d.cli.main", "daemon", "status", "--state-dir", str(tmp_path),
                            "--config", str(tmp_path / "none.toml")], capture_output=True, text=True, timeout=60)
        assert r.returncode == 3 and "stopped" in r.stdout
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        srv.close()
