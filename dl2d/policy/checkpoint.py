"""Policy checkpoints: parameters, optimiser state and config in one msgpack file, written atomically.

Layout: {"format": "dl2d-policy", "version": 1, "config": {...}, "params": ..., "opt_state": ..., "meta": {...}}
for DL2's per-inference policy; {"format": "dl2d-target-policy", "version": 1, "config": {...}, "params": ...,
"meta": {...}} for the target-size policy (dl2d.policy.target.policy), the shipped pretrained ones among them.

A checkpoint is untrusted input, and refusing a bad one costs no more than loading a good one:

1. the file is read with dl2d.core.files.read_bounded: a regular file, no larger than the largest network the
   config bounds allow (MAX_POLICY_BYTES, MAX_TARGET_BYTES); a file over HEAD_BYTES is first judged from its
   head, where its format and config lie (:func:`head_entries`), and held to what that config's network can
   fill, so a large file asking for a small network is refused before the rest of it is read;
2. its msgpack structure is walked before it is decoded (:func:`msgpack_problem`): a bounded number of values
   and depth, every length within the file, every array's declared shape and dtype matching its bytes, so
   decoding allocates about the file's size and no more (a file of millions of one-byte values would
   otherwise become a list eight times its size);
3. the config's bounds are checked (PolicyConfig, TargetConfig);
4. the parameter tree the config builds is worked out as shapes only (``jax.eval_shape``: nothing allocated,
   no network initialised; a 500-byte file naming the largest network the bounds allow took 16 s and 1.4 GB
   to refuse while it was built for real), and every array of the file is checked against it: shape, dtype,
   finiteness.

Every failure is a `CheckpointError` of one line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
import optax
from flax import serialization

from dl2d.core.files import HEAD_BYTES, InputFileError, read_bounded, write_atomic
from dl2d.policy.dl2.config import MAX_WEIGHTS, PolicyConfig
from dl2d.policy.dl2.nets import init_params

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


#: The largest DL2 checkpoint: its policy and value networks of at most MAX_WEIGHTS float32 weights each (and
#: their biases), twice more for Adam's two moments, and room for the meta.
MAX_POLICY_BYTES = 6 * 4 * MAX_WEIGHTS + 16 * 1024 * 1024
#: The largest target-size checkpoint: TargetConfig's bounds make at most about 9.2 M float32 parameters (37 MB).
MAX_TARGET_BYTES = 64 * 1024 * 1024
#: A checkpoint's meta (how it was trained: settings, per-iteration figures) is kilobytes; this is its room in
#: the largest file a config allows.
MAX_META_BYTES = 16 * 1024 * 1024
#: msgpack values (maps' keys and values, lists' items, arrays) a checkpoint may hold: a shipped one holds
#: about 150, a DL2 one with its optimiser state about 100; meta lists of per-iteration figures fit many times.
MAX_ITEMS = 100_000
#: How deeply a checkpoint's maps and lists may nest (the optimiser state's arrays sit 6 deep).
MAX_DEPTH = 32


def _read(path: Path, fmt: str, version: int, what: str, max_bytes: int, size_limit) -> dict:
    """The checkpoint's document, its size, structure, format, version and config table checked;
    CheckpointError otherwise (``what``: the kind of checkpoint, as messages name it).

    ``size_limit(config table)`` is the largest file a checkpoint of that config can be (CheckpointError for a
    bad config): a file larger than HEAD_BYTES is checked from its head (its format and config come before its
    arrays) and held to that limit before the rest of it is read."""
    def check_head(head: bytes, size: int) -> int | None:
        if size <= HEAD_BYTES:
            return None  # read whole: it costs no more than its head
        entries = head_entries(head)
        if "config" not in entries:
            raise CheckpointError(f"{path}: not a {what} checkpoint (no config in its first {HEAD_BYTES} bytes)")
        # (dl2d writes the keys sorted: config, format and meta come before the arrays, version after them, so
        # the version is checked once the whole file is decoded)
        _check_doc(path, {"version": version, **entries}, fmt, version, what)
        limit = size_limit(entries["config"])
        if size > limit:
            raise CheckpointError(f"{path}: {size} bytes, more than the {limit} a checkpoint of its config can "
                                  "have")
        return limit

    try:
        raw = read_bounded(path, max_bytes, check_head)
    except InputFileError as e:
        if e.too_large:
            raise CheckpointError(f"{path}: larger than {max_bytes} bytes, more than any {what} checkpoint") \
                from None
        raise CheckpointError(f"{path}: cannot read checkpoint ({e.reason})") from None
    problem = msgpack_problem(raw)
    if problem:
        raise CheckpointError(f"{path}: not a {what} checkpoint ({problem})")
    try:
        doc = serialization.msgpack_restore(raw)
    except Exception as e:  # msgpack raises several types on garbage
        raise CheckpointError(f"{path}: not a {what} checkpoint (unreadable: {type(e).__name__})") from None
    del raw
    _check_doc(path, doc, fmt, version, what)
    meta = doc.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise CheckpointError(f"{path}: meta is not a table")
    return doc


def _check_doc(path: Path, doc, fmt: str, version: int, what: str) -> None:
    """A checkpoint's document (or the entries of its head) of format ``fmt`` and ``version`` with a config
    table; CheckpointError otherwise."""
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        found = doc.get("format") if isinstance(doc, dict) else None
        kind = f" (it is a {found!r} checkpoint)" if isinstance(found, str) and found.startswith("dl2d") else ""
        raise CheckpointError(f"{path}: not a {what} checkpoint{kind}")
    if doc.get("version") != version:
        raise CheckpointError(f"{path}: checkpoint version {_show(doc.get('version'))} not supported (this dl2d "
                              f"reads {version})")
    if not isinstance(doc.get("config"), dict):
        raise CheckpointError(f"{path}: bad policy config: not a table")


def _file_limit(template, copies: int) -> int:
    """The largest file holding ``copies`` trees of the arrays of ``template`` (shapes): each value a float64
    at most, each array's key and header, the meta, the head."""
    leaves = jax.tree_util.tree_leaves(template)
    values = sum(math.prod(leaf.shape) for leaf in leaves)
    return copies * (8 * values + 256 * len(leaves)) + MAX_META_BYTES + HEAD_BYTES


def _show(value) -> str:
    """A value read from a file, for a message: its repr, one line and short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _shapes(build):
    """The tree ``build(key)`` returns, as shapes and dtypes only (jax.ShapeDtypeStruct leaves): the network a
    config asks for is checked against the file's arrays without being initialised."""
    return jax.eval_shape(build, jax.random.PRNGKey(0))


def load(path: str | Path, lr: float | None = None) -> Checkpoint:
    """A DL2 policy's checkpoint (module doc: what is checked, in which order); CheckpointError naming what is
    wrong otherwise. ``lr``: the optimiser's learning rate (the config's RL rate by default)."""
    path = Path(path)
    shapes: dict[PolicyConfig, dict] = {}

    def config(table) -> PolicyConfig:
        try:
            return PolicyConfig.from_dict(table)
        except (TypeError, ValueError, KeyError) as e:
            raise CheckpointError(f"{path}: bad policy config: {e}") from None

    def params_of(cfg: PolicyConfig) -> dict:
        if cfg not in shapes:
            shapes[cfg] = _shapes(lambda key: init_params(cfg, key))
        return shapes[cfg]

    doc = _read(path, FORMAT, VERSION, "dl2d policy", MAX_POLICY_BYTES,
                lambda table: _file_limit(params_of(config(table)), copies=3))  # params and Adam's two moments
    cfg = config(doc["config"])
    params = _restore(path, params_of(cfg), doc.get("params"), "params")
    opt_state = None
    if doc.get("opt_state") is not None:
        opt_template = _shapes(lambda key: make_optimizer(lr or cfg.rl_lr).init(init_params(cfg, key)))
        opt_state = _restore(path, opt_template, doc["opt_state"], "optimiser state")
    return Checkpoint(cfg, params, opt_state, doc.get("meta") or {})


# ------------------------------------------------------------------------------------------ target-size policy

TARGET_FORMAT = "dl2d-target-policy"
TARGET_VERSION = 1


@dataclass
class TargetCheckpoint:
    config: object  # dl2d.policy.target.policy.TargetConfig
    params: dict
    meta: dict = field(default_factory=dict)


def save_target(path: str | Path, ckpt: TargetCheckpoint) -> None:
    doc = {"format": TARGET_FORMAT, "version": TARGET_VERSION, "config": ckpt.config.to_dict(),
           "params": serialization.to_state_dict(jax.device_get(ckpt.params)), "meta": ckpt.meta}
    write_atomic(Path(path), serialization.msgpack_serialize(doc))


def load_target(path: str | Path) -> TargetCheckpoint:
    """A target-size policy's checkpoint: checked as the module doc says (its config's bounds, then every array
    against the shapes of the network that config builds: shape, dtype, finite); CheckpointError naming what is
    wrong otherwise."""
    from dl2d.policy.target.policy import TargetConfig, init_params as target_params

    path = Path(path)
    shapes: dict[TargetConfig, dict] = {}

    def config(table) -> TargetConfig:
        try:
            return TargetConfig.from_dict(table)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: bad policy config: {e}") from None

    def params_of(cfg: TargetConfig) -> dict:
        if cfg not in shapes:
            shapes[cfg] = _shapes(lambda key: target_params(cfg, key))
        return shapes[cfg]

    doc = _read(path, TARGET_FORMAT, TARGET_VERSION, TARGET_FORMAT, MAX_TARGET_BYTES,
                lambda table: _file_limit(params_of(config(table)), copies=1))
    cfg = config(doc["config"])
    params = _restore(path, params_of(cfg), doc.get("params"), "params")
    return TargetCheckpoint(cfg, params, doc.get("meta") or {})


def _restore(path, template, state, what):
    """``state`` (the file's tree) fitted to ``template`` (the config's shapes and dtypes): the same tree, each
    array of the template's shape, float where the template holds floats, and finite."""
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


# ------------------------------------------------------------------------------------------ msgpack structure

#: msgpack's one-byte heads of fixed-size values: head -> bytes that follow
_FIXED = {0xc0: 0, 0xc2: 0, 0xc3: 0, 0xca: 4, 0xcb: 8, 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2,
          0xd2: 4, 0xd3: 8}
#: bin 8/16/32 and str 8/16/32: head -> (bytes of the length, tag)
_SIZED = {0xc4: (1, "bin"), 0xc5: (2, "bin"), 0xc6: (4, "bin"), 0xd9: (1, "str"), 0xda: (2, "str"),
          0xdb: (4, "str")}
#: array 16/32 and map 16/32: head -> (bytes of the count, tag)
_COUNTED = {0xdc: (2, "array"), 0xdd: (4, "array"), 0xde: (2, "map"), 0xdf: (4, "map")}
#: ext 8/16/32: head -> bytes of the length; fixext 1/2/4/8/16: head -> length
_EXT = {0xc7: 1, 0xc8: 2, 0xc9: 4}
_FIXEXT = {0xd4: 1, 0xd5: 2, 0xd6: 4, 0xd7: 8, 0xd8: 16}
#: flax's msgpack extension types holding an array: [shape, dtype name, data] (ndarray, numpy scalar)
_ARRAY_EXTS = (1, 3)


def _head(raw: bytes, pos: int) -> tuple[str, object, int]:
    """(tag, value, position after the head) of the msgpack value at ``pos``: ("int", the integer), ("str" |
    "bin", the payload's length), ("array" | "map", the count of items | pairs), ("ext", (type, length)),
    ("other", None) for nil, booleans and floats (their bytes skipped); ValueError on a byte that starts no
    value or a head cut short."""
    if pos >= len(raw):
        raise ValueError("cut short")
    b = raw[pos]
    pos += 1

    def take(n: int, signed: bool = False) -> int:
        if pos + n > len(raw):
            raise ValueError("cut short")
        return int.from_bytes(raw[pos:pos + n], "big", signed=signed)

    if b <= 0x7f:
        return "int", b, pos
    if b >= 0xe0:
        return "int", b - 0x100, pos
    if b <= 0x8f:
        return "map", b & 0x0f, pos
    if b <= 0x9f:
        return "array", b & 0x0f, pos
    if b <= 0xbf:
        return "str", b & 0x1f, pos
    if b in _FIXED:
        n = _FIXED[b]
        if 0xcc <= b <= 0xd3:
            return "int", take(n, signed=b >= 0xd0), pos + n
        if pos + n > len(raw):
            raise ValueError("cut short")
        return "other", None, pos + n
    if b in _SIZED:
        n, tag = _SIZED[b]
        return tag, take(n), pos + n
    if b in _COUNTED:
        n, tag = _COUNTED[b]
        return tag, take(n), pos + n
    if b in _EXT:
        n = _EXT[b]
        length = take(n)
        pos += n
        return "ext", (take(1, signed=True), length), pos + 1
    if b in _FIXEXT:
        return "ext", (take(1, signed=True), _FIXEXT[b]), pos + 1
    raise ValueError(f"byte 0x{b:02x} at {pos - 1} starts no msgpack value")


def _array_ext_problem(payload: bytes) -> str | None:
    """What is wrong with flax's encoding of an array, ``[shape, dtype name, data]``: a shape of at most 32
    non-negative integers, a numeric dtype, data of exactly shape x itemsize bytes; None when it is right."""
    tag, n, pos = _head(payload, 0)
    if tag != "array" or n != 3:
        return "an array that is not [shape, dtype, data]"
    tag, dims, pos = _head(payload, pos)
    if tag != "array" or dims > 32:
        return "an array whose shape is not a list of at most 32 sizes"
    size = 1
    for _ in range(dims):
        tag, d, pos = _head(payload, pos)
        if tag != "int" or d < 0:
            return "an array whose shape is not a list of sizes"
        size *= d
    tag, length, pos = _head(payload, pos)
    if tag not in ("str", "bin") or length > 32 or pos + length > len(payload):
        return "an array without a dtype name"
    try:
        dtype = np.dtype(payload[pos:pos + length].decode("ascii"))
    except (TypeError, ValueError, UnicodeDecodeError):
        return f"an array of an unknown dtype {payload[pos:pos + length]!r}"
    if dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None:
        return f"an array of dtype {dtype.str}"
    tag, length, pos = _head(payload, pos + length)
    if tag != "bin" or pos + length != len(payload):
        return "an array without its data"
    if length != size * dtype.itemsize:
        return f"an array of {size} {dtype.name} values in {length} bytes"
    return None


def _walk(raw: bytes, pos: int, max_items: int = MAX_ITEMS, max_depth: int = MAX_DEPTH,
          arrays: bool = True) -> int:
    """The end of the msgpack value at ``pos``, found by walking its heads without decoding anything; ValueError
    (saying what is wrong) for more than ``max_items`` values, nesting deeper than ``max_depth``, a length or
    count past the end of ``raw``, or (``arrays``) an inconsistent array (:func:`_array_ext_problem`)."""
    items, pending = 0, [1]  # pending: values still to walk at each open level
    while pending:
        if not pending[-1]:
            pending.pop()
            continue
        pending[-1] -= 1
        items += 1
        if items > max_items:
            raise ValueError(f"more than {max_items} values")
        tag, value, pos = _head(raw, pos)
        if tag in ("str", "bin"):
            pos += value
        elif tag == "ext":
            kind, length = value
            if arrays and kind in _ARRAY_EXTS and pos + length <= len(raw):
                problem = _array_ext_problem(raw[pos:pos + length])
                if problem:
                    raise ValueError(f"{problem} at byte {pos}")
            pos += length
        elif tag in ("array", "map"):
            children = value * (2 if tag == "map" else 1)
            if children > len(raw) - pos:  # every value takes at least a byte
                raise ValueError(f"a {tag} of {value} entries in {len(raw) - pos} bytes")
            if children:
                if len(pending) > max_depth:
                    raise ValueError(f"nested more than {max_depth} deep")
                pending.append(children)
        if pos > len(raw):
            raise ValueError("cut short")
    return pos


def msgpack_problem(raw: bytes, max_items: int = MAX_ITEMS, max_depth: int = MAX_DEPTH) -> str | None:
    """What is wrong with ``raw`` as one msgpack document a checkpoint may be (:func:`_walk`'s bounds, and
    nothing after the document); None when it is fine. Decoding such a document allocates about its size."""
    try:
        end = _walk(raw, 0, max_items, max_depth)
    except ValueError as e:
        return str(e)
    return f"{len(raw) - end} bytes after the document" if end != len(raw) else None


def head_entries(head: bytes) -> dict:
    """The entries of the top-level map that lie wholly within ``head`` (a checkpoint's first bytes), decoded,
    up to the first that does not; {} when ``head`` starts no map. dl2d writes the keys sorted (flax's
    serialisation), so config and format (a few hundred bytes) are known before the arrays are read."""
    out: dict = {}
    try:
        tag, n, pos = _head(head, 0)
        if tag != "map":
            return out
        for _ in range(n):
            key_end = _walk(head, pos, max_items=1)
            end = _walk(head, key_end, max_items=HEAD_BYTES)
            key = serialization.msgpack_restore(head[pos:key_end])
            if isinstance(key, str):
                out[key] = serialization.msgpack_restore(head[key_end:end])
            pos = end
    except Exception:  # cut short by the head's end, or garbage: what came before stands
        pass
    return out
