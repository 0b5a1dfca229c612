"""Token file checks and the HTTP endpoint, in-process."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from dl2d.agents.nvml import FakeNVML, GPUReader
from dl2d.agents.sample import Sampler
from dl2d.agents.server import TokenFileError, check_bearer, load_token, make_server


def test_load_token_ok(token_file, token):
    assert load_token(token_file) == token


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_load_token_refuses_group_or_other_access(token_file, mode):
    import os
    os.chmod(token_file, mode)
    with pytest.raises(TokenFileError, match=r"must not be accessible by group or others.*chmod 600"):
        load_token(token_file)


def test_load_token_missing_or_empty(tmp_path):
    with pytest.raises(TokenFileError, match="cannot read"):
        load_token(str(tmp_path / "nope"))
    p = tmp_path / "t"
    p.write_text("  \n")
    p.chmod(0o600)
    with pytest.raises(TokenFileError, match="empty"):
        load_token(str(p))


def test_check_bearer(token):
    TOKEN = token
    assert check_bearer(f"Bearer {TOKEN}", TOKEN)
    assert not check_bearer(None, TOKEN)
    assert not check_bearer(TOKEN, TOKEN)
    assert not check_bearer("Bearer wrong", TOKEN)
    assert not check_bearer(f"Basic {TOKEN}", TOKEN)


@pytest.fixture
def server(token):
    sampler = Sampler("n1", GPUReader(FakeNVML.h100s(2)), host=None)
    srv = make_server("127.0.0.1", 0, token, sampler.sample_json)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def get(url, token=None):
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_stats_needs_the_token(server, token):
    assert get(server + "/v1/stats") == (401, {"error": "unauthorized"})
    assert get(server + "/v1/stats", "wrong")[0] == 401
    code, body = get(server + "/v1/stats", token)
    assert code == 200 and body["node"] == "n1" and body["gpu_count"] == 2
    assert body["schema"] == 1 and body["host"] is None


def test_healthz_and_404(server, token):
    assert get(server + "/healthz") == (200, {"ok": True})
    assert get(server + "/v1/other", token)[0] == 404


def test_a_short_token_is_refused(tmp_path):
    p = tmp_path / "tok"
    p.write_text("abc123\n")
    p.chmod(0o600)
    with pytest.raises(TokenFileError, match="6-character token; use at least 16"):
        load_token(str(p))


def test_stalled_and_excess_connections_do_not_hold_the_agent(token):
    """Issue #14, item 8: a client that connects and sends nothing is dropped after the request timeout, and
    connections beyond the limit are answered 503 and closed at once; the agent keeps answering."""
    import socket
    import threading
    import time
    import urllib.request

    srv = make_server("127.0.0.1", 0, token, lambda: b"{}", timeout=0.5, max_connections=4)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    host, port = srv.server_address
    try:
        stalled = [socket.create_connection((host, port), timeout=5) for _ in range(4)]
        time.sleep(0.1)
        extra = socket.create_connection((host, port), timeout=5)
        refusal = b""
        while chunk := extra.recv(1024):  # over the limit (the others are younger than the grace): 503, closed
            refusal += chunk
        assert refusal.startswith(b"HTTP/1.1 503 "), refusal
        extra.close()
        for s in stalled:  # dropped by the server after its 0.5 s timeout; one it kept raises at its own 5 s
            assert s.recv(1) == b""
            s.close()
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        srv.shutdown()
        srv.server_close()
