"""Gathered frame writes: more arrays than one sendmsg takes, and partial sends of a large buffer."""
import socket
import threading

import numpy as np
import pytest

from dl2d.elastic import protocol as P


def test_many_small_and_one_large_array_roundtrip():
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # forces partial sendmsg writes
    rng = np.random.default_rng(0)
    arrays = {f"b{i}": rng.standard_normal(int(rng.integers(0, 50))).astype(np.float32)
              for i in range(3 * P._IOV_MAX + 7)}
    arrays["big"] = rng.standard_normal((300, 1000)).astype(np.float32)
    got = {}
    t = threading.Thread(target=lambda: got.update(msg=P.recv_msg(b)))
    t.start()
    n = P.send_msg(a, {"op": "X"}, arrays)
    t.join(10)
    h, out = got["msg"]
    assert h["op"] == "X" and list(out) == list(arrays)
    for k, v in arrays.items():
        np.testing.assert_array_equal(out[k], v)
    assert n == len(P.encode({"op": "X"}, arrays)[0]) + sum(v.nbytes for v in arrays.values())
    a.close()
    b.close()


def test_negative_dimension_rejected():
    hb = b'{"op":"X","arrays":[{"name":"a","dtype":"float32","shape":[-1]}]}'
    with pytest.raises(P.ProtocolError):
        P.decode(hb, b"")
