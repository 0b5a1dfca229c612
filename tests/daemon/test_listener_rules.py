"""The admission rules every dl2d listener shares (dl2d.core.listener): the pure decision, the limiter that keeps
it, and the deadline that bounds a whole request rather than each read. The listeners' own tests flood them for
real (tests/agents/test_listener_agent.py, tests/daemon/test_listener_control.py and test_listener_metrics.py,
tests/elastic/test_listener_elastic.py)."""
from __future__ import annotations

import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl2d.core.listener import Deadline, DeadlineIO, Decision, Held, Limits, PeerLimiter, Refused, decide

L = Limits(total=6, per_peer=3, reserved=2, grace_s=1.0)


def held(*specs: tuple) -> list[Held]:
    """(peer, privileged, pending, since) tuples as Held."""
    return [Held(*s) for s in specs]


def test_room_admits_and_a_peer_over_its_share_replaces_only_its_own_old_pending_connection():
    assert decide([], "a", False, 10.0, L) == Decision(True)
    young = held(("a", False, True, 9.5), ("a", False, True, 9.6), ("a", False, True, 9.7))
    assert decide(young, "a", False, 10.0, L) == Decision(False, refusal="peer")  # a burst keeps its members
    assert decide(young, "b", False, 10.0, L) == Decision(True)  # another peer is not affected
    old = held(("a", False, False, 1.0), ("a", False, True, 3.0), ("a", False, True, 2.0))
    assert decide(old, "a", False, 10.0, L) == Decision(True, victim=2)  # the oldest *pending* one
    answering = held(("a", False, False, 1.0), ("a", False, False, 2.0), ("a", False, False, 3.0))
    assert decide(answering, "a", False, 10.0, L) == Decision(False, refusal="peer")


def test_reserved_slots_are_for_privileged_peers_and_strangers_yield_to_them():
    strangers = held(("a", False, True, 9.9), ("b", False, True, 9.9), ("c", False, True, 9.9),
                     ("d", False, True, 9.9))  # total - reserved = 4: the strangers' pool is full, one each
    assert decide(strangers, "e", False, 10.0, L) == Decision(False, refusal="full")
    assert decide(strangers, "e", False, 11.0, L) == Decision(True, victim=0)  # after their grace: the oldest
    assert decide(strangers, "root", True, 10.0, L) == Decision(True)  # a reserved slot
    full = strangers + held(("root", True, False, 9.0), ("root", True, False, 9.0))
    # every slot taken: root takes the place of the oldest pending stranger of the heaviest peer, at any age
    assert decide(full[:4] + held(("a", False, True, 9.0), ("root", True, False, 9.0)), "root", True, 10.0,
                  L) == Decision(True, victim=4)
    assert decide(full, "e", False, 10.0, L) == Decision(False, refusal="full")  # never a privileged slot
    all_answering = held(*[("a" if i < 2 else "b", False, False, 1.0) for i in range(4)],
                         ("root", True, False, 1.0), ("x", True, False, 1.0))
    assert decide(all_answering, "root", True, 10.0, L) == Decision(False, refusal="full")


def test_a_peer_holding_more_than_its_fair_share_yields_to_a_lighter_one():
    lim = Limits(total=4, per_peer=4)
    heavy = held(("a", False, True, 9.9), ("a", False, True, 9.8), ("a", False, True, 9.7), ("b", False, True, 9.9))
    assert decide(heavy, "c", False, 10.0, lim) == Decision(True, victim=2)  # a holds 3, c none: a yields
    even = held(("a", False, True, 9.9), ("a", False, True, 9.8), ("b", False, True, 9.9), ("b", False, True, 9.8))
    assert decide(even, "b", False, 10.0, lim) == Decision(False, refusal="full")  # a has 2, b would have 2
    assert decide(even, "c", False, 10.0, lim).admit  # c holds none: a or b yields


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "answer", "release"]), st.integers(0, 5),
                          st.floats(0, 2)), max_size=80))
def test_the_limiter_never_exceeds_its_bounds_and_privileged_peers_find_room(ops):
    """Any sequence of connections, requests read and connections ended: at most total admitted, per_peer of
    a peer, total - reserved of unprivileged peers; threads at most twice total; a privileged peer under its
    share is refused only when every slot is privileged or being answered."""
    now = [0.0]
    lim = PeerLimiter(L, clock=lambda: now[0])
    tickets = []
    for op, who, dt in ops:
        now[0] += dt
        peer, privileged = f"p{who}", who == 0
        if op == "admit":
            before = [t for t in lim._live]
            try:
                tickets.append(lim.admit(peer, privileged=privileged, deadline_s=5.0, wake=lambda: None))
            except Refused:
                mine = [t for t in before if t.peer == peer]
                if privileged and len(mine) < L.per_peer and len(before) >= L.total:
                    assert all(t.privileged or not t.pending for t in before)
        elif tickets:
            t = tickets[who % len(tickets)]
            t.answering() if op == "answer" else t.release()
        live = lim._live
        assert len(live) <= L.total and lim.threads <= L.thread_cap
        assert sum(not t.privileged for t in live) <= L.total - L.reserved
        for p in {t.peer for t in live}:
            assert sum(t.peer == p for t in live) <= L.per_peer


def test_a_replaced_connection_is_woken_and_still_counts_as_a_thread_until_it_ends():
    now = [0.0]
    lim = PeerLimiter(Limits(total=2, per_peer=2, grace_s=1.0), clock=lambda: now[0])
    woken: list[str] = []
    first = lim.admit("a", deadline_s=5.0, wake=lambda: woken.append("first"))
    lim.admit("a", deadline_s=5.0, wake=lambda: woken.append("second"))
    with pytest.raises(Refused, match="2 connections from this peer are already open"):
        lim.admit("a", deadline_s=5.0, wake=lambda: None)
    now[0] = 1.5
    third = lim.admit("a", deadline_s=5.0, wake=lambda: None)
    assert woken == ["first"] and first.replaced and first.deadline.expired and not third.replaced
    assert lim.in_use == 2 and lim.threads == 3 and lim.replaced == 1 and lim.refused == 1
    first.release()
    assert lim.threads == 2


def test_the_deadline_bounds_the_whole_request_not_each_read():
    """A peer that sends a byte every 0.1 s never waits out a per-read timeout; the deadline ends it anyway."""
    a, b = socket.socketpair()
    stop = threading.Event()

    def trickle() -> None:
        for _ in range(100):  # at most 10 s, stopped by the test long before
            if stop.wait(0.1):
                return
            try:
                b.send(b"x")
            except OSError:
                return
    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    raw = DeadlineIO(a, Deadline(0.6))
    got, t0 = 0, time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="request not complete within 0.6 s"):
            while True:
                got += raw.readinto(bytearray(64))
        assert got >= 1 and time.monotonic() - t0 < 5  # generous: ended by the deadline, not by the trickler
    finally:
        stop.set()
        t.join(5)
        a.close()
        b.close()


def test_limits_are_checked():
    for bad in (dict(total=0, per_peer=1), dict(total=2, per_peer=0), dict(total=2, per_peer=1, reserved=2),
                dict(total=2, per_peer=1, grace_s=-1)):
        with pytest.raises(ValueError):
            Limits(**bad)
