"""Poller against in-process servers, and the stale/recover state machine."""

from __future__ import annotations

import socket
import threading

import pytest

from dl2d.agents.nvml import FakeNVML, GPUReader
from dl2d.agents.sample import Sampler
from dl2d.agents.server import make_server
from dl2d.daemon.poller import Poller, StaleTracker, Transition


def test_stale_tracker_after_k_misses_and_recovery():
    t = StaleTracker(3)
    assert t.observe("a", False, "timeout") is None
    assert t.observe("a", False, "timeout") is None
    tr = t.observe("a", False, "Connection refused")
    assert tr == Transition("a", "stale", "dl2d: agent silent for 3 polls (Connection refused)")
    t.commit(tr)
    assert t.observe("a", False) is None  # reported once
    assert t.observe("a", True) == Transition("a", "recovered")
    t.commit(Transition("a", "recovered"))
    assert t.stale == set() and t.misses["a"] == 0


def test_a_success_resets_the_miss_count():
    t = StaleTracker(2)
    for ok in (False, True, False, True, False):
        assert t.observe("a", ok) is None
    with pytest.raises(ValueError):
        StaleTracker(0)


def serve(node, token):
    srv = make_server("127.0.0.1", 0, token, Sampler(node, GPUReader(FakeNVML.h100s(1)), None).sample_json)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return srv


@pytest.fixture
def silent_port():
    """A socket that accepts connections but never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_round_mixes_good_timeout_refused_and_misnamed(token, silent_port):
    good, other = serve("good", token), serve("other", token)
    try:
        p = Poller([("good", f"http://127.0.0.1:{good.server_address[1]}"),
                    ("slow", f"http://127.0.0.1:{silent_port}"),
                    *[(f"slow{i}", f"http://127.0.0.1:{silent_port}") for i in range(7)],
                    ("dead", f"127.0.0.1:{closed_port()}"),
                    ("misnamed", f"http://127.0.0.1:{other.server_address[1]}/")],
                   token, timeout=0.5, stale_after=1)
        r = p.poll_round()
        assert set(r.samples) == {"good"} and r.samples["good"]["gpu_count"] == 1
        assert r.errors["slow"] == "timeout"
        assert "refused" in r.errors["dead"].lower()
        assert r.errors["misnamed"] == "agent reports node 'other'"
        slow = {"slow", *(f"slow{i}" for i in range(7))}
        assert all(r.errors[n] == "timeout" for n in slow)
        # concurrent: 8 silent agents cost one timeout (0.5 s), not their sum (4 s); the margin is a loaded machine's
        assert r.wall_s < 3.5
        assert {t.node for t in r.transitions} == slow | {"dead", "misnamed"}
        assert p.stale_nodes == slow | {"dead", "misnamed"}
    finally:
        for s in (good, other):
            s.shutdown()
            s.server_close()


def test_wrong_token_is_a_miss(token):
    srv = serve("n1", token)
    try:
        p = Poller([("n1", f"http://127.0.0.1:{srv.server_address[1]}")], "not-the-token", timeout=2)
        assert p.poll_round().errors == {"n1": "HTTP 401 unauthorized (token mismatch)"}
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_failed_stale_callback_is_retried_next_round():
    calls = []

    def record(node, reason):
        calls.append(node)
        if len(calls) == 1:
            raise RuntimeError("database locked")

    p = Poller([("x", f"http://127.0.0.1:{closed_port()}")], "t", timeout=0.5,
               stale_after=1, on_stale=record)
    r1 = p.poll_round()
    assert r1.transitions == [] and [t.kind for t in r1.failed_transitions] == ["stale"]
    assert p.stale_nodes == set()
    r2 = p.poll_round()
    assert [t.kind for t in r2.transitions] == ["stale"] and p.stale_nodes == {"x"}
    assert calls == ["x", "x"]


def test_removed_targets_are_forgotten():
    p = Poller([("x", f"http://127.0.0.1:{closed_port()}")], "t", timeout=0.5, stale_after=1)
    p.poll_round()
    assert p.stale_nodes == {"x"}
    p.set_targets([])
    assert p.stale_nodes == set() and p.poll_round().results == []


def test_bad_url_rejected():
    with pytest.raises(ValueError):
        Poller([("x", "https://host:1")], "t")
