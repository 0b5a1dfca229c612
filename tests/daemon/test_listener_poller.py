"""A silent agent never drains its node (real sockets on 127.0.0.1): anyone who can reach an agent's port can
make it silent, so the daemon's poll round marks the node stale (an event, a warning, the dl2d_stale_nodes
metric, `stale` in the node report) and leaves the node as the backend has it; scheduling goes on on Slurm's
own node state."""
from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select

from dl2d.daemon import agent_rounds
from dl2d.daemon.metrics import Metrics
from dl2d.daemon.poller import Poller
from dl2d.db.engine import make_engine, session_scope, upgrade
from dl2d.db.models import Event, EventKind, utcnow

TOKEN = "test-token-5f1c0e"


class Backend:
    """Records every node change asked of it; the test fails if there is one."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node, reason))

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))


@pytest.fixture
def engine(tmp_path):
    url = f"sqlite:///{tmp_path / 'dl2d.sqlite'}"
    upgrade(url)
    e = make_engine(url)
    yield e
    e.dispose()


@pytest.fixture
def silent_agent():
    """A port that accepts connections (the kernel's backlog) and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


@pytest.fixture
def busy_agent():
    """An agent that turns every poll away (503), as one whose address share a flood holds would."""

    class Busy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def stale_events(engine) -> list[dict]:
    with session_scope(engine) as s:
        return [e.detail for e in s.scalars(select(Event).where(Event.kind == EventKind.NODE_STALE))]


@pytest.mark.parametrize("agent, error", [("silent_agent", "timeout"), ("busy_agent", "turned away")])
def test_a_silent_or_busy_agent_marks_its_node_stale_and_the_backend_is_never_asked_to_drain(
        request, engine, caplog, agent, error):
    url = request.getfixturevalue(agent)
    backend, metrics = Backend(), Metrics()
    poller = Poller([("gpu01", url)], TOKEN, timeout=0.5, stale_after=2)
    caplog.set_level(logging.WARNING, logger="dl2d")
    for k in range(4):  # stale at the second round; still stale after
        n, samples = agent_rounds.poll_round(poller, engine, backend, metrics, utcnow)
        assert n == 0 and samples == []
        assert poller.health() == {"gpu01": "missed 1" if k == 0 else "stale"}
    assert backend.calls == []
    assert metrics.stale_nodes._value.get() == 1
    (event,) = stale_events(engine)  # recorded once
    assert event["node"] == "gpu01" and "silent for 2 polls" in event["reason"] and error in event["reason"]
    lines = [r.getMessage() for r in caplog.records if "stale" in r.getMessage()]
    assert lines == [f"agent of node gpu01 is stale: {event['reason']}; the node is left as Slurm has it"]
