"""The node agent under a flood of slow strangers (real sockets on 127.0.0.1): clients that trickle a header
line every half second never wait out a per-read timeout, yet hold no slot past the whole-request deadline;
those over the per-address share are answered 503 by the accepting thread; and the daemon's authenticated
poll is answered meanwhile, taking the place of a stranger that has not finished its request."""
from __future__ import annotations

import json
import select
import socket
import threading
import time
import urllib.request

from dl2d.agents.nvml import FakeNVML, GPUReader
from dl2d.agents.sample import Sampler
from dl2d.agents.server import MAX_CONNECTIONS, MAX_PER_PEER, make_server
from dl2d.daemon.poller import Poller

#: The whole-request deadline of the agent under test (5 s by default; shorter to keep the test short).
DEADLINE = 3.0


def trickle(port: int, n: int, every: float, for_s: float, out: list, ready: threading.Event,
            threads_seen: list) -> None:
    """``n`` strangers of one thread: each connects, sends a request line, then one header line every
    ``every`` seconds (never the blank line that ends a request); ``out`` gets (first bytes the server sent,
    seconds from connect to close) of each, ``"open"`` for those still open after ``for_s`` (the loop always
    stops by then). ``threads_seen`` samples the process's thread count meanwhile."""
    socks: dict[socket.socket, float] = {}
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /v1/stats HTTP/1.1\r\n")
        socks[s] = time.monotonic()
    ready.set()
    end = time.monotonic() + for_s
    next_send = time.monotonic() + every
    k = 0
    while socks and time.monotonic() < end:
        readable, _, _ = select.select(list(socks), [], [], 0.05)
        for s in readable:
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            out.append((data[:20], time.monotonic() - socks.pop(s)))
            s.close()
        threads_seen.append(threading.active_count())
        if time.monotonic() >= next_send:
            k += 1
            for s in list(socks):
                try:
                    s.send(b"X-Slow-%d: x\r\n" % k)
                except OSError:
                    out.append((b"", time.monotonic() - socks.pop(s)))
                    s.close()
            next_send += every
    for s, t0 in socks.items():
        out.append(("open", time.monotonic() - t0))
        s.close()


def test_the_daemons_poll_is_answered_while_40_strangers_trickle_and_they_are_dropped_by_the_deadline(token):
    before = threading.active_count()
    sampler = Sampler("n1", GPUReader(FakeNVML.h100s(2)), host=None)
    srv = make_server("127.0.0.1", 0, token, sampler.sample_json, timeout=DEADLINE)
    serving = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    serving.start()
    port = srv.server_address[1]
    out: list = []
    threads_seen: list[int] = []
    ready = threading.Event()
    flood = threading.Thread(target=trickle, args=(port, 40, 0.5, 4 * DEADLINE, out, ready, threads_seen),
                             daemon=True)
    try:
        flood.start()
        assert ready.wait(30)
        # the daemon's poll, at once: turned away (503) while the strangers are within their grace, then it
        # takes the place of the oldest one; the poller's timeout (generous: 5 s) covers the tries
        t0 = time.monotonic()
        rnd = Poller([("n1", f"http://127.0.0.1:{port}")], token, timeout=5.0, stale_after=1).poll_round()
        poll_s = time.monotonic() - t0
        assert rnd.errors == {} and rnd.samples["n1"]["gpu_count"] == 2, rnd.errors
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/stats", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=5) as r:  # and again, by another client, while they trickle
            assert r.status == 200 and json.loads(r.read())["node"] == "n1"
        during = max(threads_seen + [threading.active_count()])
        flood.join(4 * DEADLINE + 30)
        assert not flood.is_alive()
    finally:
        srv.shutdown()
        srv.server_close()
    assert len(out) == 40 and not any(kind == "open" for kind, _ in out), out  # none outlived the deadline
    refused = sum(kind.startswith(b"HTTP/1.1 503") for kind, _ in out if isinstance(kind, bytes))
    lim = srv.limiter
    # one address holds at most MAX_PER_PEER connections: the rest were refused at once (a 503, or a reset
    # when the refusal met the bytes they had sent) or took the place of one held
    assert 40 - lim.refused <= MAX_PER_PEER + lim.replaced and lim.refused >= refused
    assert lim.replaced >= 1  # the poll took a stranger's place
    # those kept until the deadline trickled all along: a per-read timeout would never have dropped them
    assert sum(d >= DEADLINE - 0.3 for _, d in out) >= 1
    # threads: the server's never more than one address's share and the connections it replaced, far from
    # one per stranger (the serving thread and the flood's one thread come on top)
    assert during <= before + 2 + 2 * MAX_PER_PEER, (before, during)
    assert during <= before + 2 + 2 * MAX_CONNECTIONS
    end = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < end:
        time.sleep(0.05)
    after = threading.active_count()
    assert after <= before
    print(f"\nagent: 40 strangers, {lim.refused} refused at once, {lim.replaced} replaced; the poll answered in "
          f"{poll_s:.2f} s; threads {before} before, {during} at most during, {after} after")
