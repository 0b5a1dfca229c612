import pytest

from dl2d.elastic.clock import retry_clock, scaling_clock


def test_clock_hand_checked():
    # rtt 10 ms, 20 ms per step, safety 2 -> ceil(2*0.01/0.02) = 1 step ahead
    assert scaling_clock(100, [0.004, 0.01], 0.02) == 101
    # rtt 30 ms, 10 ms per step -> ceil(6) = 6 ahead
    assert scaling_clock(7, [0.03], 0.01) == 13
    # unknown iteration time -> min_ahead
    assert scaling_clock(5, [0.5], None) == 6
    assert scaling_clock(5, [], 0.1, min_ahead=3) == 8
    # capped
    assert scaling_clock(0, [10.0], 0.001, max_ahead=50) == 50


def test_clock_rejects_negative():
    with pytest.raises(ValueError):
        scaling_clock(-1, [0.1], 0.1)


def test_retry_clock_is_beyond_both():
    assert retry_clock(10, 8) == 12
    assert retry_clock(3, 8) == 10
