"""Trace files are bounded: size, JSON containers, job count and every field's range are
checked as the file is read, before anything is built from it, and every rejection is a TraceError naming
the line or job and the field; `dl2ctl sim --trace` turns it into one line with exit code 2."""
from __future__ import annotations

import json
import os
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dl2d.cli.main import cli
from dl2d.sim import trace as T

JOB = {"arrival_slot": 0, "type": "wlm", "est_epochs": 10, "true_epochs": 12, "speed_factor": 1.0}
AR_JOB = {**JOB, "type": "cifar10", "batch_size": 128, "requested_workers": 2}
CSV_HEAD = "arrival_slot,type,est_epochs,true_epochs,speed_factor\n"


def json_doc(jobs) -> str:
    return json.dumps({"format": "dl2d-trace", "version": 1, "jobs": jobs})


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(T.TraceError) as e:
        T.load(path)
    msg = str(e.value)
    assert msg.startswith(str(path)) and "\n" not in msg and len(msg) < 400, msg
    return msg


# ---------------------------------------------------------------- the two cases

def test_a_200k_job_trace_is_refused_at_the_job_limit_quickly_and_in_bounded_memory(tmp_path):
    path = write(tmp_path, "big.csv", CSV_HEAD + "0,wlm,1,1,1\n" * 200_000)  # 2.4 MB: under the size bound
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        msg = load_error(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"line {T.MAX_TRACE_JOBS + 2}: more than {T.MAX_TRACE_JOBS} jobs" in msg
    assert time.perf_counter() - t0 < 20
    assert peak < 100 * 2 ** 20  # the 50 000 rows read (25 MB), not 200 000


def test_speed_factor_1e_300_is_refused_naming_the_job_and_the_field(tmp_path):
    path = write(tmp_path, "slow.json", json_doc([JOB, {**JOB, "speed_factor": 1e-300}]))
    msg = load_error(path)
    assert "job 2: field 'speed_factor' must be >= 0.01 and <= 100, got 1e-300" in msg


def test_dl2ctl_sim_reports_a_bad_trace_in_one_line_with_exit_code_2(tmp_path):
    path = write(tmp_path, "slow.csv", CSV_HEAD + "0,wlm,1,1,1\n3,wlm,1,1,1e-300\n")
    r = CliRunner().invoke(cli, ["sim", "--trace", str(path)])
    assert r.exit_code == 2, r.output
    assert "line 3, job 2: field 'speed_factor' must be >= 0.01" in r.output and "Traceback" not in r.output


def test_dl2ctl_sim_reports_a_simulation_that_cannot_finish_as_one_line(tmp_path, monkeypatch):
    """Bounds make a trace sane, not every setting (a 1e-9 s slot never finishes a job): the engine's give-up
    is a clear message with exit code 1, not a traceback."""
    from dl2d.sim import engine

    def starving(*_a, **_k):
        raise engine.DidNotFinish(50000, 0, 1)

    monkeypatch.setattr(engine, "run", starving)
    path = write(tmp_path, "ok.csv", CSV_HEAD + "0,wlm,1,1,1\n")
    r = CliRunner().invoke(cli, ["sim", "--trace", str(path), "--slot-seconds", "1e-9"])
    assert r.exit_code == 1, r.output
    assert "did not finish within 50000 slots" in r.output and "too long or too slow" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


# ---------------------------------------------------------------- the file's size and shape

def test_files_over_the_size_bound_are_refused_without_reading_them_whole(tmp_path):
    path = tmp_path / "huge.json"
    with path.open("wb") as f:  # sparse: 1 GB that reads as NUL bytes
        f.truncate(2 ** 30)
    tracemalloc.start()
    try:
        msg = load_error(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"larger than {T.MAX_TRACE_BYTES} bytes" in msg
    assert peak < 3 * T.MAX_TRACE_BYTES


def test_a_device_or_a_fifo_posing_as_a_trace_is_refused_unread(tmp_path):
    """/dev/zero never ends (and says it is empty), a FIFO blocks its reader: neither is read at all."""
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    link = tmp_path / "zero.csv"
    os.symlink("/dev/zero", link)
    assert "cannot read trace (it is a character device, not a regular file)" in load_error(link)
    os.mkfifo(tmp_path / "fifo.json")
    assert "cannot read trace (it is a named pipe (FIFO), not a regular file)" in load_error(tmp_path / "fifo.json")


@pytest.mark.parametrize("text, message", [
    ("[{}" + ",{}" * 60_000 + "]", "JSON objects and lists; a trace has at most 50000 jobs"),
    (json_doc([0] * 60_000), "60000 jobs; a trace has at most 50000"),
    ("[" * 5000 + "]" * 5000, "nested too deeply"),
    ('{"format": "dl2d-trace", "version": ' + "9" * 5000 + "}", "not valid JSON (Exceeds the limit"),
    ('{"format": "dl2d-trace", "version": 1, "jobs": [' + json.dumps(JOB)[:-1] + ', "x": NaN',
     "not valid JSON (line 1"),
], ids=["60k-empty-objects", "60k-scalar-jobs", "nesting-5000", "5000-digit-integer", "truncated"])
def test_json_bombs_are_refused_before_or_while_parsing(tmp_path, text, message):
    assert message in load_error(write(tmp_path, "bomb.json", text))


def test_non_utf8_files_name_the_line(tmp_path):
    path = write(tmp_path, "t.csv", CSV_HEAD.encode() + b"0,wlm,1,1,1\n0,wl\xffm,1,1,1\n")
    assert "not a text file (line 3: byte" in load_error(path)


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    path = write(tmp_path, "t.csv", b"\xef\xbb\xbf" + CSV_HEAD.encode() + b"0,wlm,1,1,1\n")
    assert len(T.load(path)) == 1


def test_csv_fields_beyond_the_csv_module_limit_are_refused_naming_the_line(tmp_path):
    path = write(tmp_path, "t.csv", CSV_HEAD + "0,wlm,1,1,1\n0," + "x" * 200_000 + ",1,1,1\n")
    assert "line 3: not valid CSV (field larger than field limit" in load_error(path)


# ---------------------------------------------------------------- every field's range and type

@pytest.mark.parametrize("field, value, message", [
    ("arrival_slot", T.MAX_ARRIVAL_SLOT + 1, "must be >= 0 and <= 40000, got 40001"),
    ("arrival_slot", -1, "must be >= 0 and <= 40000"),
    ("arrival_slot", 2.5, "must be an integer, got 2.5"),
    ("est_epochs", 0.001, "must be >= 0.01 and <= 10000"),
    ("est_epochs", 1e6, "must be >= 0.01 and <= 10000, got 1000000.0"),
    ("true_epochs", 5e-324, "must be >= 0.01"),
    ("true_epochs", 10_001, "must be >= 0.01 and <= 10000"),
    ("speed_factor", 1e-300, "must be >= 0.01 and <= 100"),
    ("speed_factor", 101, "must be >= 0.01 and <= 100"),
    ("speed_factor", 0, "must be >= 0.01"),
    ("requested_workers", 0, "must be >= 1 and <= 4096"),
    ("requested_workers", 4097, "must be >= 1 and <= 4096"),
    ("requested_workers", 1.5, "must be an integer"),
    ("batch_size", -1, "must be >= 0 and <= 1048576"),
    ("batch_size", 2 ** 20 + 1, "must be >= 0 and <= 1048576"),
    ("est_epochs", float("nan"), "must be finite, got nan"),
    ("true_epochs", float("-inf"), "must be finite"),
    ("speed_factor", True, "is not a number: True"),
    ("est_epochs", [1], "is not a number: a JSON list"),
    ("est_epochs", {"a": 1}, "is not a number: a JSON object"),
    ("est_epochs", "ten", "is not a number: 'ten'"),
    ("est_epochs", "1" * 1000, "must be finite"),  # a numeric string beyond float range
    ("arrival_slot", 10 ** 1000, "must be >= 0 and <= 40000, got an integer of 1001 digits"),
    ("arrival_slot", 2 ** 64, "must be >= 0 and <= 40000, got an integer of 20 digits"),
    ("arrival_slot", 2 ** 63 - 1, "must be >= 0 and <= 40000, got 9223372036854775807"),
    ("est_epochs", None, "missing field 'est_epochs'"),
])
def test_every_numeric_field_is_range_checked_naming_the_job_and_the_field(tmp_path, field, value, message):
    path = write(tmp_path, "t.json", json_doc([JOB, {**JOB, field: value}]))
    msg = load_error(path)
    assert f"job 2: field {field!r} {message}" in msg or f"job 2: {message}" in msg, msg


def test_an_all_reduce_job_needs_a_positive_batch(tmp_path):
    path = write(tmp_path, "t.json", json_doc([{**AR_JOB, "batch_size": 0}]))
    assert "job 1: field 'batch_size' must be > 0 and <= 1048576, got 0" in load_error(path)


@pytest.mark.parametrize("value, message", [
    (["wlm"], "field 'type' must be a model name, got a JSON list"),
    (7, "field 'type' must be a model name, got 7"),
    ("x" * 1_000_000, "unknown model 'xxxxxxxx"),
    ("", "missing field 'type'"),
])
def test_the_type_field_must_be_a_short_model_name(tmp_path, value, message):
    assert message in load_error(write(tmp_path, "t.json", json_doc([{**JOB, "type": value}])))


def test_values_at_the_bounds_are_accepted(tmp_path):
    jobs = [{**AR_JOB, "arrival_slot": 0, "est_epochs": T.MIN_EPOCHS, "true_epochs": T.MAX_TRACE_EPOCHS,
             "speed_factor": T.MIN_SPEED_FACTOR, "batch_size": T.MAX_BATCH_SIZE, "requested_workers": 1},
            {**JOB, "arrival_slot": T.MAX_ARRIVAL_SLOT, "est_epochs": "10000", "true_epochs": T.MIN_EPOCHS,
             "speed_factor": T.MAX_SPEED_FACTOR, "batch_size": 0, "requested_workers": T.MAX_REQUESTED_WORKERS}]
    tr = T.load(write(tmp_path, "t.json", json_doc(jobs)))
    assert tr.arrival_slot.tolist() == [0, T.MAX_ARRIVAL_SLOT]
    assert tr.requested.tolist() == [1, T.MAX_REQUESTED_WORKERS]
    assert np.allclose(tr.speed_factor, [T.MIN_SPEED_FACTOR, T.MAX_SPEED_FACTOR])


def test_a_50000_job_trace_as_dl2d_writes_it_fits_every_bound(tmp_path):
    tr = T.generate(T.TraceConfig(num_jobs=T.MAX_TRACE_JOBS, max_arrivals_per_slot=10), seed=1)
    for suffix in (".json", ".csv"):
        path = tmp_path / f"t{suffix}"
        T.save(tr, path)
        assert path.stat().st_size <= T.MAX_TRACE_BYTES
        assert len(T.load(path)) == T.MAX_TRACE_JOBS
