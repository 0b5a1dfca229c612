from __future__ import annotations

from dl2d.agents.host import HostReader, counter_rate


def test_counter_rate():
    assert counter_rate(None, 100, 1.0) is None
    assert counter_rate(100, 300, 2.0) == 100.0
    assert counter_rate(300, 100, 2.0) is None  # counter reset
    assert counter_rate(100, 200, 0.0) is None


def test_host_reader_real_psutil():
    t = iter([100.0, 110.0])
    r = HostReader(clock=lambda: next(t))
    a = r.read()
    assert a["cpu_count"] >= 1 and a["mem_total_bytes"] > a["mem_used_bytes"] > 0
    assert a["net_rx_bytes"] >= 0 and a["net_rx_bps"] is None  # no previous read
    b = r.read()
    assert b["net_rx_bps"] is not None and b["net_rx_bps"] >= 0
    assert b["net_rx_bps"] == (b["net_rx_bytes"] - a["net_rx_bytes"]) / 10.0
