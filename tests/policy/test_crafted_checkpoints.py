"""Crafted checkpoint files cost no more to refuse than a good checkpoint costs to load (docs/security.md).

Each attack a security review ran is reproduced here: a 443-byte DL2 checkpoint whose config asks for the
largest network the bounds allow (refused after 16 s and 1.4 GB while that network was built), the same for
the target-size policy, msgpack structures that decode to many times their size, a Chic .npz holding NaN, a
zip bomb as a Chic config or parameter (a 200 KB archive inflating to 200 MB; 2 MB to 2 GB took 54 s and
2.2 GB), a zip whose directory lies about a member's size, a learned speed table holding NaN or a bomb, and a
FIFO or /dev/zero given to every loader. Each must end in the loader's own one-line error, with a traced
allocation (tracemalloc's peak) of at most twice a normal load's plus SLACK: the crafted file's own bytes (a
normal Chic load traces 0.14 MB, less than a zip bomb's compressed 200 KB) and what JAX's tracing caches
keep of a config not seen before (about 1 MB; a normal load measured warm does not pay it). JAX's buffers are
not traced by tracemalloc, so where a network could be built the test also checks that none is initialised
(only its shapes are worked out) and, on Linux, that the resident set does not grow by hundreds of MB.
Times are not asserted tightly (one 20 s hang guard); docs/security.md gives the figures measured.
"""
from __future__ import annotations

import gc
import io
import json
import os
import struct
import threading
import time
import tracemalloc
import zipfile
from contextlib import suppress
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import serialization

from dl2d.policy.seeds import chic as CH
from dl2d.policy import checkpoint as C
from dl2d.policy.planning import learned_speeds as LS
from dl2d.policy.dl2.config import PolicyConfig
from dl2d.policy.dl2.nets import init_params
from dl2d.policy.elastic.chooser import Chooser

#: Wall-clock bound of any one refusal: a guard against a hang, not a measurement (they take milliseconds).
HANG_GUARD_S = 20.0
MB = 2 ** 20
#: What a refusal may trace beyond twice a normal load's peak (module doc).
SLACK = 2 * MB


def cost(load) -> tuple[str, int]:
    """(the error ``load()`` ended in, "" when it loaded; the traced allocation's peak in bytes)."""
    gc.collect()
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        try:
            load()
            msg = ""
        except (C.CheckpointError, CH.ChicCheckpointError, ValueError) as e:
            msg = str(e)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < HANG_GUARD_S
    return msg, peak


def resident_growth_mb(load) -> float | None:
    """How far the process's peak resident set rose over its resident set while ``load()`` ran (Linux; None
    where the peak cannot be reset). It sees what tracemalloc does not: XLA's buffers."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None

    def status_mb(key: str) -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key + ":"))

    base = status_mb("VmRSS")
    try:
        load()
    except (C.CheckpointError, ValueError):
        pass
    return status_mb("VmHWM") - base


def one_line(msg: str, *parts: str) -> None:
    assert msg and "\n" not in msg, msg
    for part in parts:
        assert part in msg, msg


# ---------------------------------------------------------------- normal loads, the yardstick

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A normal file of every kind (each loaded once, so lazy imports are not counted) and its load's peak."""
    d = tmp_path_factory.mktemp("normal")
    cfg = PolicyConfig()
    params = init_params(cfg, jax.random.PRNGKey(0))
    C.save(d / "dl2.ckpt", C.Checkpoint(cfg, params, C.make_optimizer(cfg.rl_lr).init(params), {"rl_steps": 1}))
    ccfg = CH.ChicConfig()
    CH.save_checkpoint(d / "chic.npz", ccfg, CH.init_params(ccfg), {"note": "x"})
    loads = {"dl2": lambda: C.load(d / "dl2.ckpt"),
             "target": lambda: C.load_target(Path(C.__file__).parent / "target" / "pretrained" / "target-today.msgpack"),
             "chic": lambda: CH.load_checkpoint(d / "chic.npz"),
             "speeds": lambda: LS.load()}
    peaks = {}
    for name, load in loads.items():
        load()
        msg, peaks[name] = cost(load)
        assert msg == "", msg
    return {"dir": d, "peak": peaks, "load": loads}


def test_normal_loads_are_the_yardstick(files):
    """A normal DL2 checkpoint (J = 40, hidden 256, with Adam's state: 7 MB) traces about 14 MB; the shipped
    target policy about 3 MB; a Chic checkpoint and the shipped speed table well under a megabyte."""
    assert files["peak"]["dl2"] < 40 * MB
    assert files["peak"]["chic"] < 2 * MB and files["peak"]["speeds"] < 2 * MB


# ---------------------------------------------------------------- msgpack checkpoints

def _no_network_built(monkeypatch):
    """Calls of the networks' init_params with a concrete key (a network built for real) are recorded."""
    import dl2d.policy.target.policy as T

    built = []
    for module in (C, T):
        real = module.init_params

        def spy(cfg, key, *a, _real=real, **kw):
            if not isinstance(key, jax.core.Tracer):
                built.append(cfg)
            return _real(cfg, key, *a, **kw)

        monkeypatch.setattr(module, "init_params", spy)
    return built


def _dl2_largest(path: Path) -> None:
    """The review's file: a valid config at the weight bound (4 096 jobs of 1 024 types, 14 hidden: 59 M weights
    a network, 1.4 GB with Adam's state) and no parameters."""
    cfg = PolicyConfig(max_jobs=4096, num_types=1024, hidden=14).to_dict()
    path.write_bytes(serialization.msgpack_serialize({"format": C.FORMAT, "version": C.VERSION, "config": cfg,
                                                      "params": {}, "opt_state": None, "meta": {}}))


def _target_largest(path: Path) -> None:
    cfg = {"max_workers": 64, "max_ps": 64, "hidden": 1024, "teacher": "lp-plan", "prior": 0.0,
           "every_count": True, "speed_factor": True}
    path.write_bytes(serialization.msgpack_serialize({"format": C.TARGET_FORMAT, "version": C.TARGET_VERSION,
                                                      "config": cfg, "params": {"x": np.zeros(3, np.float32)},
                                                      "meta": {}}))


@pytest.mark.parametrize("craft, load, kind", [(_dl2_largest, C.load, "dl2"),
                                               (_target_largest, C.load_target, "target")], ids=["dl2", "target"])
def test_a_tiny_checkpoint_asking_for_the_largest_network_is_refused_without_building_it(
        tmp_path, files, monkeypatch, craft, load, kind):
    path = tmp_path / "crafted"
    craft(path)
    assert path.stat().st_size < 600
    built = _no_network_built(monkeypatch)
    msg, peak = cost(lambda: load(path))
    one_line(msg, str(path), "params do not match the config")
    assert peak <= 2 * files["peak"][kind] + SLACK, (peak, files["peak"][kind])
    assert built == []  # only the network's shapes were worked out (jax.eval_shape)
    growth = resident_growth_mb(lambda: load(path))
    if growth is not None:  # building the network took 1.3 GB (dl2) and 0.3 GB (target)
        assert growth < 200, growth


def test_a_real_checkpoint_still_loads_and_builds_no_network_either(files, monkeypatch):
    built = _no_network_built(monkeypatch)
    ck = C.load(files["dir"] / "dl2.ckpt")
    assert ck.config == PolicyConfig() and ck.opt_state is not None and built == []


def _msgpack(head: bytes) -> bytes:
    """A dl2d-policy document whose "meta" value is ``head`` (raw msgpack, maybe a crafted one)."""
    doc = serialization.msgpack_serialize({"format": C.FORMAT, "version": C.VERSION})
    return bytes([0x83]) + doc[1:] + serialization.msgpack_serialize("meta") + head


BLOBS = {
    # 3 M one-byte nils: a 3 MB file decoding to a 24 MB list (20 MB: 181 MB traced before)
    "nil-bomb": (_msgpack(b"\xdd" + (3_000_000).to_bytes(4, "big") + b"\xc0" * 3_000_000), "more than 100000 values"),
    # a list 100 000 deep
    "deep": (_msgpack(b"\x91" * 100_000 + b"\xc0"), "nested more than 32 deep"),
    # a map declaring 4 G entries in a few bytes
    "map-count": (_msgpack(b"\xdf\xff\xff\xff\xff\xc0\xc0"), "a map of 4294967295 entries in 2 bytes"),
    # a flax array declaring 10^9 float32 values in 4 bytes
    "array-shape": (_msgpack(b"\xc7\x15\x01\x93\x91\xce" + (10 ** 9).to_bytes(4, "big") + b"\xa7float32\xc4\x04"
                             + b"\0" * 4), "an array of 1000000000 float32 values in 4 bytes"),
    # a string longer than the file
    "long-string": (_msgpack(b"\xdb\x7f\xff\xff\xff"), "cut short"),
}


@pytest.mark.parametrize("name", sorted(BLOBS))
def test_msgpack_structures_that_decode_to_more_than_their_size_are_found_by_walking_them(name):
    blob, problem = BLOBS[name]
    assert problem in (C.msgpack_problem(blob) or "")


@pytest.mark.parametrize("name", sorted(BLOBS))
def test_such_structures_are_refused_before_decoding(tmp_path, files, name):
    """A small one by the walk; one over HEAD_BYTES already from its head, which holds no config."""
    blob, problem = BLOBS[name]
    path = tmp_path / "m.ckpt"
    path.write_bytes(blob)
    msg, peak = cost(lambda: C.load(path))
    if len(blob) > C.HEAD_BYTES:
        problem = f"no config in its first {C.HEAD_BYTES} bytes"
    one_line(msg, "not a dl2d policy checkpoint", problem)
    assert peak <= 2 * files["peak"]["dl2"] + SLACK, peak


def test_a_large_file_asking_for_a_small_network_is_refused_from_its_head(tmp_path, files):
    """A real checkpoint's head, then 1 GB (sparse): refused from the head, having read 64 KiB of it."""
    path = tmp_path / "big.ckpt"
    C.save(path, C.Checkpoint(PolicyConfig(max_jobs=4, hidden=8),
                              init_params(PolicyConfig(max_jobs=4, hidden=8), jax.random.PRNGKey(0))))
    with open(path, "r+b") as f:
        f.truncate(2 ** 30)
    msg, peak = cost(lambda: C.load(path))
    one_line(msg, f"{2 ** 30} bytes, more than the", "a checkpoint of its config can have")
    assert peak < MB, peak


# ---------------------------------------------------------------- .npz files (Chic, learned speed tables)

def npy(array) -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array(b, np.asanyarray(array), allow_pickle=False)
    return b.getvalue()


def npy_header(shape, descr: str) -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, {"descr": descr, "fortran_order": False, "shape": shape})
    return b.getvalue()


def zeros_member(zf: zipfile.ZipFile, name: str, header: bytes, nbytes: int) -> None:
    """A member of ``header`` and ``nbytes`` zero bytes, written through zipfile's streaming writer a megabyte
    at a time (the test itself never holds the inflated member)."""
    chunk = bytes(MB)
    with zf.open(name, "w") as f:
        f.write(header)
        for left in range(nbytes, 0, -MB):
            f.write(chunk[:min(MB, left)])


BOMB = 200 * MB


def chic_archive(path: Path, members: dict[str, bytes], bomb: tuple[str, bytes] | None = None) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name + ".npy", data)
        if bomb:
            zeros_member(zf, bomb[0] + ".npy", bomb[1], BOMB)


def chic_members(cfg=CH.ChicConfig(), params=None) -> dict[str, bytes]:
    params = CH.init_params(cfg) if params is None else params
    return {"format": npy(np.array(CH.FORMAT)), "version": npy(np.array(CH.VERSION)),
            "config": npy(np.array(json.dumps(cfg.to_dict()))), "meta": npy(np.array("{}")),
            **{f"param/{k}": npy(v) for k, v in params.items()}}


def lie_about_size(path: Path, member: str, size: int) -> None:
    """Rewrite the zip's central directory entry of ``member`` to declare ``size`` uncompressed bytes."""
    data = bytearray(path.read_bytes())
    eocd = data.rfind(b"PK\x05\x06")
    count, _, at = struct.unpack_from("<HLL", data, eocd + 10)
    for _ in range(count):
        n, m, k = struct.unpack_from("<HHH", data, at + 28)
        if data[at + 46:at + 46 + n] == member.encode():
            struct.pack_into("<L", data, at + 24, size)
            path.write_bytes(bytes(data))
            return
        at += 46 + n + m + k
    raise AssertionError(f"{member} not in the directory")


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    """Zip bombs of 200 MB in about 200 KB: as a Chic config, as a Chic parameter (declared as such, and
    declared as the parameter's true size with 200 MB behind it), as a learned table."""
    d = tmp_path_factory.mktemp("bombs")
    m = chic_members()
    chic_archive(d / "config.npz", {k: m[k] for k in ("format", "version")},
                 ("config", npy_header((BOMB // 8,), "<f8")))
    shape = (CH.ChicConfig().state_dim, CH.ChicConfig().hidden[0])
    header = npy_header(shape, "<f8")
    chic_archive(d / "param.npz", {k: v for k, v in m.items() if k != "param/w0"}, ("param/w0", header))
    chic_archive(d / "lying.npz", {k: v for k, v in m.items() if k != "param/w0"}, ("param/w0", header))
    lie_about_size(d / "lying.npz", "param/w0.npy", len(header) + 8 * shape[0] * shape[1])
    table, counts, meta = LS.load()
    with zipfile.ZipFile(d / "speeds.npz", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("meta.npy", npy(np.array(json.dumps(meta))))
        zf.writestr("counts.npy", npy(counts))
        zeros_member(zf, "table.npy", npy_header((BOMB // 4,), "<f4"), BOMB)
    for f in d.iterdir():
        assert f.stat().st_size < 400_000, f
    return d


@pytest.mark.parametrize("name, parts", [
    ("config", ["bad Chic config: config:", "bytes uncompressed, more than the 262144 allowed"]),
    ("param", ["parameter w0 declares", "its shape (55, 64) needs at most"]),
    ("lying", ["param/w0: unreadable (BadZipFile: Bad CRC-32"]),
], ids=["config", "param", "lying-size"])
def test_a_chic_zip_bomb_is_refused_from_what_it_declares(bombs, files, name, parts):
    msg, peak = cost(lambda: CH.load_checkpoint(bombs / f"{name}.npz"))
    one_line(msg, *parts)
    assert peak <= 2 * files["peak"]["chic"] + SLACK, peak  # (the 200 MB bomb traced 600 MB)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_chic_checkpoint_of_nan_or_infinite_weights_is_refused(tmp_path, files, bad):
    params = CH.init_params(CH.ChicConfig())
    params["w1"][3, 2] = bad
    CH.save_checkpoint(tmp_path / "nan.npz", CH.ChicConfig(), params)
    msg, peak = cost(lambda: CH.load_checkpoint(tmp_path / "nan.npz"))
    one_line(msg, "param/w1 holds NaN or infinite values")
    assert peak <= 2 * files["peak"]["chic"] + SLACK


@pytest.mark.parametrize("change, parts", [
    ({"hidden": [4096, 4096], "num_jobs": 64}, ["make a network of 22,036,609 weights, more than the 16,000,000"]),
    ({"hidden": [8192] * 16, "num_jobs": 4096}, ["more than the 16,000,000"]),  # 8.6 GB of float64
    ({"num_jobs": 2.5}, ["num_jobs must be an integer"]),
    ({"num_jobs": True}, ["num_jobs must be an integer"]),
], ids=["two-4096", "largest", "float-jobs", "bool-jobs"])
def test_a_chic_config_asking_for_a_huge_network_is_refused_before_any_parameter(tmp_path, files, change, parts):
    cfg = {**CH.ChicConfig().to_dict(), **change}
    m = chic_members()
    m["config"] = npy(np.array(json.dumps(cfg)))
    chic_archive(tmp_path / "huge.npz", {k: m[k] for k in ("format", "version", "config")})
    msg, peak = cost(lambda: CH.load_checkpoint(tmp_path / "huge.npz"))
    one_line(msg, "bad Chic config", *parts)
    assert peak <= 2 * files["peak"]["chic"] + SLACK  # (two layers of 4096 built 168 MB)


@pytest.mark.parametrize("member, array, parts", [
    ("param/w0", np.zeros((55, 64), np.int64), ["param/w0: dtype <i8 (want float)"]),
    ("param/w0", np.zeros((64, 55)), ["param/w0: shape (64, 55), expected (55, 64)"]),
    ("param/w0", np.array(["x"] * 10), ["param/w0: dtype <U1 (want float)"]),
    ("config", np.zeros(3), ["bad Chic config: config: dtype <f8 (want text)"]),
    ("version", np.array(2.0), ["not a Chic checkpoint (version: dtype <f8"]),
], ids=["int-weights", "transposed", "text-weights", "float-config", "float-version"])
def test_a_chic_member_of_the_wrong_dtype_or_shape_is_refused_from_its_header(tmp_path, member, array, parts):
    m = chic_members()
    m[member] = npy(array)
    chic_archive(tmp_path / "m.npz", m)
    msg, _ = cost(lambda: CH.load_checkpoint(tmp_path / "m.npz"))
    one_line(msg, *parts)


def test_a_pickled_or_structured_member_is_never_unpickled(tmp_path):
    m = chic_members()
    b = io.BytesIO()
    np.lib.format.write_array(b, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    m["param/w0"] = b.getvalue()
    chic_archive(tmp_path / "p.npz", m)
    one_line(cost(lambda: CH.load_checkpoint(tmp_path / "p.npz"))[0], "param/w0: dtype |O (want float)")


def test_a_learned_speed_table_of_nan_or_a_bomb_is_refused(tmp_path, bombs, files):
    table, counts, meta = LS.load()
    table = table.copy()
    table[2, 3, 4] = np.nan
    LS.save(tmp_path / "nan.npz", table, counts, {k: v for k, v in meta.items() if k not in ("format", "sha256")})
    msg, peak = cost(lambda: LS.load(tmp_path / "nan.npz"))
    one_line(msg, "not a learned speed table (table holds NaN or infinite values)")
    assert peak <= 2 * files["peak"]["speeds"] + SLACK
    msg, peak = cost(lambda: LS.load(bombs / "speeds.npz"))
    one_line(msg, "not a learned speed table (table:", "more than the 8004096 allowed")
    assert peak <= 2 * files["peak"]["speeds"] + SLACK  # (traced 201 MB)


@pytest.mark.parametrize("blob, part", [
    (b"", "too short"),
    (b"PK\x05\x06" + b"\0" * 4 + struct.pack("<HH", 60000, 60000) + struct.pack("<LL", 60000 * 46, 0) + b"\0\0",
     "60000 members, more than the 256"),
    (b"PK\x05\x06" + b"\0" * 4 + struct.pack("<HH", 0xFFFF, 0xFFFF) + struct.pack("<LL", 0, 0) + b"\0\0",
     "a zip64 archive"),
], ids=["empty", "many-members", "zip64"])
def test_a_zip_directory_that_declares_too_much_is_refused_before_zipfile_reads_it(tmp_path, blob, part):
    (tmp_path / "z.npz").write_bytes(blob)
    one_line(cost(lambda: CH.load_checkpoint(tmp_path / "z.npz"))[0], "not a Chic checkpoint", part)


# ---------------------------------------------------------------- files that are no files

LOADERS = {"dl2": (C.load, "cannot read checkpoint"), "target": (C.load_target, "cannot read checkpoint"),
           "chic": (CH.load_checkpoint, "cannot read checkpoint"), "speeds": (LS.load, "not a learned speed table"),
           "chooser": (Chooser.load, "cannot read rule chooser")}


def unblocked_after(fifo: Path, seconds: float) -> threading.Timer:
    """A hang guard for a reader of ``fifo``: after ``seconds`` a writer opens and closes it, so a reader blocked
    on it (a loader that opened it as a file) sees an empty file and fails its test instead of hanging it."""
    def unblock():
        with suppress(OSError):  # no reader waiting: nothing to unblock
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(seconds, unblock)
    timer.daemon = True
    timer.start()
    return timer


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_a_fifo_or_a_device_given_to_any_loader_is_refused_at_once(tmp_path, loader):
    load, part = LOADERS[loader]
    os.mkfifo(tmp_path / "fifo")
    guard = unblocked_after(tmp_path / "fifo", HANG_GUARD_S / 2)
    try:
        one_line(cost(lambda: load(tmp_path / "fifo"))[0], part, "it is a named pipe (FIFO), not a regular file")
    finally:
        guard.cancel()
    if Path("/dev/zero").exists():
        one_line(cost(lambda: load("/dev/zero"))[0], part, "it is a character device, not a regular file")
    one_line(cost(lambda: load(tmp_path))[0], part, "it is a directory, not a regular file")


def test_files_over_each_bound_are_refused_before_they_are_read(tmp_path, monkeypatch):
    """A sparse file of a size past the bound: refused from its size (nothing of it is read)."""
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(C.MAX_POLICY_BYTES + 1)
    msg, peak = cost(lambda: C.load(big))
    one_line(msg, f"larger than {C.MAX_POLICY_BYTES} bytes")
    assert peak < MB
    for load, bound in ((C.load_target, C.MAX_TARGET_BYTES), (CH.load_checkpoint, CH.MAX_CHECKPOINT_BYTES),
                        (LS.load, LS.MAX_FILE_BYTES), (Chooser.load, 1024 * 1024)):
        msg, peak = cost(lambda: load(big))
        one_line(msg, f"larger than {bound} bytes")
        assert peak < MB
