"""Idle strangers against an elastic server and a running job's coordinator (real sockets on 127.0.0.1): 64
connections that take the challenge and never answer it no longer make the daemon's authenticated requests
fail. One address holds at most MAX_HANDSHAKES_PER_PEER of the strangers' pool (the rest are closed at once, no
thread, no challenge); a new connection takes the place of one idle past its grace; authenticated connections
are not counted in the pool; the idle ones are dropped at the handshake's deadline, however they trickle."""
from __future__ import annotations

import select
import socket
import threading
import time

import pytest
from testkit.elastic import long_cfg

from dl2d.elastic import auth as A
from dl2d.elastic import control
from dl2d.elastic import protocol as P

SECRET = "s" * 64
DEADLINE = 3.0  # HANDSHAKE_TIMEOUT_S for these tests (10 s in the runtime)


class Idle:
    """``n`` strangers held by one thread: each connects, then sends one byte every half second (never a whole
    handshake frame); ``closed`` gets the seconds from connect to the server's close. Stops by itself after
    ``for_s``."""

    def __init__(self, addr: str, n: int, for_s: float = 20.0) -> None:
        self.socks = {socket.create_connection(P.parse_addr(addr), timeout=5): time.monotonic() for _ in range(n)}
        self.closed: list[float] = []
        self.threads_seen: list[int] = []
        self._stop = threading.Event()
        self._for_s = for_s
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        end, nxt = time.monotonic() + self._for_s, time.monotonic() + 0.5
        while self.socks and time.monotonic() < end and not self._stop.is_set():
            for s in select.select(list(self.socks), [], [], 0.05)[0]:
                try:
                    while s.recv(4096):  # the challenge, then the close
                        if not select.select([s], [], [], 0)[0]:
                            break
                    else:
                        self.closed.append(time.monotonic() - self.socks.pop(s))
                        s.close()
                except OSError:
                    self.closed.append(time.monotonic() - self.socks.pop(s))
                    s.close()
            self.threads_seen.append(threading.active_count())
            if time.monotonic() >= nxt:
                nxt += 0.5
                for s in list(self.socks):
                    try:
                        s.send(b"D")
                    except OSError:
                        pass

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(30)
        for s in self.socks:
            s.close()


@pytest.fixture
def short_handshake(monkeypatch):
    monkeypatch.setattr(P, "HANDSHAKE_TIMEOUT_S", DEADLINE)


def test_64_idle_strangers_do_not_fail_one_authenticated_control_request(short_handshake):
    before = threading.active_count()
    srv = P.Server(lambda h, a, peer: {"role": peer.role}, auth=A.Credentials.from_secret(SECRET),
                   with_peer=True).start()
    idle = Idle(srv.address, 64)
    try:
        time.sleep(0.3)
        assert srv._handshakes <= P.MAX_HANDSHAKES_PER_PEER  # one address's share; the rest were closed
        answered, took = 0, []
        for _ in range(6):  # each a new connection and handshake, as the daemon's control calls are
            t0 = time.monotonic()
            c = P.Client(srv.address, timeout=10, auth=A.Credentials.from_secret(SECRET))
            try:
                answered += c.call("STATUS")[0]["role"] == "control"
            finally:
                c.close()
            took.append(time.monotonic() - t0)
        assert answered == 6
        during = max(idle.threads_seen + [threading.active_count()])
        end = time.monotonic() + 4 * DEADLINE
        while idle.socks and time.monotonic() < end:
            time.sleep(0.05)
        assert not idle.socks, "a trickling stranger outlived the handshake's deadline"
    finally:
        idle.stop()
        srv.close()
    # closed at once (over the share, or replaced) or at the deadline, never later; some lasted to it
    assert len(idle.closed) == 64 and max(idle.closed) < 4 * DEADLINE
    assert sum(d >= DEADLINE - 0.3 for d in idle.closed) >= 1
    lim = srv._strangers
    assert lim.refused >= 64 - P.MAX_HANDSHAKES_PER_PEER - lim.replaced
    # threads: the address's share of handshakes (and replaced ones ending) beside the accept thread and the
    # idle clients' one thread; never one per stranger
    assert during <= before + 2 + 2 * P.MAX_HANDSHAKES_PER_PEER, (before, during)
    end = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < end:
        time.sleep(0.05)
    after = threading.active_count()
    assert after <= before
    print(f"\nelastic server: 64 idle strangers ({lim.refused} closed at once, {lim.replaced} replaced); 6 of 6 "
          f"control requests answered, in {min(took):.2f}-{max(took):.2f} s; threads {before} before, {during} "
          f"during, {after} after")


def test_the_daemons_calls_to_a_running_job_succeed_while_64_strangers_sit_on_its_coordinator(make_cluster,
                                                                                              short_handshake):
    cfg = long_cfg(epochs=400)  # trains for longer than the test lasts
    c = make_cluster(cfg, 1, 1)
    deadline = time.monotonic() + 60
    while c.coord.version < 5:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    idle = Idle(c.coord.address, 64)
    try:
        time.sleep(0.3)
        results = []
        for _ in range(6):
            t0 = time.monotonic()
            st = control.status(c.coord.address, secret=c.coord.secret)
            results.append((st["state"], time.monotonic() - t0))
        assert len(results) == 6 and all(s in ("running", "scaling") for s, _ in results), results
        # the job's own roles reconnect and train on meanwhile
        v = c.coord.version
        end = time.monotonic() + 30
        while c.coord.version <= v and time.monotonic() < end:
            time.sleep(0.01)
        assert c.coord.version > v
    finally:
        idle.stop()
    print(f"\ncoordinator: 64 idle strangers; 6 of 6 STATUS with the job's secret answered in "
          f"{min(t for _, t in results):.2f}-{max(t for _, t in results):.2f} s")


def test_a_client_turned_away_by_a_full_pool_tries_again(short_handshake, monkeypatch):
    """Over its address's share (here 2), a connection is closed before the challenge; the client with the
    secret tries again and gets in once the idle ones have had their grace, within the handshake's time."""
    monkeypatch.setattr(P, "MAX_HANDSHAKES_PER_PEER", 2)
    srv = P.Server(lambda h, a: {}, auth=A.Credentials.from_secret(SECRET)).start()
    idle = Idle(srv.address, 2)
    try:
        c = P.Client(srv.address, timeout=10, auth=A.Credentials.from_secret(SECRET))
        assert c.call("PING")[0]["ok"]
        c.close()
        assert srv.refused >= 1 or srv._strangers.replaced >= 1
    finally:
        idle.stop()
        srv.close()
