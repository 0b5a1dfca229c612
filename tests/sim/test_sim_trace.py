"""Traces: seeded generation (arrival patterns, epochs, estimate error, interference), and the JSON / CSV
files: exact round trips, and every kind of bad file rejected with a TraceError that says where and why."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dl2d.sim import trace as T
from dl2d.workload.jobtypes import JOB_TYPES, MAX_EPOCHS, TYPE_NAMES


def same(a: T.Trace, b: T.Trace) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f))
               for f in ("arrival_slot", "type_idx", "est_epochs", "true_epochs", "speed_factor"))


# ---------------------------------------------------------------- generation

def test_same_seed_same_trace_other_seed_other_trace():
    cfg = T.TraceConfig(num_jobs=50)
    assert same(T.generate(cfg, seed=3), T.generate(cfg, seed=3))
    a, b = T.generate(cfg, seed=3), T.generate(cfg, seed=4)
    assert not np.array_equal(a.speed_factor, b.speed_factor) and not np.array_equal(a.type_idx, b.type_idx)
    assert a.config["seed"] == 3 and a.config["num_jobs"] == 50


@pytest.mark.parametrize("pattern", ["daily", "uniform", "poisson"])
def test_arrivals_are_sorted_and_capped_per_slot(pattern):
    tr = T.generate(T.TraceConfig(num_jobs=300, max_arrivals_per_slot=4, arrival_pattern=pattern), seed=1)
    assert len(tr) == 300 and np.all(np.diff(tr.arrival_slot) >= 0)
    per_slot = np.bincount(tr.arrival_slot)
    assert per_slot.max() <= 4
    if pattern == "uniform":  # the maximum every slot
        assert np.all(per_slot == 4) and tr.arrival_slot[0] == 0


def test_daily_pattern_is_busy_in_the_afternoon_and_quiet_at_night():
    slots_per_hour = T.SLOTS_PER_DAY // 24
    rate = T.daily_rate(np.arange(T.SLOTS_PER_DAY))
    assert rate[3 * slots_per_hour] == pytest.approx(0.25)  # 3 am
    assert rate[15 * slots_per_hour] == pytest.approx(1.0)  # 3 pm
    tr = T.generate(T.TraceConfig(num_jobs=3000, max_arrivals_per_slot=3), seed=0)
    counts = np.bincount(tr.arrival_slot)[: (len(np.bincount(tr.arrival_slot)) // T.SLOTS_PER_DAY) * T.SLOTS_PER_DAY]
    by_slot_of_day = counts.reshape(-1, T.SLOTS_PER_DAY).mean(axis=0)
    # a random phase offset shifts the day, but the busiest 6 hours carry clearly more than the quietest 6
    hours6 = 6 * slots_per_hour
    windows = np.array([np.roll(by_slot_of_day, -k)[:hours6].sum() for k in range(T.SLOTS_PER_DAY)])
    assert windows.max() > 2 * windows.min()


def test_dl2_epochs_follow_the_type_and_estimates_err_within_the_bound():
    cfg = T.TraceConfig(num_jobs=400, epoch_estimate_error=0.2)
    tr = T.generate(cfg, seed=5)
    typical = np.array([JOB_TYPES[t].epochs_fraction * MAX_EPOCHS for t in tr.type_idx])
    assert np.all(tr.est_epochs >= 0.9 * typical - 0.01) and np.all(tr.est_epochs <= 1.1 * typical + 0.01)
    ratio = tr.true_epochs / tr.est_epochs
    assert np.all(np.abs(ratio - 1) <= 0.2 + 1e-12) and np.std(ratio) > 0.05
    exact = T.generate(T.TraceConfig(num_jobs=400), seed=5)
    assert np.array_equal(exact.true_epochs, exact.est_epochs)
    # tens to hundreds of epochs
    assert 10 <= exact.est_epochs.min() and exact.est_epochs.max() <= MAX_EPOCHS * 1.1


def test_weibull_epochs_are_long_tailed_and_within_bounds():
    tr = T.generate(T.TraceConfig(num_jobs=2000, epochs_model="weibull"), seed=2)
    assert tr.est_epochs.min() >= 1.0 and tr.est_epochs.max() <= MAX_EPOCHS
    assert np.mean(tr.est_epochs) > np.median(tr.est_epochs)  # skewed to the right


def test_interference_factor_is_seeded_lognormal_with_mean_one():
    tr = T.generate(T.TraceConfig(num_jobs=5000, interference_sigma=0.27), seed=9)
    assert np.mean(tr.speed_factor) == pytest.approx(1.0, abs=0.02)
    assert np.std(np.log(tr.speed_factor)) == pytest.approx(0.27, rel=0.05)
    assert np.all(T.generate(T.TraceConfig(num_jobs=50, interference_sigma=0), seed=9).speed_factor == 1.0)


def test_job_types_can_be_restricted_with_paper_aliases():
    tr = T.generate(T.TraceConfig(num_jobs=100, job_types=("ctc", "resnet50")), seed=0)
    assert {TYPE_NAMES[t] for t in tr.type_idx} == {"cnn-text-classification", "resnet-50"}


@pytest.mark.parametrize("kwargs, message", [
    ({"num_jobs": 0}, "num_jobs must be at least 1"),
    ({"max_arrivals_per_slot": 0}, "max_arrivals_per_slot must be at least 1"),
    ({"arrival_pattern": "bursty"}, "arrival_pattern must be daily, uniform or poisson, not 'bursty'"),
    ({"epochs_model": "pareto"}, "epochs_model must be dl2 or weibull"),
    ({"epoch_estimate_error": 1.0}, r"epoch_estimate_error must be in \[0, 1\)"),
    ({"interference_sigma": -0.1}, "interference_sigma must be >= 0"),
    ({"job_types": ("bert",)}, "unknown job type 'bert'"),
])
def test_bad_trace_configs_are_rejected(kwargs, message):
    with pytest.raises(T.TraceError, match=message):
        T.TraceConfig(**kwargs)


# ---------------------------------------------------------------- files

@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_save_load_round_trip_is_exact(tmp_path, suffix):
    tr = T.generate(T.TraceConfig(num_jobs=60, epoch_estimate_error=0.3, arrival_pattern="poisson"), seed=11)
    path = tmp_path / f"jobs{suffix}"
    T.save(tr, path)
    back = T.load(path)
    assert same(tr, back)
    if suffix == ".json":
        assert back.config == json.loads(json.dumps(tr.config))
        assert json.loads(path.read_text())["format"] == "dl2d-trace"
    else:
        assert path.read_text().splitlines()[0] == ",".join(T.CSV_FIELDS)
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def test_load_sorts_by_arrival_keeping_file_order_on_ties(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_slot,type,est_epochs,true_epochs,speed_factor\n"
                    "3,wlm,10,10,1\n0,dssm,20,20,1\n3,vgg16,30,30,1\n")
    tr = T.load(path)
    assert tr.arrival_slot.tolist() == [0, 3, 3]
    assert [TYPE_NAMES[t] for t in tr.type_idx] == ["dssm", "wlm", "vgg-16"]
    assert tr.est_epochs.tolist() == [20, 10, 30]


JOB = {"arrival_slot": 0, "type": "wlm", "est_epochs": 10, "true_epochs": 12, "speed_factor": 1.0}


def json_doc(jobs=None, **top):
    return json.dumps({"format": "dl2d-trace", "version": 1, "jobs": [JOB] if jobs is None else jobs, **top})


@pytest.mark.parametrize("name, text, message", [
    ("t.txt", "x", "trace files must end in .json or .csv"),
    ("t.json", "{not json", r"not valid JSON \(line 1"),
    ("t.json", json.dumps({"jobs": []}), 'not a dl2d-trace file'),
    ("t.json", json.dumps([JOB]), 'not a dl2d-trace file'),
    ("t.json", json_doc(version=2), "trace format version 2 is not supported"),
    ("t.json", json_doc(jobs={"a": 1}), '"jobs" must be a list'),
    ("t.json", json_doc(jobs=[]), "no jobs"),
    ("t.json", json_doc(config=[1, 2]), '"config" must be an object'),
    ("t.json", json_doc(jobs=[JOB, 5]), "job 2: expected an object"),
    ("t.json", json_doc(jobs=[JOB, {**JOB, "type": "gpt-17"}]), "job 2: unknown model 'gpt-17'"),
    ("t.json", json_doc(jobs=[JOB, {**JOB, "type": "bert"}]), "job 2: missing field 'batch_size'"),
    ("t.json", json_doc(jobs=[{**JOB, "requested_workers": 0}]), "job 1: field 'requested_workers' must be >= 1 and <= 4096, got 0"),
    ("t.json", json_doc(jobs=[{k: v for k, v in JOB.items() if k != "est_epochs"}]), "job 1: missing field 'est_epochs'"),
    ("t.json", json_doc(jobs=[{**JOB, "true_epochs": "lots"}]), "job 1: field 'true_epochs' is not a number: 'lots'"),
    ("t.json", json_doc(jobs=[{**JOB, "arrival_slot": 1.5}]), "job 1: field 'arrival_slot' must be an integer"),
    ("t.json", json_doc(jobs=[{**JOB, "arrival_slot": -1}]), "job 1: field 'arrival_slot' must be >= 0"),
    ("t.json", json_doc(jobs=[{**JOB, "arrival_slot": True}]), "job 1: field 'arrival_slot' is not a number"),
    ("t.json", json_doc(jobs=[{**JOB, "est_epochs": 0}]), "job 1: field 'est_epochs' must be >= 0.01 and <= 10000, got 0"),
    ("t.json", json_doc(jobs=[{**JOB, "speed_factor": float("inf")}]), "job 1: field 'speed_factor' must be finite"),
    ("t.csv", "", "CSV header lacks column.*arrival_slot"),
    ("t.csv", "arrival_slot,type,est_epochs,true_epochs\n0,wlm,1,1\n", r"CSV header lacks column\(s\) speed_factor"),
    ("t.csv", "arrival_slot,type,est_epochs,true_epochs,speed_factor\n0,wlm,1,1\n", "job 1: missing field 'speed_factor'"),
    ("t.csv", "arrival_slot,type,est_epochs,true_epochs,speed_factor\n0,wlm,1,1,1\nx,wlm,1,1,1\n",
     "job 2: field 'arrival_slot' is not a number: 'x'"),
    ("t.csv", "arrival_slot,type,est_epochs,true_epochs,speed_factor\n", "no jobs"),
])
def test_bad_trace_files_raise_trace_error_saying_where(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(T.TraceError, match=message) as e:
        T.load(path)
    assert str(path) in str(e.value)


def test_unreadable_and_binary_files_raise_trace_error(tmp_path):
    with pytest.raises(T.TraceError, match="cannot read trace"):
        T.load(tmp_path / "missing.json")
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xff\xfe\x00arrival_slot")
    with pytest.raises(T.TraceError, match="not a text file"):
        T.load(path)


def test_save_refuses_unknown_extensions(tmp_path):
    with pytest.raises(T.TraceError, match="must end in .json or .csv"):
        T.save(T.generate(T.TraceConfig(num_jobs=2), seed=0), tmp_path / "t.yaml")


def test_trace_columns_must_agree():
    with pytest.raises(T.TraceError, match="trace column est_epochs has 1 rows, expected 2"):
        T.Trace(np.array([0, 1]), np.array([0, 0]), np.array([1.0]), np.array([1.0, 1.0]), np.ones(2))
    with pytest.raises(T.TraceError, match="sorted by arrival_slot"):
        T.Trace(np.array([1, 0]), np.array([0, 0]), np.ones(2), np.ones(2), np.ones(2))
