"""Policy checkpoints: round trip and every kind of bad file rejected with CheckpointError."""
from __future__ import annotations

from dataclasses import replace

import jax
import numpy as np
import pytest
from flax import serialization

from dl2d.policy import checkpoint as C
from dl2d.policy.nets import init_params


def trees_equal(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture
def ckpt(cfg):
    params = init_params(cfg, jax.random.PRNGKey(3))
    opt = C.make_optimizer(cfg.rl_lr)
    opt_state = opt.init(params)
    grads = jax.tree_util.tree_map(lambda x: x * 0 + 0.1, params)
    _, opt_state = opt.update(grads, opt_state, params)  # non-trivial moments and count
    return C.Checkpoint(cfg, params, opt_state, {"rl_steps": 7, "teacher": "drf", "val_jct": [3.5, 3.25]})


def test_round_trip(tmp_path, ckpt):
    path = tmp_path / "p.ckpt"
    C.save(path, ckpt)
    assert not (tmp_path / "p.ckpt.tmp").exists()
    back = C.load(path)
    assert back.config == ckpt.config
    assert back.meta == ckpt.meta
    trees_equal(back.params, ckpt.params)
    trees_equal(back.opt_state, ckpt.opt_state)
    assert int(back.opt_state[0].count) == 1


def test_round_trip_without_opt_state(tmp_path, ckpt):
    C.save(tmp_path / "p.ckpt", replace(ckpt, opt_state=None, meta={}))
    back = C.load(tmp_path / "p.ckpt")
    assert back.opt_state is None and back.meta == {}
    trees_equal(back.params, ckpt.params)


def test_missing_file(tmp_path):
    with pytest.raises(C.CheckpointError, match="cannot read"):
        C.load(tmp_path / "nope.ckpt")


@pytest.mark.parametrize("corrupt", ["truncate", "garbage", "empty"])
def test_corrupted_bytes(tmp_path, ckpt, corrupt):
    path = tmp_path / "p.ckpt"
    C.save(path, ckpt)
    raw = path.read_bytes()
    path.write_bytes({"truncate": raw[: len(raw) // 2], "garbage": bytes(range(256)) * 4, "empty": b""}[corrupt])
    with pytest.raises(C.CheckpointError):
        C.load(path)


def _doc(ckpt):
    return {"format": C.FORMAT, "version": C.VERSION, "config": ckpt.config.to_dict(),
            "params": serialization.to_state_dict(ckpt.params), "opt_state": None, "meta": {}}


@pytest.mark.parametrize("change,match", [
    ({"format": "something-else"}, "not a dl2d policy checkpoint"),
    ({"version": C.VERSION + 1}, "version"),
    ({"config": {"max_jobs": 8, "bogus": 1}}, "bad policy config"),
])
def test_wrong_format_version_or_config(tmp_path, ckpt, change, match):
    path = tmp_path / "p.ckpt"
    path.write_bytes(serialization.msgpack_serialize({**_doc(ckpt), **change}))
    with pytest.raises(C.CheckpointError, match=match):
        C.load(path)


def test_not_a_dict(tmp_path):
    path = tmp_path / "p.ckpt"
    path.write_bytes(serialization.msgpack_serialize([1, 2, 3]))
    with pytest.raises(C.CheckpointError):
        C.load(path)


def test_config_params_mismatch(tmp_path, ckpt, cfg):
    other = init_params(replace(cfg, hidden=16), jax.random.PRNGKey(0))
    path = tmp_path / "p.ckpt"
    C.save(path, replace(ckpt, params=other, opt_state=None))
    with pytest.raises(C.CheckpointError, match="params"):
        C.load(path)
    # a different window size changes the input and output widths
    C.save(path, replace(ckpt, config=replace(cfg, max_jobs=4), opt_state=None))
    with pytest.raises(C.CheckpointError, match="params"):
        C.load(path)


def test_params_missing_a_layer(tmp_path, ckpt):
    doc = _doc(ckpt)
    del doc["params"]["policy"]["mid"]
    path = tmp_path / "p.ckpt"
    path.write_bytes(serialization.msgpack_serialize(doc))
    with pytest.raises(C.CheckpointError):
        C.load(path)


def test_load_scheduler_from_checkpoint(tmp_path, ckpt):
    from dl2d.policy.scheduler import DL2Scheduler, load_scheduler

    C.save(tmp_path / "p.ckpt", ckpt)
    s = load_scheduler(str(tmp_path / "p.ckpt"))
    assert isinstance(s, DL2Scheduler) and s.cfg == ckpt.config
    trees_equal(s.params, ckpt.params)
