"""The daemon's metrics endpoint: prometheus_client's exposition from the daemon's registry, served by a bounded
HTTP server (real sockets on 127.0.0.1). 500 slow connections do not grow the process's threads past the
server's bound (they grew it by about 200 under prometheus_client's start_http_server), each is dropped by the
whole-request deadline however it trickles, and a normal scrape is answered."""
from __future__ import annotations

import select
import socket
import threading
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from dl2d.daemon.metrics import MAX_SCRAPES, MAX_SCRAPES_PER_PEER, Metrics, make_metrics_server

DEADLINE = 3.0  # the whole-request deadline under test (SCRAPE_TIMEOUT_S, 10 s in the daemon)


def slow_clients(port: int, n: int, waves: int, out: list, threads_seen: list, done_connecting: list,
                 for_s: float) -> None:
    """``n`` slow clients of one thread, connecting in ``waves`` 0.1 s apart: each sends a request line and
    then a header line every half second, never the blank line. ``out`` gets the seconds from connect to the
    server's close of each (or "open" for one still open after ``for_s``: the loop always stops then)."""
    socks: dict[socket.socket, float] = {}
    end = time.monotonic() + for_s
    nxt = time.monotonic() + 0.5
    per_wave = n // waves
    made, k = 0, 0
    while (socks or made < n) and time.monotonic() < end:
        if made < n:
            for _ in range(per_wave):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"GET /metrics HTTP/1.1\r\n")
                socks[s] = time.monotonic()
                made += 1
            if made >= n:
                done_connecting.append(time.monotonic())
        stop_at = time.monotonic() + (0.1 if made < n else 0.05)
        while time.monotonic() < stop_at:
            for s in select.select(list(socks), [], [], 0.02)[0] if socks else []:
                try:
                    s.recv(4096)
                except OSError:
                    pass
                out.append(time.monotonic() - socks.pop(s))
                s.close()
            threads_seen.append(threading.active_count())
        if time.monotonic() >= nxt:
            k += 1
            nxt += 0.5
            for s in list(socks):
                try:
                    s.send(b"X-Slow-%d: x\r\n" % k)
                except OSError:
                    pass
    out.extend("open" for _ in socks)
    for s in socks:
        s.close()


def test_500_slow_connections_hold_a_bounded_number_of_threads_and_a_scrape_is_answered():
    m = Metrics()
    m.slot.set(7)
    before = threading.active_count()
    srv = make_metrics_server(m.registry, "127.0.0.1", 0, timeout=DEADLINE)
    serving = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    serving.start()
    port = srv.server_address[1]
    out: list = []
    threads_seen: list[int] = []
    done_connecting: list[float] = []
    flood = threading.Thread(target=slow_clients, args=(port, 500, 10, out, threads_seen, done_connecting,
                                                        6 * DEADLINE), daemon=True)
    try:
        flood.start()
        end = time.monotonic() + 60
        while not done_connecting and time.monotonic() < end:
            time.sleep(0.01)
        assert done_connecting
        # past the grace of every slow connection held: a scrape takes the place of one. (A scraper from
        # another address than the flood's would not even wait for that.) Tried again on a 503, as
        # Prometheus's next scrape would, a bounded number of times.
        time.sleep(max(0.0, done_connecting[0] + 1.2 - time.monotonic()))
        text, tries, t0 = None, 0, time.monotonic()
        while text is None and tries < 20:
            tries += 1
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except urllib.error.HTTPError as e:
                assert e.code == 503
                time.sleep(0.2)
        scrape_s = time.monotonic() - t0
        assert text is not None
        samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert samples["dl2d_slot"] == 7
        during = max(threads_seen + [threading.active_count()])
        flood.join(6 * DEADLINE + 30)
        assert not flood.is_alive()
    finally:
        srv.shutdown()
        srv.server_close()
    assert len(out) == 500 and "open" not in out  # every one dropped, at once or by the deadline
    assert sum(d >= DEADLINE - 0.3 for d in out) >= 1  # ... some only by it, trickling all along
    lim = srv.limiter
    assert lim.refused >= 500 - MAX_SCRAPES - lim.replaced
    # the server's threads: one address's share and the replaced ones still ending, never one per client
    # (the serving thread and the flood's one thread come on top); and never more than its hard bound
    assert during <= before + 2 + 2 * MAX_SCRAPES_PER_PEER, (before, during)
    assert during <= before + 2 + 2 * MAX_SCRAPES
    end = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < end:
        time.sleep(0.05)
    after = threading.active_count()
    assert after <= before
    print(f"\nmetrics: 500 slow connections ({lim.refused} refused at once, {lim.replaced} replaced); a scrape "
          f"answered after {tries} tries in {scrape_s:.2f} s; threads {before} before, {during} at most during, "
          f"{after} after")


def test_the_endpoint_serves_the_registry_in_text_or_openmetrics_and_nothing_else():
    m = Metrics()
    m.stale_nodes.set(2)
    port = m.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain") and r.headers["Connection"] == "close"
            assert b"dl2d_stale_nodes 2.0" in r.read()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
            assert r.read().rstrip().endswith(b"# EOF")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/favicon.ico", timeout=5)
            raise AssertionError("a path other than /metrics was served")
        except urllib.error.HTTPError as e:
            assert e.code == 404
    finally:
        m.close()
