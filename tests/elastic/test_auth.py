"""Authentication of the elastic runtime's connections: the handshake's math (pure), and
servers that refuse strangers (no secret, a wrong one, a replayed handshake, silence, garbage, a flood) with one
log line each and serve on; clients that find out a fake server; hypothesis over handshake answers."""
from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from testkit.elastic import MALFORMED, raw_frame

from dl2d.elastic import auth as A
from dl2d.elastic import protocol as P

SECRET = "s" * 64
KEYS = A.derive_keys(SECRET)


# -- the math ----------------------------------------------------------------------------------------------
def test_keys_and_proofs_are_bound_to_the_secret_the_side_the_role_and_both_nonces():
    assert KEYS == A.derive_keys(SECRET.encode()) and KEYS[A.CONTROL] != KEYS[A.MEMBER]
    assert A.derive_keys("t" * 64) != KEYS
    sn, cn = b"\1" * 32, b"\2" * 32
    p = A.proof(KEYS[A.MEMBER], "client", A.MEMBER, sn, cn)
    assert len(p) == 64 and p == A.proof(KEYS[A.MEMBER], "client", A.MEMBER, sn, cn)
    others = {A.proof(KEYS[A.MEMBER], "server", A.MEMBER, sn, cn), A.proof(KEYS[A.MEMBER], "client", A.CONTROL, sn, cn),
              A.proof(KEYS[A.MEMBER], "client", A.MEMBER, cn, sn), A.proof(KEYS[A.CONTROL], "client", A.MEMBER, sn, cn),
              A.proof(KEYS[A.MEMBER], "client", A.MEMBER, sn, b"\3" * 32)}
    assert p not in others and len(others) == 5


def test_check_answer_accepts_the_right_proof_only():
    member = A.Credentials.member(KEYS[A.MEMBER])
    sn, cn = b"\1" * 32, b"\2" * 32
    good = A.answer(member, sn, cn)
    assert A.check_answer(good, KEYS, sn) == (A.MEMBER, cn)
    assert A.check_answer(A.answer(A.Credentials.from_secret(SECRET), sn, cn), KEYS, sn) == (A.CONTROL, cn)
    bad = [
        ({**good, "proof": good["proof"][:-1] + "0"}, "wrong proof"),
        ({**good, "proof": 5}, "wrong proof"),
        ({k: v for k, v in good.items() if k != "proof"}, "wrong proof"),
        ({**good, "role": A.CONTROL}, "wrong proof"),  # a member key does not make a control peer
        ({**good, "role": "root"}, "does not accept"),
        ({**good, "nonce": "zz"}, "no nonce"),
        ({**good, "nonce": sn.hex()}, "echoes"),
        ({"op": "PUSH"}, "not AUTH"),
        ({"ok": True}, "not AUTH"),
    ]
    for header, why in bad:
        with pytest.raises(A.AuthError, match=why):
            A.check_answer(header, KEYS, sn)
    with pytest.raises(A.AuthError, match="wrong proof"):  # the same answer to another challenge: a replay
        A.check_answer(good, KEYS, b"\4" * 32)
    with pytest.raises(A.AuthError, match="does not accept"):  # a PS or worker holds no control key
        A.check_answer(A.answer(A.Credentials.from_secret(SECRET), sn, cn), {A.MEMBER: KEYS[A.MEMBER]}, sn)


def test_the_member_key_travels_in_the_environment_and_is_removed_from_it():
    env = {A.MEMBER_KEY_ENV: KEYS[A.MEMBER].hex(), "PATH": "/bin"}
    assert A.member_key_from_env(env) == KEYS[A.MEMBER] and env == {"PATH": "/bin"}
    for bad in ({}, {A.MEMBER_KEY_ENV: "abc"}, {A.MEMBER_KEY_ENV: "g" * 64}):
        with pytest.raises(ValueError, match="no member key"):
            A.member_key_from_env(bad)
    assert "key" not in repr(A.Credentials.from_secret(SECRET)).replace("keys", "")  # never printed


# -- servers and clients -----------------------------------------------------------------------------------
def wait_for_log(caplog, text: str, timeout: float = 5.0) -> logging.LogRecord:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for r in caplog.records:
            if text in r.getMessage():
                return r
        time.sleep(0.01)
    raise AssertionError(f"no log line with {text!r}: {[r.getMessage() for r in caplog.records]}")


@pytest.fixture
def server(caplog, monkeypatch):
    """An authenticating echo server (both keys, like a coordinator); yields (server, requests it handled).
    No connection thread may die with an exception."""
    died: list = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    caplog.set_level(logging.WARNING, logger="dl2d.elastic.protocol")
    handled: list = []

    def handler(h, a, peer):
        handled.append((h.get("op"), peer.role))
        return {"echo": h.get("op"), "role": peer.role}, a
    srv = P.Server(handler, auth=A.Credentials.from_secret(SECRET), with_peer=True).start()
    yield srv, handled
    srv.close()
    assert not died, died


def closed(s: socket.socket) -> bool:
    """The peer closed the connection (a reset when it left bytes of ours unread)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def refused_line(caplog, why: str) -> None:
    record = wait_for_log(caplog, why)
    msg = record.getMessage()
    assert record.levelno == logging.WARNING and record.exc_info is None and "\n" not in msg and len(msg) < 400
    assert "refused the connection from 127.0.0.1:" in msg


def test_a_peer_with_the_secret_is_served_with_its_role(server):
    srv, handled = server
    for creds, role in [(A.Credentials.from_secret(SECRET), "control"), (A.Credentials.member(KEYS["member"]),
                                                                        "member")]:
        c = P.Client(srv.address, auth=creds)
        h, a = c.call("PING", {"v": np.ones(3, np.float32)})
        assert h["role"] == role and a["v"].tolist() == [1, 1, 1]
        assert c.call("PING")[0]["role"] == role  # the connection is kept: one handshake
        c.close()
    assert handled == [("PING", "control")] * 2 + [("PING", "member")] * 2 and srv.refused == 0


@pytest.mark.parametrize("creds, client_error, why", [
    (None, "asks for authentication", "not an authentication frame (header of 110 bytes, payload of 16"),
    (A.Credentials.from_secret("w" * 64), "refused by the peer: authentication failed", "wrong proof for role control"),
    (A.Credentials.member(A.derive_keys("w" * 64)["member"]), "refused by the peer", "wrong proof for role member"),
], ids=["no secret", "wrong secret", "wrong member key"])
def test_a_stranger_is_refused_with_one_line_and_its_request_never_handled(server, caplog, creds, client_error, why):
    srv, handled = server
    c = P.Client(srv.address, timeout=10, auth=creds)
    with pytest.raises(A.AuthError, match=client_error):
        c.call("PUSH", {"g": np.full(4, np.nan, np.float32)}, step=0, worker=0, count=1, blocks=[0])
    c.close()
    refused_line(caplog, why)
    assert handled == [] and srv.refused == 1
    assert P.Client(srv.address, auth=A.Credentials.from_secret(SECRET)).call("PING")[0]["ok"]  # serves on


def handshake_by_hand(addr: str, creds: A.Credentials) -> tuple[socket.socket, bytes]:
    """A handshake done with raw frames: the socket and the bytes of our answer (what a sniffer sees)."""
    s = socket.create_connection(P.parse_addr(addr), timeout=10)
    sn = A.read_challenge(P.recv_handshake(s, time.monotonic() + 10))
    frame = b"".join(bytes(b) for b in P.encode(A.answer(creds, sn, b"\7" * 32)))
    s.sendall(frame)
    return s, frame


def test_a_replayed_handshake_is_refused(server, caplog):
    srv, handled = server
    s, recorded = handshake_by_hand(srv.address, A.Credentials.from_secret(SECRET))
    assert P.recv_handshake(s, time.monotonic() + 10)["ok"] is True
    s.close()
    with socket.create_connection(P.parse_addr(srv.address), timeout=10) as s2:  # a new challenge
        P.recv_handshake(s2, time.monotonic() + 10)
        s2.sendall(recorded + b"".join(bytes(b) for b in P.encode({"op": "SHUTDOWN"})))
        assert P.recv_handshake(s2, time.monotonic() + 10)["ok"] is False
        assert closed(s2)
    refused_line(caplog, "wrong proof for role control (not the job's secret, or a replayed handshake)")
    assert handled == []


def test_a_silent_or_slow_stranger_is_dropped_after_the_handshake_timeout(server, caplog, monkeypatch):
    srv, handled = server
    monkeypatch.setattr(P, "HANDSHAKE_TIMEOUT_S", 0.5)
    frame = raw_frame({"op": "AUTH", "pad": "x" * 500})
    with socket.create_connection(P.parse_addr(srv.address), timeout=10) as s:
        P.recv_handshake(s, time.monotonic() + 10)  # the challenge
        # a byte every 0.05 s, never the whole frame: a timeout per read would never fire in the 25 s the
        # stranger trickles, one deadline for the whole handshake does (at 0.5 s, about 10 bytes in)
        sent = 0
        try:
            for sent in range(1, len(frame)):
                s.sendall(frame[sent - 1:sent])
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed(s)
    assert sent < 200, f"the server read {sent} trickled bytes (10 s of them) without dropping the stranger"
    refused_line(caplog, "no authentication within 0.5 s")
    assert handled == []


@pytest.mark.parametrize("frame, message", MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_frames_before_and_after_authentication_are_one_line_each(server, caplog, frame, message):
    """Every malformed header kind of test_protocol_bounds: as the handshake answer, a refusal (the handshake
    accepts small frames without payload only); after authenticating, the decoder's FrameError. One line, no
    traceback, that connection only."""
    srv, handled = server
    with socket.create_connection(P.parse_addr(srv.address), timeout=10) as s:
        P.recv_handshake(s, time.monotonic() + 10)
        s.sendall(frame)
        try:
            while s.recv(65536):
                pass
        except ConnectionResetError:
            pass
    refused_line(caplog, "refused the connection")
    caplog.clear()
    s, _ = handshake_by_hand(srv.address, A.Credentials.from_secret(SECRET))
    with s:
        assert P.recv_handshake(s, time.monotonic() + 10)["ok"] is True
        s.sendall(frame)
        assert closed(s)
    record = wait_for_log(caplog, message)
    assert record.exc_info is None and "closed the connection from 127.0.0.1:" in record.getMessage()
    assert handled == []
    assert P.Client(srv.address, auth=A.Credentials.from_secret(SECRET)).call("PING")[0]["ok"]


def test_a_flood_of_unauthenticated_connections_holds_no_threads(server, caplog, monkeypatch):
    srv, handled = server
    monkeypatch.setattr(P, "MAX_HANDSHAKES", 2)
    socks = [socket.create_connection(P.parse_addr(srv.address), timeout=10) for _ in range(2)]
    for s in socks:
        P.recv_handshake(s, time.monotonic() + 10)  # both are in the handshake
    with socket.create_connection(P.parse_addr(srv.address), timeout=10) as third:
        assert closed(third)  # closed at once, no challenge
    refused_line(caplog, "2 connections are already authenticating")
    for s in socks:
        s.close()
    deadline = time.monotonic() + 5
    while srv._handshakes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert P.Client(srv.address, auth=A.Credentials.from_secret(SECRET)).call("PING")[0]["ok"]


def test_refusals_are_logged_at_a_bounded_rate(server, caplog, monkeypatch):
    srv, _ = server
    monkeypatch.setattr(P, "MAX_REFUSAL_LINES", 3)
    for _ in range(6):
        c = P.Client(srv.address, timeout=10, auth=A.Credentials.from_secret("w" * 64))
        with pytest.raises(A.AuthError):
            c.call("PING")
    deadline = time.monotonic() + 5
    while srv.refused < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.refused == 6
    assert len([r for r in caplog.records if "refused the connection" in r.getMessage()]) == 3


def test_the_client_finds_out_a_fake_server(monkeypatch):
    """Mutual authentication: a fake coordinator that accepts anyone but cannot prove the key, and a plain
    server that asks nothing, are both an AuthError before the client sends its request."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    got: list = []

    def fake():
        conn, _ = lsock.accept()
        P.send_msg(conn, A.challenge(b"\5" * 32))
        got.append(P.recv_handshake(conn, time.monotonic() + 10))
        P.send_msg(conn, {"ok": True, "proof": "0" * 64})
        got.append(conn.recv(100))  # nothing more comes
        conn.close()
    t = threading.Thread(target=fake)
    t.start()
    c = P.Client(("127.0.0.1", port), timeout=10, auth=A.Credentials.member(KEYS["member"]))
    with pytest.raises(A.AuthError, match="failed to prove that it holds the job's secret"):
        c.call("INC_WORKER", addr="127.0.0.1:1")
    t.join(5)
    lsock.close()
    assert got[0]["op"] == "AUTH" and got[1] == b""  # the request was never sent
    plain = P.Server(lambda h, a: {}).start()
    monkeypatch.setattr(P, "HANDSHAKE_TIMEOUT_S", 0.3)
    with pytest.raises(A.AuthError, match="no authentication handshake within 0.3 s"):
        P.Client(plain.address, auth=A.Credentials.member(KEYS["member"])).call("PING")
    plain.close()


# -- hypothesis: answers to a challenge --------------------------------------------------------------------
_wild = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=70),
                  st.lists(st.integers(), max_size=3), st.sampled_from(["member", "control", "f" * 64, "0" * 64]))


@st.composite
def answers(draw) -> dict:
    sn, cn = b"\1" * 32, draw(st.binary(min_size=32, max_size=32))
    h = A.answer(A.Credentials.member(KEYS["member"]) if draw(st.booleans()) else A.Credentials.from_secret(SECRET),
                 sn, cn)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(["op", "role", "nonce", "proof", "other"]))
        if draw(st.booleans()):
            h.pop(key, None)
        elif key == "proof" and isinstance(h.get("proof"), str) and draw(st.booleans()):
            i = draw(st.integers(0, 63))
            h["proof"] = h["proof"][:i] + draw(st.sampled_from("0123456789abcdefABCDEF\u00e9")) + h["proof"][i + 1:]
        else:
            h[key] = draw(_wild)
    return h


@settings(max_examples=1500, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(header=answers())
def test_mutated_answers_are_refused_cleanly_unless_still_right(header):
    sn = b"\1" * 32
    try:
        role, cn = A.check_answer(header, KEYS, sn)
    except A.AuthError as e:
        assert "\n" not in str(e) and len(str(e)) < 200
        return
    # accepted: only if it still is, field for field, the right answer
    assert header["proof"] == A.proof(KEYS[role], "client", role, sn, cn) and header["op"] == "AUTH"


@settings(max_examples=500, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(st.binary(max_size=300),
                      st.builds(lambda h, cut: (raw_frame(h))[:cut],
                                st.dictionaries(st.sampled_from(["op", "role", "nonce", "proof"]), _wild, max_size=4),
                                st.integers(0, 400)),
                      st.builds(lambda n, p: struct.pack("!4sIQ", P.MAGIC, n, p) + b"{}",
                                st.integers(0, 2 ** 32 - 1), st.sampled_from([0, 1, 2 ** 30, 2 ** 64 - 1]))))
def test_random_bytes_as_a_handshake_frame_end_cleanly(data):
    a, b = socket.socketpair()
    try:
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        try:
            A.check_answer(P.recv_handshake(b, time.monotonic() + 5), KEYS, b"\1" * 32)
            raise AssertionError("accepted")
        except (A.AuthError, P.FrameError, ConnectionError) as e:
            assert "\n" not in str(e)
    finally:
        a.close()
        b.close()


def test_handshake_frames_are_small_json_with_the_documented_fields():
    sn, cn = b"\1" * 32, b"\2" * 32
    ch = b"".join(bytes(x) for x in P.encode(A.challenge(sn)))
    ans = b"".join(bytes(x) for x in P.encode(A.answer(A.Credentials.from_secret(SECRET), sn, cn)))
    assert json.loads(ch[16:]) == {"op": "AUTH_CHALLENGE", "nonce": sn.hex()}
    assert set(json.loads(ans[16:])) == {"op", "role", "nonce", "proof"} and len(ans) < P.MAX_AUTH_HEADER


def test_roles_bind_their_nodes_address_and_get_the_member_key_not_the_secret_file(monkeypatch):
    from dl2d.elastic.cluster import ProcessSpawner, role_env

    monkeypatch.setattr(socket, "gethostbyname", lambda name: "10.1.2.3")
    assert P.node_address("node7") == "10.1.2.3"
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1")  # a Debian /etc/hosts entry
    assert P.node_address("node7") == "0.0.0.0"

    def unresolvable(name):
        raise socket.gaierror("no such host")
    monkeypatch.setattr(socket, "gethostbyname", unresolvable)
    assert P.node_address("node7") == "0.0.0.0"
    env = role_env(1, base={A.SECRET_FILE_ENV: "/x/job.secret", "PATH": "/bin"}, member_key=KEYS["member"])
    assert A.SECRET_FILE_ENV not in env and env[A.MEMBER_KEY_ENV] == KEYS["member"].hex()
    cmd = ProcessSpawner(coord_addr="h:1", bind_host="auto", member_key=KEYS["member"]).command("ps")
    assert "--host" in cmd and cmd[cmd.index("--host") + 1] == "auto"
    assert not any(KEYS["member"].hex() in a or SECRET in a for a in cmd)  # nothing secret on the command line
    with pytest.raises(RuntimeError, match="no member key"):
        ProcessSpawner(coord_addr="h:1").spawn("ps", 1)


def test_dl2_run_takes_the_daemons_secret_file_or_makes_its_own_and_refuses_a_readable_one(tmp_path):
    import subprocess
    import sys

    from dl2d.elastic.launcher import job_secret

    own, path = job_secret(str(tmp_path / "ck"), environ={})
    assert path == str(tmp_path / "ck" / "job.secret") and len(own) == 64
    assert job_secret(str(tmp_path / "ck"), environ={})[0] == own  # kept for the next start
    given = tmp_path / "daemon.secret"
    given.write_text("d" * 64 + "\n")
    given.chmod(0o600)
    assert job_secret(str(tmp_path / "ck"), environ={A.SECRET_FILE_ENV: str(given)}) == ("d" * 64, str(given))
    given.chmod(0o644)
    out = subprocess.run([sys.executable, "-m", "dl2d.elastic.launcher", "--local", "--checkpoint-dir",
                          str(tmp_path / "ck2")], env={"PATH": "/usr/bin:/bin", A.SECRET_FILE_ENV: str(given)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        f"dl2-run: job secret file {given} has mode 0644; it must not be accessible by group or others "
        f"(run: chmod 600 {given})"]


def test_an_idle_connection_is_closed_by_the_server_and_the_client_reconnects_before(server, monkeypatch):
    srv, handled = server
    monkeypatch.setattr(P, "IDLE_TIMEOUT_S", 0.4)
    s, _ = handshake_by_hand(srv.address, A.Credentials.from_secret(SECRET))
    with s:
        assert P.recv_handshake(s, time.monotonic() + 10)["ok"] is True
        t0 = time.monotonic()
        # authenticated, then silent: dropped after its 0.4 s, not at once (8 s: a loaded machine's margin)
        assert closed(s) and 0.3 < time.monotonic() - t0 < 8
    c = P.Client(srv.address, auth=A.Credentials.from_secret(SECRET))
    first = c.call("PING") and c._sock
    time.sleep(0.3)  # past half the bound: the client opens a new connection rather than risk a dropped one
    assert c.call("PING")[0]["ok"] and c._sock is not first
    c.close()
    assert len(handled) == 2
