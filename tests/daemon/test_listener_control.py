"""The control socket under floods of slow local clients (real Unix sockets): one deadline for the whole request,
at most MAX_PER_UID connections per uid, the reserved slots that only root and the daemon's uid may take, and
a uid over its fair share yielding to a lighter one. The admission rule itself is pure and tested by uid; the
floods run as `nobody` (and the `daemon` account) through setpriv, as tests/daemon/test_control_socket.py runs
its clients, while root asks."""
from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import dl2d.daemon.control as control
from dl2d.core.listener import Decision, Held, decide
from dl2d.daemon.control import ControlServer, ask, control_limits, privileged_uid
from dl2d.db.engine import make_engine, upgrade

ROOT, NOBODY, OTHER = 0, 65534, 1000

#: A stdlib-only flooder, run as another user: N connections that each send the start of a request and then
#: one byte every half second, never the newline; it reports what each heard and stops after at most FOR_S.
FLOODER = r"""
import json, select, socket, sys, time
path, n, for_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
socks = {}
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    try:
        s.sendall(b'{"op": ')
    except OSError:  # refused and closed at once: its "busy" line is waiting unread
        pass
    socks[s] = time.monotonic()
print("ready", flush=True)
out, end, nxt = [], time.monotonic() + for_s, time.monotonic() + 0.5
while socks and time.monotonic() < end:
    for s in select.select(list(socks), [], [], 0.05)[0]:
        try:
            line = s.recv(4096).decode(errors="replace").strip()
        except OSError:
            line = ""
        out.append([line[:120], round(time.monotonic() - socks.pop(s), 3)])
        s.close()
    if time.monotonic() >= nxt:
        nxt += 0.5
        for s in list(socks):
            try:
                s.send(b" ")
            except OSError:  # the server closed it just now: its answer may be waiting unread
                s.setblocking(False)
                try:
                    line = s.recv(4096).decode(errors="replace").strip()
                except OSError:
                    line = ""
                out.append([line[:120], round(time.monotonic() - socks.pop(s), 3)])
                s.close()
out += [["open", 0.0] for _ in socks]
print(json.dumps(out), flush=True)
"""

#: A stdlib-only client: one whoami, tried again while the daemon says busy (what dl2ctl's ask does).
WHOAMI = r"""
import json, socket, sys, time
for attempt in range(40):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(sys.argv[1])
    s.sendall(b'{"op": "whoami"}\n')
    reply = json.loads(s.makefile("rb").readline())
    s.close()
    if not reply.get("busy"):
        break
    time.sleep(0.1)
print(json.dumps({"reply": reply, "attempts": attempt + 1}), flush=True)
"""


# ---------------------------------------------------------------------------------------------- the rule

def held_by(*uids: int, pending: bool = True, since: float = 9.9) -> list[Held]:
    return [Held(u, privileged_uid(u, 999), pending, since) for u in uids]


def test_root_and_the_daemons_uid_are_privileged_and_others_are_not():
    assert privileged_uid(0, 999) and privileged_uid(999, 999)
    assert not privileged_uid(NOBODY, 999) and not privileged_uid(OTHER, 999)
    lim = control_limits()
    assert (lim.total, lim.per_peer, lim.reserved) == (control.MAX_CONNECTIONS, control.MAX_PER_UID,
                                                       control.RESERVED_SLOTS)


def test_a_uid_gets_its_share_and_root_a_reserved_slot_whoever_floods():
    lim = control_limits()
    share = lim.per_peer
    # nobody at its share: its next connection is refused (they are all young), another uid's is not
    nobody = held_by(*[NOBODY] * share)
    assert decide(nobody, NOBODY, False, 10.0, lim) == Decision(False, refusal="peer")
    assert decide(nobody, OTHER, False, 10.0, lim) == Decision(True)
    # strangers fill every slot they may take (total - reserved), from several uids at their shares
    room = lim.total - lim.reserved
    strangers = held_by(*[2000 + i // share for i in range(room)])
    assert len(strangers) == room and max(sum(h.peer == u for h in strangers) for u in range(2000, 2010)) == share
    assert decide(strangers, OTHER, False, 10.0, lim).admit  # a lighter uid: a heavy one yields its oldest
    assert decide(strangers, ROOT, True, 10.0, lim) == Decision(True)  # the reserved slots
    assert decide(strangers, 999, True, 10.0, lim) == Decision(True)  # (the daemon's own uid)
    # even with every slot held, root takes the place of a stranger that has not sent its request
    full = strangers + held_by(*[ROOT] * lim.reserved, pending=False)
    assert decide(full, ROOT, True, 10.0, lim).victim is not None
    assert decide(full, OTHER, False, 10.0, lim) == Decision(False, refusal="full")


# ---------------------------------------------------------------------------------------------- the socket

def _as_users_available() -> str:
    import pwd

    for user in ("nobody", "daemon"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            pytest.skip(f"needs the user {user}")
    if os.geteuid() != 0:
        pytest.skip("needs root, to act as other users")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if not python or not shutil.which("setpriv"):
        pytest.skip("needs setpriv and a system python3 that other users may run")
    return python


def _as(user: str, group: str, python: str, script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(["setpriv", f"--reuid={user}", f"--regid={group}", "--clear-groups", python, "-c", script,
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/", env={})


@pytest.fixture
def shared_dir():
    """A directory other users may enter (pytest's tmp_path is root's alone), removed afterwards."""
    d = tempfile.mkdtemp(prefix="dl2d-ctl-")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def engine(tmp_path):
    url = f"sqlite:///{tmp_path / 'dl2d.sqlite'}"
    upgrade(url)
    e = make_engine(url)
    yield e
    e.dispose()


def test_root_is_answered_at_once_while_nobody_fills_the_strangers_pool_and_a_lighter_uid_gets_in(
        shared_dir, engine, monkeypatch):
    python = _as_users_available()
    # a small pool, so one uid's share fills all that strangers may take: 12 slots, 4 of them reserved
    monkeypatch.setattr(control, "MAX_CONNECTIONS", 12)
    monkeypatch.setattr(control, "RESERVED_SLOTS", 4)
    monkeypatch.setattr(control, "READ_TIMEOUT_S", 3.0)  # shortened for the test (10 s in the daemon)
    path = str(shared_dir / "c.sock")
    before = threading.active_count()
    srv = ControlServer(path, engine, "dl2d-admin")
    srv.start()
    flood = _as("nobody", "nogroup", python, FLOODER, path, "40", "15")
    try:
        assert flood.stdout.readline().strip() == "ready", flood.stderr.read()
        lim = srv._server.limiter
        end = time.monotonic() + 10
        while lim.in_use < control.MAX_PER_UID and time.monotonic() < end:
            time.sleep(0.02)
        assert lim.in_use == control.MAX_PER_UID == 12 - 4  # nobody holds every slot a stranger may take
        during = threading.active_count()
        t0 = time.monotonic()
        assert ask(path, {"op": "whoami"}) == {"ok": True, "user": "root", "uid": 0, "admin": True}
        root_s = time.monotonic() - t0
        assert lim.replaced == 0  # a reserved slot: no stranger had to give way
        # another uid, with nothing held: nobody holds more than its fair share and yields its oldest
        other = _as("daemon", "daemon", python, WHOAMI, path)
        got = json.loads(other.communicate(timeout=60)[0])
        assert got["reply"]["ok"] and got["reply"]["uid"] == 1, got
        assert lim.replaced >= 1
        out, err = flood.communicate(timeout=60)
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.communicate()
        srv.close()
    heard = json.loads(out)
    busy = [d for line, d in heard if '"busy": true' in line]
    timed_out = [d for line, d in heard if "no request within the read timeout" in line]
    assert len(heard) == 40 and not [h for h in heard if h[0] == "open"], heard
    # the rest gave their place to a newcomer (their reads were shut: closed without the deadline's answer, or
    # with another error line), as many as the limiter counts replaced
    rest = [h for h in heard if '"busy": true' not in h[0] and "no request within the read timeout" not in h[0]]
    assert len(busy) >= 40 - control.MAX_PER_UID - lim.replaced and len(rest) <= lim.replaced, (heard, lim.replaced)
    # the ones held sent a byte every half second and were dropped by the 3 s deadline all the same
    assert sum(d >= 3.0 - 0.3 for d in timed_out) >= 1 and max(timed_out) < 15
    assert during <= before + 2 + 12  # the server's threads: at most its slots (here 12), and its own
    end = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < end:
        time.sleep(0.05)
    print(f"\ncontrol: nobody 40 connections ({len(busy)} busy at once, {len(timed_out)} held until the "
          f"deadline or replaced); root answered in {root_s * 1000:.0f} ms; uid 1 answered after "
          f"{got['attempts']} tries; threads {before} before, {during} during, {threading.active_count()} after")


def test_40_slow_clients_of_roots_own_uid_leave_root_a_way_in(shared_dir, engine, monkeypatch):
    """Root floods itself (as a test running as root does): its share of MAX_PER_UID is held, the rest are
    told busy; a real request of root's waits out the one-second grace (ask tries again meanwhile) and takes
    the place of the oldest slow one."""
    monkeypatch.setattr(control, "READ_TIMEOUT_S", 4.0)
    path = str(shared_dir / "c.sock")
    before = threading.active_count()
    srv = ControlServer(path, engine, "dl2d-admin")
    srv.start()
    stop = threading.Event()
    socks = []
    try:
        for _ in range(40):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            try:
                s.sendall(b'{"op": ')
            except OSError:  # refused and closed at once: its "busy" line is waiting unread
                pass
            socks.append(s)

        def trickle() -> None:
            for _ in range(30):  # at most 15 s
                if stop.wait(0.5):
                    return
                for s in socks:
                    try:
                        s.send(b" ")
                    except OSError:
                        pass
        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        time.sleep(0.2)
        during = threading.active_count()
        t0 = time.monotonic()
        assert ask(path, {"op": "whoami"})["uid"] == (os.geteuid())
        ask_s = time.monotonic() - t0
        lim = srv._server.limiter
        assert lim.replaced >= 1 and lim.in_use <= control.MAX_PER_UID
        replies = []
        for s in socks:
            s.settimeout(15)
            replies.append(json.loads(s.makefile("rb").readline()))
    finally:
        stop.set()
        for s in socks:
            s.close()
        srv.close()
    busy = sum(bool(r.get("busy")) for r in replies)
    assert busy >= 40 - control.MAX_PER_UID - lim.replaced
    assert all(r.get("busy") or r["error"] == "no request within the read timeout" for r in replies), replies
    assert during <= before + 2 + control.MAX_PER_UID
    print(f"\ncontrol: root's own 40 slow connections ({busy} busy at once); root's request answered in "
          f"{ask_s:.2f} s; threads {before} before, {during} during")


def test_a_stalled_reader_is_not_a_deadline_escape(shared_dir, engine, monkeypatch):
    """A request sent a byte every 0.2 s never waits out a per-read timeout of 1 s; the 1 s deadline for the
    whole request ends it all the same."""
    monkeypatch.setattr(control, "READ_TIMEOUT_S", 1.0)
    path = str(shared_dir / "c.sock")
    srv = ControlServer(path, engine, "dl2d-admin")
    srv.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(path)
            t0 = time.monotonic()
            reply = b""
            for ch in b'{"op": "whoami"' * 10:  # at most 150 bytes, 30 s
                if select.select([c], [], [], 0.2)[0]:
                    reply = c.recv(4096)
                    break
                c.send(bytes([ch]))
            took = time.monotonic() - t0
        assert json.loads(reply) == {"ok": False, "error": "no request within the read timeout"}
        assert 0.9 <= took < 10  # at the deadline, not at the end of the trickle (generous upper bound)
    finally:
        srv.close()
