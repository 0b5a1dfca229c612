import socket
import struct

import numpy as np
import pytest

from dl2d.elastic import protocol as P


def _pair():
    a, b = socket.socketpair()
    return a, b


def test_roundtrip_header_and_arrays():
    a, b = _pair()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.array([1.5], np.float32)
    P.send_msg(a, {"op": "PUSH", "blocks": [1, 2], "nested": {"k": "v"}}, {"x": x, "y": y})
    h, arrs = P.recv_msg(b)
    assert h == {"op": "PUSH", "blocks": [1, 2], "nested": {"k": "v"}}
    np.testing.assert_array_equal(arrs["x"], x)
    assert arrs["x"].dtype == np.float32 and arrs["x"].shape == (3, 4)
    np.testing.assert_array_equal(arrs["y"], y)


def test_frame_layout_is_documented_format():
    frame = b"".join(bytes(p) for p in P.encode({"op": "PING"}, {"a": np.array([2.0], np.float32)}))
    magic, hlen, plen = struct.unpack("!4sIQ", frame[:16])
    assert magic == b"DL2E" and plen == 4
    import json
    header = json.loads(frame[16:16 + hlen])
    assert header["arrays"] == [{"name": "a", "dtype": "float32", "shape": [1]}]
    assert np.frombuffer(frame[16 + hlen:], "<f4")[0] == 2.0


def test_bad_magic_and_bad_dtype_rejected():
    a, b = _pair()
    a.sendall(struct.pack("!4sIQ", b"XXXX", 2, 0) + b"{}")
    with pytest.raises(P.ProtocolError):
        P.recv_msg(b)
    with pytest.raises(P.ProtocolError):
        P.decode(b'{"arrays":[{"name":"a","dtype":"object","shape":[1]}]}', b"\0" * 8)
    with pytest.raises(P.ProtocolError):
        P.decode(b'{"arrays":[{"name":"a","dtype":"float32","shape":[4]}]}', b"\0" * 8)


def test_server_client_and_remote_error():
    def handler(h, a):
        if h["op"] == "ADD":
            return {"sum": float(a["v"].sum())}, {"twice": a["v"] * 2}
        raise KeyError("nope")
    srv = P.Server(handler).start()
    c = P.Client(srv.address)
    h, a = c.call("ADD", {"v": np.ones(1000, np.float32)})
    assert h["ok"] and h["sum"] == 1000.0
    np.testing.assert_array_equal(a["twice"], np.full(1000, 2, np.float32))
    with pytest.raises(P.RemoteError, match="nope"):
        c.call("OTHER")
    # connection still usable after a remote error
    assert c.call("ADD", {"v": np.zeros(2, np.float32)})[0]["sum"] == 0.0
    c.close()
    srv.close()
