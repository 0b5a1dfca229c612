"""The conformance harness on the real local Slurm (4 nodes x 4 fake GPUs, conftest): one 12-job trace of demo
jobs at declared speeds under dl2d on Slurm and in its twin, for the learned policy, elastic and Slurm as it is.

In both worlds every job finishes; dl2d resizes jobs on Slurm under the learned policy; in no slot does Slurm
hold a GPU that dl2d counted free (its nodes' GRES in use, just before each slot's decision, against the slot's
allocation); the average JCTs agree and elastic beats Slurm-as-it-is in both worlds. The bounds asserted are
looser than the figures measured (docs/BENCHMARKS.md: the real world varies from run to run on a loaded
machine); the full side-by-side report is printed."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dl2d.daemon.conform.compare import ordering
from dl2d.daemon.conform.trace import make_trace
from dl2d.daemon.conform.worlds import clean_env, conform

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
SLOT_S = 3.0
POLICIES = ("dl2-target", "elastic", "slurm")


def test_one_trace_on_slurm_and_in_its_twin_under_three_policies(slurm, tmp_path):
    driver = slurm.driver()
    jobs = make_trace(seed=0, slot_seconds=SLOT_S)
    env = clean_env({**slurm.env, "PYTHONPATH": str(REPO)})
    reports = []
    for policy in POLICIES:
        rep = conform(jobs, policy, SLOT_S, str(slurm.conf), tmp_path, driver, python=sys.executable, env=env,
                      timeout_s=240)
        reports.append(rep)
        print(f"\n{policy}: " + json.dumps({k: v for k, v in rep.items() if k not in ("jobs", "divergences")}))
        print("  first divergences:", json.dumps(rep["divergences"][:3]))
    print("ordering real:", ordering(reports, "real"), "twin:", ordering(reports, "twin"))
    for rep in reports:
        assert rep["real"]["finished"] == rep["twin"]["finished"] == len(jobs), rep["policy"]
        assert rep["slurm_checked_slots"] >= 10 and rep["slurm_over_held"] == [], (rep["policy"],
                                                                                    rep["slurm_over_held"])
        # the share of job-slots that agree is printed, not asserted: one job finishing a slot apart can shift a
        # whole queue (under slurm, a CI run agreed on 32 % with JCTs 16 % apart; alone on 2 cores, 96-99 %)
        assert 0.75 <= rep["avg_jct_ratio"] <= 1.25, (rep["policy"], rep["avg_jct_ratio"])
    learned = reports[0]
    assert sum(learned["real"]["resizes"].values()) > 0  # the learned policy resizes jobs on the real Slurm
    by = {r["policy"]: r for r in reports}
    for world in ("real", "twin"):  # resizing beats Slurm as it is, in both worlds
        assert by["elastic"][world]["avg_jct_s"] < by["slurm"][world]["avg_jct_s"], world
