"""Property-based fuzzing of the elastic frame decoder: random and mutated frames
(valid frames truncated, bytes flipped or inserted, lengths in the prefix replaced, header fields given wrong
types, huge numbers or nesting) end in a decoded frame, a FrameError (a ProtocolError) or, for a frame cut
short, ConnectionError at the end of the stream; never another exception, a hang (every read has a deadline)
or an allocation beyond what arrived (the peak resident memory of each example is measured)."""
from __future__ import annotations

import json
import socket
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl2d.elastic import protocol as P

#: Examples per run (about 12 s in all on a 2-core machine); deadline: 5 s for any one example.
MUTATED, VALID, HEADERS = 2000, 300, 1000


def fuzz(n: int):
    return settings(max_examples=n, deadline=5000, suppress_health_check=[HealthCheck.too_slow])

_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10 ** 300), max_value=10 ** 300),
                    st.floats(), st.text(max_size=12), st.sampled_from([-1, 0, 2 ** 31, 2 ** 63, 2 ** 64, 1e300]))
WILD = st.recursive(_scalar, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids,
                                                                                       max_size=3), max_leaves=8)
HEADER_KEYS = ["op", "ok", "error", "arrays", "step", "blocks", "version"]


def peak_reset() -> bool:
    """Reset this process's peak resident memory (Linux); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


@st.composite
def valid_frames(draw) -> bytes:
    """A frame as the runtime writes it: a request or reply header of JSON fields, and float32 arrays."""
    header = {"op": draw(st.sampled_from(["PUSH", "PULL", "PUT_BLOCKS", "SCALE", "PROGRESS"]))} \
        if draw(st.booleans()) else {"ok": draw(st.booleans())}
    header.update(draw(st.dictionaries(st.sampled_from(["step", "blocks", "version", "worker", "error"]),
                                       st.one_of(st.integers(-10, 10 ** 6), st.text(max_size=8),
                                                 st.lists(st.integers(0, 100), max_size=5)), max_size=3)))
    if "error" in header:
        header["error"] = str(header["error"])
    shapes = draw(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), max_size=4))
    arrays = {f"p{i}": np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) for i, s in enumerate(shapes)}
    return b"".join(bytes(b) for b in P.encode(header, arrays))


@st.composite
def mutated_frames(draw) -> bytes:
    frame = bytearray(draw(valid_frames()))
    hlen = struct.unpack("!I", frame[4:8])[0]
    if draw(st.booleans()):  # rewrite header fields with wild values, keeping the prefix's lengths consistent
        header = json.loads(frame[16:16 + hlen])
        for _ in range(draw(st.integers(1, 3))):
            key = draw(st.sampled_from(HEADER_KEYS))
            if draw(st.booleans()) and isinstance(header.get("arrays"), list) and header["arrays"]:
                spec = header["arrays"][draw(st.integers(0, len(header["arrays"]) - 1))]
                if isinstance(spec, dict):
                    spec[draw(st.sampled_from(["name", "dtype", "shape", "extra"]))] = draw(WILD)
            elif draw(st.booleans()):
                header.pop(key, None)
            else:
                header[key] = draw(WILD)
        hb = json.dumps(header).encode()
        payload = frame[16 + hlen:]
        frame = bytearray(struct.pack("!4sIQ", P.MAGIC, len(hb), len(payload)) + hb + payload)
    for _ in range(draw(st.integers(0, 3))):  # byte-level damage anywhere, the prefix included
        op = draw(st.sampled_from(["truncate", "flip", "insert", "digits", "nest", "lengths"]))
        at = draw(st.integers(0, len(frame)))
        if op == "truncate":
            del frame[at:]
        elif op == "flip" and at < len(frame):
            frame[at] ^= draw(st.integers(1, 255))
        elif op == "insert":
            frame[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "digits":
            frame[at:at] = b"9" * draw(st.integers(300, 6000))
        elif op == "nest":
            frame[at:at] = b"[" * draw(st.integers(100, 3000))
        elif op == "lengths" and len(frame) >= 16:
            frame[4:16] = struct.pack("!IQ", draw(st.integers(0, 2 ** 32 - 1)),
                                      draw(st.sampled_from([0, 1, 4, 8, 2 ** 20, P.MAX_PAYLOAD, P.MAX_PAYLOAD + 1,
                                                            2 ** 64 - 1])))
    return bytes(frame)


def check_frame(header: dict, arrays: dict) -> None:
    """What a decoded frame guarantees a handler."""
    assert isinstance(header, dict) and "arrays" not in header
    assert isinstance(header.get("op"), str) or isinstance(header.get("ok"), bool)
    for name, a in arrays.items():
        assert isinstance(name, str) and isinstance(a, np.ndarray) and a.dtype == np.float32


def read_all(data: bytes) -> list[str]:
    """Feed ``data`` to recv_msg as a peer would (then EOF) until it ends; the outcomes."""
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)  # a read that waits this long fails the test (TimeoutError is no allowed outcome)
    outcomes = []
    try:
        if len(data) > 100_000:  # more than the socket buffer holds: a writer thread
            import threading

            t = threading.Thread(target=lambda: (a.sendall(data), a.shutdown(socket.SHUT_WR)), daemon=True)
            t.start()
        else:
            a.sendall(data)
            a.shutdown(socket.SHUT_WR)
        while True:
            try:
                header, arrays = P.recv_msg(b)
            except P.FrameError as e:
                msg = str(e)
                assert "\n" not in msg and len(msg) < 400, msg
                assert "stalled" not in msg  # the writer never stalls: a stall here would be a hang
                outcomes.append("rejected")
                return outcomes
            except ConnectionError:
                outcomes.append("ended")
                return outcomes
            check_frame(header, arrays)
            outcomes.append("accepted")
    finally:
        a.close()
        b.close()


@fuzz(MUTATED)
@given(frame=mutated_frames())
def test_mutated_frames_decode_or_are_rejected_cleanly_in_bounded_memory(frame):
    measure = peak_reset()
    base = status_mb("VmRSS")
    read_all(frame)
    if measure:  # whatever a frame declares, the decoder holds about what arrived (plus a small header)
        assert status_mb("VmHWM") - base < 64 + len(frame) / 2 ** 20 * 4


@fuzz(VALID)
@given(frame=valid_frames())
def test_valid_frames_round_trip(frame):
    assert read_all(frame) == ["accepted", "ended"]


@fuzz(HEADERS)
@given(header=st.one_of(st.binary(max_size=200),
                        st.dictionaries(st.sampled_from(HEADER_KEYS), WILD, max_size=5).map(
                            lambda d: json.dumps(d).encode())),
       payload_len=st.sampled_from([0, 4, 8, 12, 2 ** 30, 2 ** 30 + 1]))
def test_random_headers_parse_or_are_rejected_cleanly(header, payload_len):
    try:
        h, specs = P.parse_header(header, payload_len)
    except P.FrameError as e:
        assert "\n" not in str(e)
        return
    check_frame(h, {})
    assert sum(n for _, _, n in specs) * 4 == payload_len


@pytest.mark.parametrize("data", [b"", b"DL2", b"DL2E" + b"\xff" * 12, b"\0" * 64])
def test_degenerate_streams(data):
    assert read_all(data)[-1] in ("rejected", "ended")
