"""Property-based fuzzing of the trace loader: random files and mutations of valid
traces (fields given wrong types, out-of-range, NaN/inf, bool or huge values, fields deleted, jobs replaced or
nested; then the text truncated, bytes flipped or inserted, digit runs and bracket runs inserted) end in a Trace
within every stated bound or a one-line TraceError naming the file; never another exception, a hang (a
deadline per example) or an allocation beyond a few times the file's size (traced per example)."""
from __future__ import annotations

import csv
import io
import json
import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl2d.sim import trace as T
from dl2d.workload.catalog import IS_ALLREDUCE

#: Examples per run (about 20 s in all on a 2-core machine); deadline: 5 s for any one example.
JSON_EXAMPLES, CSV_EXAMPLES, RANDOM_EXAMPLES = 1000, 800, 500


def fuzz(n: int):
    return settings(max_examples=n, deadline=5000,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


FIELDS = T.CSV_FIELDS[1:] + T.OPTIONAL_FIELDS
EDGES = [0, -0.0, -1, 1e-300, 5e-324, 1e300, 2 ** 31, 2 ** 63, 2 ** 64, 10 ** 400, T.MAX_ARRIVAL_SLOT + 1,
         T.MAX_TRACE_EPOCHS * (1 + 1e-9), T.MIN_EPOCHS * (1 - 1e-9), T.MIN_SPEED_FACTOR, T.MAX_SPEED_FACTOR,
         T.MAX_BATCH_SIZE + 1, T.MAX_REQUESTED_WORKERS + 1, "1e400", "nan", "-inf", "0x10", " 12 ", "1_000", "١٢",
         "wlm", True, False, None, ""]
_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10 ** 1200),
                                                                         max_value=10 ** 1200),
                    st.floats(), st.text(max_size=12), st.sampled_from(EDGES))
WILD = st.recursive(_scalar, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids,
                                                                                       max_size=3), max_leaves=8)
#: In-range values of every field, so that mutations start from valid traces of every kind.
VALID_JOB = st.fixed_dictionaries({
    "arrival_slot": st.integers(0, T.MAX_ARRIVAL_SLOT),
    "type": st.sampled_from(["resnet-50", "vgg-16", "wlm", "dssm", "cifar10", "bert", "imagenet", "ncf"]),
    "est_epochs": st.floats(T.MIN_EPOCHS, T.MAX_TRACE_EPOCHS),
    "true_epochs": st.floats(T.MIN_EPOCHS, T.MAX_TRACE_EPOCHS),
    "speed_factor": st.floats(T.MIN_SPEED_FACTOR, T.MAX_SPEED_FACTOR),
    "batch_size": st.floats(1, T.MAX_BATCH_SIZE),
    "requested_workers": st.integers(1, T.MAX_REQUESTED_WORKERS),
})


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@st.composite
def mutated_jobs(draw) -> list:
    jobs: list = draw(st.lists(VALID_JOB, min_size=1, max_size=5))
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(jobs) - 1))
        op = draw(st.sampled_from(["set", "set", "edge", "delete", "replace", "nest"]))
        if not isinstance(jobs[i], dict):
            continue
        if op == "set":
            jobs[i][draw(st.sampled_from(FIELDS + ("id", "extra")))] = draw(WILD)
        elif op == "edge":
            jobs[i][draw(st.sampled_from(FIELDS))] = draw(st.sampled_from(EDGES))
        elif op == "delete":
            jobs[i].pop(draw(st.sampled_from(FIELDS)), None)
        elif op == "replace":
            jobs[i] = draw(WILD)
        else:
            jobs[i] = [jobs[i]] if draw(st.booleans()) else {"job": jobs[i]}
    return jobs


@st.composite
def damaged(draw, text: str) -> bytes:
    """Byte-level damage: truncation, flips, insertions, long digit and bracket runs."""
    data = bytearray(text.encode())
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["truncate", "flip", "insert", "digits", "brackets", "duplicate"]))
        at = draw(st.integers(0, len(data)))
        if op == "truncate":
            del data[at:]
        elif op == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "digits":
            data[at:at] = b"9" * draw(st.integers(300, 6000))
        elif op == "brackets":
            data[at:at] = draw(st.sampled_from([b"[", b"{", b'{"a":'])) * draw(st.integers(100, 3000))
        elif op == "duplicate":
            data[at:at] = data[:at][-200:]
    return bytes(data)


@st.composite
def json_files(draw) -> bytes:
    doc = {"format": "dl2d-trace", "version": 1, "config": {"seed": 1}, "jobs": draw(mutated_jobs())}
    if draw(st.integers(0, 5)) == 0:  # the document's own fields
        doc[draw(st.sampled_from(["format", "version", "config", "jobs"]))] = draw(WILD)
    return draw(damaged(json.dumps(doc)))  # json.dumps writes NaN / Infinity: the loader must refuse them


@st.composite
def csv_files(draw) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    header = draw(st.permutations(FIELDS)) if draw(st.booleans()) else FIELDS
    w.writerow(header)
    for job in draw(mutated_jobs()):
        row = [job.get(f, "") if isinstance(job, dict) else job for f in header]
        w.writerow(row if draw(st.integers(0, 4)) else row[:draw(st.integers(0, 7))])  # sometimes a short row
    return draw(damaged(buf.getvalue()))


def check_within_bounds(tr: T.Trace) -> None:
    """What an accepted trace guarantees the simulator."""
    n = len(tr)
    assert 1 <= n <= T.MAX_TRACE_JOBS
    assert tr.arrival_slot.dtype.kind == "i"
    assert np.all((tr.arrival_slot >= 0) & (tr.arrival_slot <= T.MAX_ARRIVAL_SLOT))
    assert np.all(np.diff(tr.arrival_slot) >= 0)
    for col in (tr.est_epochs, tr.true_epochs):
        assert np.all((col >= T.MIN_EPOCHS) & (col <= T.MAX_TRACE_EPOCHS))
    assert np.all((tr.speed_factor >= T.MIN_SPEED_FACTOR) & (tr.speed_factor <= T.MAX_SPEED_FACTOR))
    assert np.all((tr.batch_size >= 0) & (tr.batch_size <= T.MAX_BATCH_SIZE))
    assert np.all(tr.batch_size[IS_ALLREDUCE[tr.type_idx]] > 0)
    assert np.all((tr.requested >= 1) & (tr.requested <= T.MAX_REQUESTED_WORKERS))


def load_or_reject(path, data: bytes) -> str:
    path.write_bytes(data)
    tracemalloc.start()
    try:
        try:
            tr = T.load(path)
        except T.TraceError as e:
            msg = str(e)
            assert msg.startswith(str(path)) and "\n" not in msg and len(msg) < 600, msg
            return "rejected"
        finally:
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        assert peak < 2 * 2 ** 20 + 100 * len(data), (peak, len(data))  # linear in what the file holds
    check_within_bounds(tr)
    return "accepted"


@fuzz(JSON_EXAMPLES)
@given(data=json_files())
def test_mutated_json_traces_load_within_bounds_or_are_rejected_cleanly(workdir, data):
    load_or_reject(workdir / "t.json", data)


@fuzz(CSV_EXAMPLES)
@given(data=csv_files())
def test_mutated_csv_traces_load_within_bounds_or_are_rejected_cleanly(workdir, data):
    load_or_reject(workdir / "t.csv", data)


@fuzz(RANDOM_EXAMPLES)
@given(data=st.binary(max_size=400), suffix=st.sampled_from([".json", ".csv"]))
def test_random_bytes_are_rejected_cleanly(workdir, data, suffix):
    load_or_reject(workdir / f"r{suffix}", data)


@fuzz(200)
@given(jobs=st.lists(VALID_JOB, min_size=1, max_size=8), suffix=st.sampled_from([".json", ".csv"]))
def test_in_range_traces_are_accepted_as_written(workdir, jobs, suffix):
    """The bounds reject nothing that lies within them (so the fuzz above starts from valid traces)."""
    if suffix == ".json":
        data = json.dumps({"format": "dl2d-trace", "version": 1, "jobs": jobs}).encode()
    else:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(jobs)
        data = buf.getvalue().encode()
    assert load_or_reject(workdir / f"v{suffix}", data) == "accepted"
    tr = T.load(workdir / f"v{suffix}")
    assert sorted(tr.requested.tolist()) == sorted(j["requested_workers"] for j in jobs)
    assert math.isclose(float(np.sum(tr.speed_factor)), sum(j["speed_factor"] for j in jobs), rel_tol=1e-9)
