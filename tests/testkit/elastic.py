"""Helpers of the elastic tests: small training configs, the single-process reference run, and malformed
frames."""
import json
import struct

import numpy as np

from dl2d.elastic import protocol as P
from dl2d.elastic.model import TrainConfig, grad_sum, make_dataset, reference_train


def long_cfg(**kw):
    """Enough steps that scaling events land mid-training (about 2 ms/step here)."""
    base = dict(n_samples=2048, global_batch=16, epochs=2, d_in=8, hidden=24, d_out=2, max_block=40)
    base.update(kw)
    return TrainConfig(**base)


def assert_matches_reference(cfg, params, start=0, start_state=None):
    p0, m0 = start_state if start_state else (None, None)
    ref, _ = reference_train(cfg, start, cfg.total_steps, p0, m0)
    np.testing.assert_allclose(params, ref, rtol=2e-4, atol=2e-5)


def full_loss(cfg, params):
    X, Y = make_dataset(cfg)
    return grad_sum(cfg, params, X, Y)[1] / len(X)


GOOD_SPEC = {"name": "a", "dtype": "float32", "shape": [2]}


def raw_frame(header: bytes | dict, payload: bytes = b"", plen: int | None = None, hlen: int | None = None) -> bytes:
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("!4sIQ", P.MAGIC, len(hb) if hlen is None else hlen,
                       len(payload) if plen is None else plen) + hb + payload


MALFORMED = [
    # (frame bytes, what the log line says); the first eight are the kinds that used to kill the thread
    (raw_frame({"op": "X", "arrays": ["a"]}), "arrays[0] is not an object"),
    (raw_frame({"op": "X", "arrays": [{"name": "a", "dtype": "float32"}]}), "must have exactly the keys"),
    (raw_frame({"op": "X", "arrays": [{**GOOD_SPEC, "shape": 4}]}), "arrays[0].shape must be a list"),
    (raw_frame({"op": "X", "arrays": [{**GOOD_SPEC, "shape": ["x"]}]}), "not an integer"),
    (raw_frame(b'{"op":"X","arrays":[{"name":"a","dtype":"float32","shape":[Infinity]}]}'), "not an integer"),
    (raw_frame({"op": "X", "arrays": [{"dtype": "float32", "shape": [1], "nam": "a"}]}), "must have exactly the keys"),
    (raw_frame({"op": "X", "arrays": [{**GOOD_SPEC, "name": ["a"]}]}), "arrays[0].name must be a string"),
    (raw_frame({"op": "X", "arrays": {"name": "a"}}), "header 'arrays' must be a list"),
    (raw_frame(b'{"op":"X","n":' + b"9" * 5000 + b"}"), "bad header: Exceeds the limit"),
    (raw_frame(b"[" * 100_000), "nested too deeply"),
    (raw_frame(b"\xff\xfe"), "not UTF-8"),
    (raw_frame(b"{not json"), "not JSON"),
    (raw_frame(b"[1, 2]"), "not a JSON object"),
    (raw_frame({"arrays": []}), "neither 'op' (a request) nor 'ok' (a reply)"),
    (raw_frame({"op": 5}), "header 'op' must be a string"),
    (raw_frame({"op": "X" * 100}), "header 'op' must be a string of 1 to 64"),
    (raw_frame({"ok": "yes"}), "header 'ok' must be true or false"),
    (raw_frame({"ok": False, "error": {"x": 1}}), "header 'error' must be a string"),
    (raw_frame({"op": "X", "arrays": [{**GOOD_SPEC, "dtype": "float64"}]}, b"\0" * 8), "unsupported dtype"),
    (raw_frame({"op": "X", "arrays": [GOOD_SPEC, GOOD_SPEC]}, b"\0" * 16), "is given twice"),
    (raw_frame({"op": "X", "arrays": [{**GOOD_SPEC, "shape": [-1]}]}), "negative dimension"),
    (raw_frame({"op": "X", "arrays": [{**GOOD_SPEC, "shape": [True]}]}), "not an integer"),
    (raw_frame({"op": "X", "arrays": [{**GOOD_SPEC, "shape": [1] * 33}]}), "at most 32 dimensions"),
    (raw_frame({"op": "X", "arrays": [{**GOOD_SPEC, "shape": [2 ** 40, 2 ** 40]}]}), "not an integer in 0.."),
    (raw_frame({"op": "X", "arrays": [{**GOOD_SPEC, "shape": [2 ** 20, 2 ** 20]}]}, b"\0" * 8), "payload shorter"),
    (raw_frame({"op": "X", "arrays": [GOOD_SPEC]}, b"\0" * 12), "payload longer than declared arrays"),
    (raw_frame({"op": "X"}, plen=P.MAX_PAYLOAD + 1), "frame too large: payload"),
    (raw_frame({"op": "X"}, hlen=P.MAX_HEADER + 1), "frame too large: header"),
    (b"XXXX" + b"\0" * 12, "bad magic"),
]
