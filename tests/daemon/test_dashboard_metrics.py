"""Metrics for dashboards: cluster capacity and allocation, nodes by state, each job's
workers and PS (its series gone once it ends), scraped over real HTTP from a real daemon; and the Grafana
dashboard in grafana/ uses only series the daemon exports."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "grafana" / "dl2d-dashboard.json"
SPEC = {"kind": "allreduce", "job_type": "bert", "batch_size": 96, "workers": 2, "max_workers": 2,
        "command": "python t.py", "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8}}


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of one scrape."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def dashboard_metrics() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    return {m for e in exprs for m in re.findall(r"\bdl2d_[a-z_]+", e)}


def test_the_dashboard_is_a_grafana_dashboard():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] == "dl2d" and doc["schemaVersion"] >= 30
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 10
    assert all(p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]) for p in doc["panels"])
    assert all(p["datasource"]["uid"] == "${datasource}" for p in doc["panels"])
    assert [v["name"] for v in doc["templating"]["list"]] == ["datasource"]
    cells = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in doc["panels"]]
    assert len(cells) == len(set(cells)) and all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in doc["panels"])


def test_the_daemon_exports_what_dashboards_need_and_the_dashboard_only_what_it_exports(tmp_path):
    (tmp_path / "dl2d.toml").write_text(
        f'state_dir = "{tmp_path}"\nslot_seconds = 60\n[sim]\ncluster = "tiny"\npace = false\nnoise = 0.0\n'
        '[metrics]\nport = 0\n[control]\nenabled = false\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL2D_")}
    p = subprocess.Popen([sys.executable, "-m", "dl2d.daemon.main", "--config", str(tmp_path / "dl2d.toml")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        status = tmp_path / "dl2d.status.json"
        end = time.time() + 60
        while not (status.exists() and json.loads(status.read_text()).get("metrics_url")) and time.time() < end:
            time.sleep(0.1)
        url = json.loads(status.read_text())["metrics_url"]
        from dl2d.db.engine import make_engine, session_scope
        from dl2d.db.jobs import submit_job

        eng = make_engine(f"sqlite:///{tmp_path / 'dl2d.sqlite'}")
        with session_scope(eng) as s:
            short = submit_job(s, {**SPEC, "name": "short", "owner": "alice", "total_epochs": 0.02}).id
            long = submit_job(s, {**SPEC, "name": "long", "owner": "bob", "total_epochs": 5000.0}).id
        eng.dispose()
        end = time.time() + 60
        while time.time() < end:
            m = scrape(url)
            workers = {lb["job"]: v for lb, v in m.get("dl2d_job_workers", [])}
            if str(long) in workers and str(short) not in workers and \
                    any(lb == {"state": "COMPLETED"} and v == 1 for lb, v in m.get("dl2d_jobs", [])):
                break
            time.sleep(0.2)
        # the short job finished: its series is gone; the long one runs with what it asked for
        assert workers == {str(long): 2.0}, m.get("dl2d_job_workers")
        assert [(lb, v) for lb, v in m["dl2d_job_ps"]] == [({"job": str(long), "name": "long"}, 0.0)]
        cap = {lb["resource"]: v for lb, v in m["dl2d_cluster_capacity"]}
        used = {lb["resource"]: v for lb, v in m["dl2d_cluster_allocated"]}
        assert cap["gpus"] > 0 and used == {"gpus": 2.0, "cpus": 4.0, "mem_gb": 16.0}, (cap, used)
        nodes = {lb["state"]: v for lb, v in m["dl2d_nodes"]}
        assert sum(nodes.values()) == 4 and nodes["drained"] == 0 and nodes["idle"] >= 2, nodes
        assert m["dl2d_decision_seconds_count"][0][1] > 0
        missing = sorted(n for n in dashboard_metrics() if n not in m)
        assert not missing, f"the dashboard queries series the daemon does not export: {missing}"
    finally:
        p.terminate()
        p.communicate(timeout=60)
