"""The frame decoder's bounds and checks: every malformed frame is a
FrameError (a ProtocolError) that a server logs in one line, closing that connection only; payloads are bounded
and a declared one pins no memory before its bytes arrive; a frame that stalls midway is dropped; valid frames
keep their wire format. (These servers do not authenticate; test_auth.py sends the same frames to ones that do.)"""
from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time

import numpy as np
import pytest
from testkit.elastic import GOOD_SPEC, MALFORMED, raw_frame

from dl2d.elastic import protocol as P


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status")


@pytest.fixture
def server(caplog, monkeypatch):
    """An echo server; yields (server, thread exceptions). No connection thread may die with an exception."""
    died: list = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    caplog.set_level(logging.WARNING, logger="dl2d.elastic.protocol")
    srv = P.Server(lambda h, a: ({"echo": h.get("op")}, a)).start()
    yield srv, died
    srv.close()
    assert not died, died


def send_raw(srv: P.Server, data: bytes, timeout: float = 10.0) -> bytes:
    """Send bytes to the server and read until it closes the connection (what it answered, if anything)."""
    host, port = P.parse_addr(srv.address)
    got = b""
    with socket.create_connection((host, port), timeout=timeout) as s:
        try:
            s.sendall(data)
            while chunk := s.recv(65536):
                got += chunk
        except ConnectionResetError:  # closed with bytes of ours unread: the server did not read the rest
            pass
    return got


def wait_for_log(caplog, text: str, timeout: float = 5.0) -> logging.LogRecord:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for r in caplog.records:
            if text in r.getMessage():
                return r
        time.sleep(0.01)
    raise AssertionError(f"no log line with {text!r}: {[r.getMessage() for r in caplog.records]}")




@pytest.mark.parametrize("frame, message", MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_frames_are_one_log_line_and_close_only_that_connection(server, caplog, frame, message):
    srv, died = server
    assert send_raw(srv, frame) == b""  # no reply: the connection is closed
    record = wait_for_log(caplog, message)
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "\n" not in record.getMessage() and len(record.getMessage()) < 400
    assert "closed the connection from 127.0.0.1:" in record.getMessage()
    c = P.Client(srv.address)  # the server serves on
    h, a = c.call("PING", {"v": np.ones(3, np.float32)})
    assert h["echo"] == "PING" and a["v"].tolist() == [1, 1, 1]
    c.close()
    assert not died


def test_a_declared_payload_pins_no_memory_before_it_arrives_and_a_stalled_frame_is_dropped(server, caplog,
                                                                                           monkeypatch):
    """The issue's probe: a frame declaring a 1 GiB payload, then silence. The buffer's pages are committed only
    as bytes arrive, and FRAME_STALL_S later the connection is closed."""
    srv, _ = server
    monkeypatch.setattr(P, "FRAME_STALL_S", 0.5)
    n = P.MAX_PAYLOAD // 4
    frame = raw_frame({"op": "PUSH", "arrays": [{**GOOD_SPEC, "shape": [n]}]}, plen=n * 4)
    host, port = P.parse_addr(srv.address)
    before = rss_mb()
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(frame + b"\0" * 2 ** 20)  # the header and 1 MiB of the 1 GiB, then nothing
        time.sleep(0.2)
        held = rss_mb() - before
        assert held < 64, f"the server holds {held:.0f} MB for 1 MiB received"
        t0 = time.monotonic()
        assert s.recv(1) == b""  # closed by the server
        assert time.monotonic() - t0 < 5
    record = wait_for_log(caplog, "peer stalled: no bytes for 0.5 s in the middle of a frame")
    assert record.exc_info is None


def test_an_idle_connection_between_frames_is_not_a_stall(server, monkeypatch):
    srv, _ = server
    monkeypatch.setattr(P, "FRAME_STALL_S", 0.2)
    c = P.Client(srv.address)
    assert c.call("PING")[0]["echo"] == "PING"
    time.sleep(0.5)  # longer than the stall bound, but between frames
    assert c.call("PING")[0]["echo"] == "PING"
    c.close()


def test_the_client_gets_a_protocol_error_for_a_garbage_reply():
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]

    def garbage():
        conn, _ = lsock.accept()
        P.recv_msg(conn)
        conn.sendall(raw_frame({"ok": True, "arrays": [{**GOOD_SPEC, "shape": ["x"]}]}))
        conn.close()

    t = threading.Thread(target=garbage)
    t.start()
    c = P.Client(("127.0.0.1", port), timeout=10)
    with pytest.raises(P.FrameError, match=r"arrays\[0\].shape has a dimension that is not an integer"):
        c.call("PING")
    t.join(5)
    lsock.close()
    c.close()


def test_encode_refuses_what_the_decoder_would_and_a_server_says_so_instead_of_dying(server, monkeypatch):
    _, died = server
    monkeypatch.setattr(P, "MAX_PAYLOAD", 1024)
    with pytest.raises(P.ProtocolError, match="payload too large"):
        P.encode({"op": "X"}, {"a": np.zeros(512, np.float32)})
    big = P.Server(lambda h, a: ({}, {"a": np.zeros(512, np.float32)} if h["op"] == "BIG" else None)).start()
    c = P.Client(big.address)
    with pytest.raises(P.RemoteError, match="reply not sent: ProtocolError: payload too large"):
        c.call("BIG")  # the reply (2 KB) exceeds the bound: an error reply instead, and the thread lives
    assert c.call("SMALL")[0]["ok"]
    c.close()
    big.close()
    assert not died


def test_valid_frames_keep_their_wire_format():
    x = np.array([1.0, -2.5], np.float32)
    frame = b"".join(bytes(b) for b in P.encode({"op": "PUSH", "step": 3}, {"g": x}))
    hb = b'{"op":"PUSH","step":3,"arrays":[{"name":"g","dtype":"float32","shape":[2]}]}'
    assert frame == struct.pack("!4sIQ", b"DL2E", len(hb), 8) + hb + x.astype("<f4").tobytes()
    h, a = P.decode(hb, x.tobytes())
    assert h == {"op": "PUSH", "step": 3} and a["g"].tolist() == [1.0, -2.5]


@pytest.mark.parametrize("header, payload_len, message", [
    ({"op": "X", "arrays": [GOOD_SPEC]}, 4, "payload shorter"),
    ({"op": "X"}, P.MAX_PAYLOAD + 1, "payload of"),
    ({"ok": 1}, 0, "'ok' must be true or false"),
    ({"op": ""}, 0, "'op' must be a string of 1 to 64"),
    ({"op": "X", "arrays": [{**GOOD_SPEC, "name": ""}]}, 8, "name must be a string of 1 to 256"),
])
def test_parse_header_names_the_field(header, payload_len, message):
    with pytest.raises(P.FrameError, match=message):
        P.parse_header(json.dumps(header).encode(), payload_len)


def test_parse_header_accepts_replies_and_requests_and_strips_the_array_list():
    h, specs = P.parse_header(b'{"ok":false,"error":"no"}', 0)
    assert h == {"ok": False, "error": "no"} and specs == []
    h, specs = P.parse_header(json.dumps({"op": "X", "arrays": [{**GOOD_SPEC, "shape": [2, 3]}]}).encode(), 24)
    assert h == {"op": "X"} and specs == [("a", (2, 3), 6)]
