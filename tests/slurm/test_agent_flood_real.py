"""Slow strangers cannot drain a node, on the real local Slurm (see conftest): the real `dl2d` daemon polls two
real `dl2-agent` processes (fake GPUs) on loopback. 40 unauthenticated connections trickle a header line to
node1's agent every 2 s (each would hold one of its 32 threads before): the daemon's polls are still answered
and node1 never turns stale. node2's agent is killed: it turns stale (an event), and Slurm is never asked to
drain it — neither node is drained in Slurm, and a job runs and finishes meanwhile.
"""
from __future__ import annotations

import socket
import threading
import time

import pytest
from test_daemon_on_slurm import Harness, wait_alive
from testkit.agents import TOKEN, start_agent, stop_agents

from dl2d.db.models import JobState

pytestmark = pytest.mark.slurm

SLOW_CLIENTS = 40


def trickle(host: str, port: int, stop: threading.Event, held: list[int]) -> None:
    """One stranger: connect, send a request line, then one header line every 2 s until told to stop (bounded:
    the test's own deadline ends it); counts the connections the agent kept open."""
    try:
        s = socket.create_connection((host, port), timeout=5)
    except OSError:
        return
    try:
        s.sendall(b"GET /v1/stats HTTP/1.1\r\n")
        held.append(1)
        for i in range(30):
            if stop.wait(2.0):
                return
            s.sendall(f"X-Slow-{i}: 1\r\n".encode())
    except OSError:
        return  # dropped by the agent: what its whole-request deadline is for
    finally:
        s.close()


def test_slow_strangers_and_a_dead_agent_never_drain_a_node(slurm, tmp_path, wait_for):
    token = tmp_path / "agent.token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    agents = [start_agent(str(token), node) for node in ("node1", "node2")]
    (_, url1), (p2, url2) = agents
    h = Harness(slurm, tmp_path, prefix="af-")
    stop = threading.Event()
    strangers: list[threading.Thread] = []
    try:
        with h.config.open("a") as f:
            f.write(f'[agents]\ntoken_file = "{token}"\npoll_interval = 1\ntimeout = 2\nstale_after = 2\n'
                    f'[agents.nodes]\nnode1 = "{url1}"\nnode2 = "{url2}"\n')
        job = h.submit("during-the-flood", 2, "root")  # (also makes the database: the daemon may start later)
        daemon = h.start_daemon()
        host, port = url1.removeprefix("http://").split(":")
        held: list[int] = []
        strangers = [threading.Thread(target=trickle, args=(host, int(port), stop, held), daemon=True)
                     for _ in range(SLOW_CLIENTS)]
        for t in strangers:
            t.start()
        p2.terminate()
        p2.wait(10)
        wait_alive(h, daemon, wait_for, lambda: any(k == "node_stale" and d.get("node") == "node2"
                                                    for k, d in h.events()), 60, "node2's agent stale")
        wait_alive(h, daemon, wait_for, lambda: h.jobs()[job].state == JobState.COMPLETED, 90, "the job COMPLETED")
        time.sleep(3)  # a few more polls of node1 while the strangers hold their connections
        stale = {d.get("node") for k, d in h.events() if k == "node_stale"}
        assert stale == {"node2"}, (stale, h.logs()[-3000:])  # node1's agent answered the daemon throughout
        nodes = {n.name: n for n in slurm.driver().nodes()}
        assert not nodes["node1"].drained and not nodes["node2"].drained, nodes
        assert held, "no stranger could even connect: the flood tested nothing"
        assert h.stop_daemon(daemon) == 0
    finally:
        stop.set()
        for t in strangers:
            t.join(timeout=5)
        stop_agents(agents)
        h.close()
        print(f"--- dl2d logs (tail) ---\n{h.logs()[-4000:]}")
