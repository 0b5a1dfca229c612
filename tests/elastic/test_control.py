import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from testkit.elastic import long_cfg

from dl2d.elastic import control
from dl2d.elastic.control import JobCaps, choose_resize_method
from dl2d.elastic.progress import ProgressReporter


def test_choose_resize_method_cases():
    hot = JobCaps(hot_scaling=True)
    assert choose_resize_method(hot, (2, 1), (4, 2), free_nodes=3) == "hot"
    assert choose_resize_method(hot, (2, 1), (4, 2), free_nodes=2) == "checkpoint_restart"
    assert choose_resize_method(hot, (4, 2), (1, 1), free_nodes=0) == "hot"  # shrink needs no nodes
    assert choose_resize_method(JobCaps(hot_scaling=False), (4, 2), (1, 1), 10) == "checkpoint_restart"
    packed = JobCaps(hot_scaling=True, roles_per_node=4, spare_slots=1)
    assert choose_resize_method(packed, (1, 1), (5, 2), free_nodes=1) == "hot"   # 5 extra - 1 spare = 4 -> 1 node
    assert choose_resize_method(packed, (1, 1), (6, 2), free_nodes=1) == "checkpoint_restart"
    with pytest.raises(ValueError):
        choose_resize_method(hot, (1, 1), (0, 1), 5)


def test_control_api_against_running_job(make_cluster):
    c = make_cluster(long_cfg(), 1, 1)
    addr, secret = c.coord.address, c.coord.secret
    assert control.supports_hot_scaling(addr, secret=secret)
    assert not control.supports_hot_scaling(addr)  # no secret: refused
    assert not control.supports_hot_scaling("127.0.0.1:1", secret=secret)
    res = control.scale(addr, workers=2, ps=2, secret=secret)
    assert res["method"] == "hot" and {r["kind"] for r in res["records"]} == {"add_ps", "add_worker"}
    st = control.status(addr, secret=secret)
    assert len(st["ps"]) == 2 and len(st["workers"]) == 2 and st["hot_scaling"]
    assert c.wait(60) == "done"


class _Sink(BaseHTTPRequestHandler):
    got: list = []

    def do_POST(self):
        n = int(self.headers["Content-Length"])
        _Sink.got.append(json.loads(self.rfile.read(n)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_progress_http_post_and_file(tmp_path):
    srv = HTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    f = tmp_path / "p.json"
    r = ProgressReporter(f"http://127.0.0.1:{srv.server_address[1]}/progress", str(f), interval=0)
    rec = {"job_id": "j", "epoch": 1, "step": 10, "samples_per_s": 5.0, "workers": 2, "ps": 1, "time": 1.0}
    assert r.report(rec)
    deadline = time.monotonic() + 5
    while not _Sink.got and time.monotonic() < deadline:
        time.sleep(0.01)
    srv.shutdown()
    assert _Sink.got[-1] == rec
    assert json.loads(f.read_text()) == rec


def test_progress_survives_daemon_down(tmp_path):
    r = ProgressReporter("http://127.0.0.1:1/none", str(tmp_path / "p.json"), interval=0, timeout=0.5)
    assert r.report({"step": 1})
    deadline = time.monotonic() + 5
    while r.failures == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert r.failures == 1 and json.loads((tmp_path / "p.json").read_text()) == {"step": 1}
