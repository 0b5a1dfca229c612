"""Policy checkpoints: parameters, optimiser state and config in one msgpack file, written atomically.

Layout: {"format": "dl2d-policy", "version": 1, "config": {...}, "params": ..., "opt_state": ..., "meta": {...}}
for DL2's per-inference policy; {"format": "dl2d-target-policy", "version": 1, "config": {...}, "params": ...,
"meta": {...}} for the target-size policy (dl2d.policy.target), the shipped pretrained ones among them.
Loading checks the config's bounds first (PolicyConfig), then rebuilds the parameter tree from it and checks
every array's shape, dtype and finiteness, so a truncated file, a file of another kind, a newer format, a
config asking for an absurd network, a config/parameter mismatch or NaN parameters each fail with a clear
`CheckpointError`, before anything large is allocated.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
import optax
from flax import serialization

from dl2d.core.files import write_atomic
from dl2d.policy.config import PolicyConfig
from dl2d.policy.nets import init_params

FORMAT = "dl2d-policy"
VERSION = 1


class CheckpointError(RuntimeError):
    pass


@dataclass
class Checkpoint:
    config: PolicyConfig
    params: dict
    opt_state: object = None
    meta: dict = field(default_factory=dict)


def make_optimizer(lr: float) -> optax.GradientTransformation:
    return optax.adam(lr)


def save(path: str | Path, ckpt: Checkpoint) -> None:
    path = Path(path)
    doc = {
        "format": FORMAT, "version": VERSION, "config": ckpt.config.to_dict(),
        "params": serialization.to_state_dict(jax.device_get(ckpt.params)),
        "opt_state": serialization.to_state_dict(jax.device_get(ckpt.opt_state)) if ckpt.opt_state is not None else None,
        "meta": ckpt.meta,
    }
    write_atomic(path, serialization.msgpack_serialize(doc))


def _read(path: Path, fmt: str, version: int, what: str) -> dict:
    """The checkpoint's document, its format, version and config table checked; CheckpointError otherwise
    (``what``: the kind of checkpoint, as messages name it)."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read checkpoint ({e.strerror})") from None
    try:
        doc = serialization.msgpack_restore(raw)
    except Exception as e:  # msgpack raises several types on garbage
        raise CheckpointError(f"{path}: not a {what} checkpoint (unreadable: {type(e).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        found = doc.get("format") if isinstance(doc, dict) else None
        kind = f" (it is a {found!r} checkpoint)" if isinstance(found, str) and found.startswith("dl2d") else ""
        raise CheckpointError(f"{path}: not a {what} checkpoint{kind}")
    if doc.get("version") != version:
        raise CheckpointError(f"{path}: checkpoint version {doc.get('version')!r} not supported (this dl2d reads "
                              f"{version})")
    if not isinstance(doc.get("config"), dict):
        raise CheckpointError(f"{path}: bad policy config: not a table")
    return doc


def load(path: str | Path, lr: float | None = None) -> Checkpoint:
    path = Path(path)
    doc = _read(path, FORMAT, VERSION, "dl2d policy")
    try:
        cfg = PolicyConfig.from_dict(doc["config"])
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: bad policy config: {e}") from None
    template = init_params(cfg, jax.random.PRNGKey(0))
    params = _restore(path, template, doc.get("params"), "params")
    opt_state = None
    if doc.get("opt_state") is not None:
        opt_template = make_optimizer(lr or cfg.rl_lr).init(template)
        opt_state = _restore(path, opt_template, doc["opt_state"], "optimiser state")
    return Checkpoint(cfg, params, opt_state, doc.get("meta") or {})


# ------------------------------------------------------------------------------------------ target-size policy

TARGET_FORMAT = "dl2d-target-policy"
TARGET_VERSION = 1


@dataclass
class TargetCheckpoint:
    config: object  # dl2d.policy.target.TargetConfig
    params: dict
    meta: dict = field(default_factory=dict)


def save_target(path: str | Path, ckpt: TargetCheckpoint) -> None:
    doc = {"format": TARGET_FORMAT, "version": TARGET_VERSION, "config": ckpt.config.to_dict(),
           "params": serialization.to_state_dict(jax.device_get(ckpt.params)), "meta": ckpt.meta}
    write_atomic(Path(path), serialization.msgpack_serialize(doc))


def load_target(path: str | Path) -> TargetCheckpoint:
    """A target-size policy's checkpoint: its config's bounds checked first, then every array against the
    network that config builds (shape, dtype, finite); CheckpointError naming what is wrong otherwise."""
    from dl2d.policy.target import TargetConfig, init_params as target_params

    path = Path(path)
    doc = _read(path, TARGET_FORMAT, TARGET_VERSION, TARGET_FORMAT)
    try:
        cfg = TargetConfig.from_dict(doc["config"])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: bad policy config: {e}") from None
    params = _restore(path, target_params(cfg, jax.random.PRNGKey(0)), doc.get("params"), "params")
    meta = doc.get("meta") or {}
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: meta is not a table")
    return TargetCheckpoint(cfg, params, meta)


def _restore(path, template, state, what):
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: {what} missing or not a tree of arrays")
    try:
        restored = serialization.from_state_dict(template, state)
    except Exception as e:  # flax raises several types on a tree that does not fit the template
        raise CheckpointError(f"{path}: {what} do not match the config ({type(e).__name__}: {e})") from None
    leaves_t, leaves_r = jax.tree_util.tree_leaves(template), jax.tree_util.tree_leaves(restored)
    if len(leaves_t) != len(leaves_r):
        raise CheckpointError(f"{path}: {what} have {len(leaves_r)} arrays, the config needs {len(leaves_t)}")
    for a, b in zip(leaves_t, leaves_r):
        if not hasattr(b, "shape") and hasattr(a, "shape"):
            raise CheckpointError(f"{path}: {what} hold {type(b).__name__} where an array belongs")
        if getattr(a, "shape", None) != getattr(b, "shape", None):
            raise CheckpointError(f"{path}: {what} shapes {getattr(b, 'shape', None)} != expected {a.shape}")
        dtype = getattr(b, "dtype", None)
        if dtype is not None and getattr(a, "dtype", None) is not None and np.issubdtype(a.dtype, np.floating):
            if not np.issubdtype(dtype, np.floating):
                raise CheckpointError(f"{path}: {what} hold {dtype} values where floats belong")
            if not np.all(np.isfinite(b)):
                raise CheckpointError(f"{path}: {what} contain NaN or infinite values")
    return restored
