"""The coordinator's clients are reached from several threads (its loop, the fan-out's threads, the server's
handlers) and from close(): a close() while other threads are still adding clients must close every client it
took and never fail (it did, rarely: "dictionary changed size during iteration" at a test's teardown)."""
from __future__ import annotations

import threading

from testkit.elastic import long_cfg

from dl2d.elastic.coordinator import Coordinator


def test_close_while_threads_add_clients_closes_them_and_never_fails():
    for attempt in range(20):
        coord = Coordinator(long_cfg(), 1, 1)  # not started: no roles, no loop; only its client table
        go, stop = threading.Barrier(5), threading.Event()
        errors: list[BaseException] = []

        def add(t: int) -> None:
            go.wait()
            n = 0
            while not stop.is_set() and n < 20_000:
                coord._c(f"127.0.0.1:{10_000 + t * 20_000 + n}")
                n += 1

        threads = [threading.Thread(target=add, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        go.wait()
        try:
            coord.close()
        except BaseException as e:  # noqa: BLE001 - the failure this test is about
            errors.append(e)
        stop.set()
        for t in threads:
            t.join()
        assert not errors, f"attempt {attempt}: {errors[0]!r}"
        coord.close()  # what was added after the first close is closed by the next
        assert coord.clients == {}
