"""`dl2ctl calibrate`: the speed model of a site's own jobs, fitted from the speeds its daemon stored.

The daemon runs on the simulated backend (its truth: the measured throughput of each job's GPUs, the per-slot
noise) with a policy that holds every job at 1, 2, 4, 8, 16 workers for a few slots each; calibrate must give
back the hidden curve of each class at every GPU count it saw."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from dl2d.cli.main import cli
from dl2d.core.contract import Allocation
from dl2d.daemon.config import build_config
from dl2d.daemon.main import build_loop
from dl2d.daemon.sim_backend import Hidden
from dl2d.db.engine import session_scope
from dl2d.db.jobs import submit_job
from dl2d.policy.registry import StatelessPolicy
from dl2d.workload import catalog
from dl2d.workload.calibration import gather
from dl2d.workload.speedfit import (
    SiteSpeeds,
    SpeedModelError,
    anchored_curve,
    load_speed_model,
    parse_speed_model,
)

JOBS = {"cifar": ("cifar10", 512.0, None), "speech": ("deepspeech2", 80.0, "speech-80"), "lone": ("bert", 96.0, None)}
SWEEP, HOLD = (1, 2, 4, 8, 16), 5  # 5 slots at each size: 4 samples (the first holds the resize)
#: The stated tolerance: at every GPU count observed (4 slots there), the calibrated seconds per epoch are
#: within 10 % of the hidden truth at the simulator's default noise (10 % per job and slot); exact without it (to
#: the file's 6 decimals).
TOLERANCE = 0.10


class Feeder:
    hidden = {n: Hidden(1e5, 1.0) for n in JOBS}

    def __call__(self, session, number, now):
        if number == 0:
            for name, (model, batch, label) in JOBS.items():
                submit_job(session, {"name": name, "owner": "bob", "kind": "allreduce", "job_type": model,
                                     "batch_size": batch, "total_epochs": 1e5, "command": "python t.py",
                                     "worker": {"gpus": 1, "cpus": 1, "mem_gb": 1},
                                     **({"label": label} if label else {})}, known_types=())
        return 0


def run_daemon(tmp_path, noise: float) -> str:
    """The daemon on the simulated 16 x 4 GPU cluster; "lone" only runs for its first few slots."""
    cfg = build_config({"state_dir": str(tmp_path), "slot_seconds": 600,
                        "sim": {"cluster": "t4-16", "noise": noise, "resize_overhead_s": 30},
                        "metrics": {"enabled": False}}, {})
    loop = build_loop(cfg, feeder=Feeder())
    slot = [0]

    def sweep(view):
        k = SWEEP[min(slot[0] // HOLD, len(SWEEP) - 1)]
        slot[0] += 1
        lone = list(JOBS).index("lone") + 1  # database ids in submission order
        workers = np.array([k if int(j) != lone or slot[0] <= 3 else 0 for j in view.job_ids], int)
        return Allocation(workers, np.zeros(len(view), int))

    loop.policy = StatelessPolicy(sweep, "sweep")
    loop.run(max_slots=HOLD * len(SWEEP) + 1)
    loop.engine.dispose()
    return cfg.database_url


@pytest.mark.parametrize("noise", [0.0, 0.1])
def test_calibrate_recovers_the_hidden_curves_at_every_gpu_count_it_saw(tmp_path, noise):
    db = run_daemon(tmp_path, noise)
    out = tmp_path / "site.json"
    r = CliRunner().invoke(cli, ["calibrate", "--db", db, "--out", str(out), "--gpus-per-node", "4"])
    assert r.exit_code == 0, r.output
    model = load_speed_model(out)
    assert set(model) == {"cifar10", "speech-80", "bert"}  # a label names its class, else the model
    for cls, (name, batch) in {"cifar10": ("cifar10", 512.0), "speech-80": ("deepspeech2", 80.0)}.items():
        c = model[cls]
        assert c.fitted and sorted(c.observed) == list(SWEEP)
        for g in SWEEP:
            truth = 1.0 / catalog.allreduce_epoch_rate(name, batch, catalog.packed(g, 4))
            got = c.seconds_per_epoch[g]
            assert got == pytest.approx(truth, rel=TOLERANCE if noise else 1e-6), (cls, g, got, truth)
    lone = model["bert"]  # 2 usable slots (its first holds its start): too few to fit, the stated prior
    assert not lone.fitted and sum(n for n, _ in lone.observed.values()) == 2
    assert "prior" in r.output and "speech-80" in r.output and f"wrote {out}" in r.output
    doc = json.loads(out.read_text())
    assert doc["format"] == "dl2d-speed-model" and doc["version"] == 1 and len(doc["classes"]["cifar10"]
                                                                              ["seconds_per_epoch"]) == 64
    # the daemon stored how many nodes each job spanned, each slot (calibrate's packed vs spread)
    from dl2d.db.engine import make_engine
    from dl2d.db.slots import speed_samples

    engine = make_engine(db)
    with session_scope(engine) as s:
        stored = speed_samples(s)
    engine.dispose()
    assert stored and all(r["nodes"] == -(-r["workers"] // 4) for r in stored)  # packed: the fewest 4-GPU nodes
    # the site's job mix: how many jobs of each class came and their median total epochs (a twin's traces)
    assert all(c["jobs"] >= 1 and c["epochs"] > 0 for c in doc["classes"].values())
    assert {name for name, _, _ in SiteSpeeds.of(load_speed_model(out)).mix} == {"cifar10", "speech-80", "bert"}


def test_calibrate_with_nothing_to_fit_or_nowhere_to_write_says_so_and_writes_nothing(tmp_path):
    db = f"sqlite:///{tmp_path / 'empty.sqlite'}"
    out = tmp_path / "site.json"
    r = CliRunner().invoke(cli, ["calibrate", "--db", db, "--out", str(out)])
    assert r.exit_code == 1 and "no all-reduce job has speeds stored" in r.output and not out.exists()
    (tmp_path / "file").write_text("")
    r = CliRunner().invoke(cli, ["calibrate", "--db", db, "--out", str(tmp_path / "file" / "x.json")])
    assert r.exit_code == 2 and "--out" in r.output and "no directory" in r.output


def row(job, number, workers, speed, ended=False, kind="allreduce", gpus=1, **spec):
    return {"job_id": job, "number": number, "workers": workers, "epochs_per_s": speed, "ended": ended,
            "job_type": "m", "spec": {"kind": kind, "worker": {"gpus": gpus}, **spec}}


def test_only_slots_trained_through_at_an_unchanged_size_are_samples():
    rows = [row(1, 0, 2, 0.5), row(1, 1, 2, 1.0), row(1, 2, 4, 0.1), row(1, 3, 4, 2.0), row(1, 5, 4, 9.0),
            row(1, 6, 4, 4.0, ended=True), row(2, 0, 1, 1.0, kind="ps"), row(2, 1, 1, 1.0, kind="ps"),
            row(3, 0, 2, 1.0, gpus=2, label="big"), row(3, 1, 2, 0.25, gpus=2, label="big")]
    classes = gather(rows)
    assert set(classes) == {"m", "big"}  # the PS job is no all-reduce class
    # slot 0: its start; 2: a resize; 5: after a gap (slot 4 missing); 6: it ended in the slot
    assert classes["m"].seconds == {2: [1.0], 4: [0.5]}
    assert classes["big"].seconds == {4: [4.0]}  # 2 workers of 2 GPUs


def test_a_start_that_outlasts_a_slot_and_a_jobs_last_steps_are_no_samples():
    """A JAX job of 4 processes on a loaded machine: two slots importing and compiling (no progress), one in
    which it begins to train, steady slots, its last steps and exit, then the slot it ended in."""
    rows = [row(1, 0, 4, 0.0), row(1, 1, 4, 0.0), row(1, 2, 4, 0.008), row(1, 3, 4, 0.025), row(1, 4, 4, 0.025),
            row(1, 5, 4, 0.02), row(1, 6, 4, 0.001), row(1, 7, 4, 0.0, ended=True)]
    assert gather(rows)["m"].seconds == {4: [40.0, 40.0, 50.0]}  # slots 3, 4 and 5 only


def test_the_anchored_curve_keeps_what_was_measured_and_the_form_between():
    fit = np.array([np.inf, 10.0, 6.0, 5.0, 4.0, 4.0])
    t = anchored_curve(fit, {2: 3.0, 4: 8.0})  # measured half and twice the form at 2 and 4
    assert t[2] == 3.0 and t[4] == 8.0
    assert t[1] == pytest.approx(5.0) and t[3] == pytest.approx(5.0 * 1.25) and t[5] == pytest.approx(8.0)


@pytest.mark.parametrize("text, message", [
    ("[1,", "not JSON"),
    ('{"format": "x"}', 'must be "dl2d-speed-model"'),
    ('{"format": "dl2d-speed-model", "version": 7, "classes": {}}', "version 7"),
    ('{"format": "dl2d-speed-model", "version": 1, "classes": {}}', "non-empty"),
    ('{"format": "dl2d-speed-model", "version": 1, "classes": {"a b": {"seconds_per_epoch": [1]}}}', "class name"),
    ('{"format": "dl2d-speed-model", "version": 1, "classes": {"a": {"seconds_per_epoch": [1, -2]}}}',
     "on 2 GPUs must be a number"),
    ('{"format": "dl2d-speed-model", "version": 1, "classes": {"a": {"seconds_per_epoch": [true]}}}',
     "on 1 GPUs must be a number"),
    ('{"format": "dl2d-speed-model", "version": 1, "classes": {"a": {"seconds_per_epoch": []}}}', "list of 1-"),
    ("[" * 100000 + "]" * 100000, "not JSON"),
    ('{"format": "dl2d-speed-model", "version": 1, "classes": {"a": {"seconds_per_epoch": [1], "jobs": 0}}}',
     "class a: jobs must be an integer in .1,"),
    ('{"format": "dl2d-speed-model", "version": 1, "classes": {"a": {"seconds_per_epoch": [1], "jobs": 2.5}}}',
     "class a: jobs must be an integer"),
    ('{"format": "dl2d-speed-model", "version": 1, "classes": {"a": {"seconds_per_epoch": [1], "epochs": -1}}}',
     "class a: epochs must be a number in (0,"),
    ('{"format": "dl2d-speed-model", "version": 1, "classes": {"a": {"seconds_per_epoch": [1], "epochs": "9"}}}',
     "class a: epochs must be a number"),
    ('{"format": "dl2d-speed-model", "version": 1, "classes": {"a": {"seconds_per_epoch": [1], "spread": {}}}}',
     "class a: spread.slowdown must be a number in"),
    ('{"format": "dl2d-speed-model", "version": 1, "classes": {"a": {"seconds_per_epoch": [1], '
     '"spread": {"slowdown": -1}}}}', "class a: spread.slowdown must be a number in"),
])
def test_a_file_that_is_not_a_speed_model_is_refused_naming_what_is_wrong(text, message):
    with pytest.raises(SpeedModelError, match=message.replace("(", r"\(")):
        parse_speed_model(text, "site.json")


def test_an_unreadable_speed_model_file_is_refused(tmp_path):
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe")
    with pytest.raises(SpeedModelError, match="cannot read it"):
        load_speed_model(tmp_path / "bad.json")
    with pytest.raises(SpeedModelError, match="cannot read it"):
        load_speed_model(tmp_path / "missing.json")
