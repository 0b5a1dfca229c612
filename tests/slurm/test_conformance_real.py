"""The conformance harness on the real local Slurm (4 nodes x 4 fake GPUs, conftest): the same 12-job trace of
demo jobs at declared speeds under dl2d on Slurm and in its twin. Every job finishes in both worlds, dl2d
resizes jobs on Slurm, and in no slot does Slurm hold a GPU that dl2d counted free (checked against the
nodes' GRES in use just before each slot's decision). The side-by-side report is printed."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dl2d.daemon.conform.compare import compare
from dl2d.daemon.conform.trace import make_trace
from dl2d.daemon.conform.worlds import clean_env, run_real, run_twin, slurm_shape

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
SLOT_S = 3.0


def test_one_trace_on_slurm_and_in_its_twin(slurm, tmp_path):
    driver = slurm.driver()
    shape = slurm_shape(driver)
    jobs = make_trace(seed=0, slot_seconds=SLOT_S)
    env = clean_env({**slurm.env, "PYTHONPATH": str(REPO)})
    real = run_real(jobs, "elastic", SLOT_S, str(slurm.conf), tmp_path / "real", driver, shape.total_gpus,
                    python=sys.executable, env=env, timeout_s=240)
    twin = run_twin(jobs, "elastic", SLOT_S, shape, tmp_path / "twin", restart_s=1.0)
    rep = compare(real, twin)
    print("\n" + json.dumps({k: v for k, v in rep.items() if k not in ("jobs", "divergences")}))
    print("first divergences:", json.dumps(rep["divergences"][:3]))
    assert rep["real"]["finished"] == rep["twin"]["finished"] == len(jobs)
    assert sum(rep["real"]["resizes"].values()) > 0
    assert rep["slurm_checked_slots"] >= 10 and rep["slurm_over_held"] == [], rep["slurm_over_held"]
