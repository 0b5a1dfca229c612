"""Agents wired into the daemon: two real `dl2-agent --fake-gpus` processes polled every slot; samples land
in node_samples; a killed agent's node is marked stale after K silent polls (an event, the metric, `stale` in
the node report) and is never drained for it: the backend's nodes stay as the backend has them."""
from __future__ import annotations


from sqlalchemy import func, select
from testkit.agents import TOKEN, start_agent, stop_agents

from dl2d.daemon.config import build_config
from dl2d.daemon.main import build_loop
from dl2d.db.engine import session_scope
from dl2d.db.jobs import submit_job
from dl2d.db.models import Event, EventKind, NodeSample


def test_samples_stored_and_a_silent_agent_marks_its_node_stale_without_draining_it(tmp_path):
    tok = tmp_path / "agent.token"
    tok.write_text(TOKEN + "\n")
    tok.chmod(0o600)
    procs = []
    try:
        for node in ("sim001", "sim002"):
            procs.append(start_agent(str(tok), node))
        cfg = build_config({"state_dir": str(tmp_path), "sim": {"cluster": "tiny"}, "metrics": {"enabled": False},
                            "agents": {"nodes": {"sim001": procs[0][1], "sim002": procs[1][1]},
                                       "token_file": str(tok), "stale_after": 2, "timeout": 2.0}}, {})
        loop = build_loop(cfg)
        drains: list = []
        real_drain, real_resume = loop.backend.drain, loop.backend.resume
        loop.backend.drain = lambda node, reason: (drains.append(("drain", node, reason)), real_drain(node, reason))
        loop.backend.resume = lambda node: (drains.append(("resume", node)), real_resume(node))
        with session_scope(loop.engine) as s:
            submit_job(s, {"name": "big", "owner": "bob", "job_type": "resnet-50", "total_epochs": 9000,
                           "command": "python t.py", "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8},
                           "ps": {"cpus": 2, "mem_gb": 4}})
        loop.run(max_slots=2)
        with session_scope(loop.engine) as s:
            rows = list(s.scalars(select(NodeSample)))
        assert {r.node for r in rows} == {"sim001", "sim002"} and len(rows) == 4
        assert all(r.gpu_count == 2 and r.gpu_mem_total_bytes > 0 for r in rows)

        procs[1][0].terminate()
        procs[1][0].wait(10)
        loop.run(max_slots=1)  # one silent poll: not yet stale
        assert all(n.usable for n in loop.backend.nodes())
        loop.run(max_slots=1)  # second silent poll (K = 2): stale, and still usable
        assert all(n.usable for n in loop.backend.nodes()) and drains == []
        assert loop.poller.health() == {"sim001": "ok", "sim002": "stale"}
        assert loop.metrics.stale_nodes._value.get() == 1
        with session_scope(loop.engine) as s:
            ev = s.scalars(select(Event).where(Event.kind == EventKind.NODE_STALE)).one()
            assert ev.detail["node"] == "sim002" and "silent for 2 polls" in ev.detail["reason"]
            assert s.scalar(select(func.count()).select_from(NodeSample).where(NodeSample.node == "sim002")) == 2
        # still stale while silent; polling goes on for the others
        loop.run(max_slots=1)
        assert loop.poller.stale_nodes == {"sim002"}
        with session_scope(loop.engine) as s:
            assert s.scalar(select(func.count()).select_from(NodeSample).where(NodeSample.node == "sim001")) == 5
        # the agent comes back: recovered (an event), and the backend was never asked to drain or resume
        procs[1] = start_agent(str(tok), "sim002")
        loop.poller.set_targets([("sim001", procs[0][1]), ("sim002", procs[1][1])])
        loop.run(max_slots=1)
        assert all(n.usable for n in loop.backend.nodes()) and loop.poller.stale_nodes == set()
        assert loop.metrics.stale_nodes._value.get() == 0
        with session_scope(loop.engine) as s:
            assert s.scalar(select(func.count()).select_from(Event).where(Event.kind == EventKind.NODE_RECOVERED)) == 1
        assert drains == []
    finally:
        stop_agents(procs)
