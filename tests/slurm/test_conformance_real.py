"""The conformance harness on the real local Slurm (4 nodes x 4 fake GPUs, conftest), run as ``dl2ctl conform``:
one trace of 12 demo jobs at declared speeds and 2 JAX jobs of docs/jobs.md's recipe (their speed in the twin
from ``dl2ctl calibrate`` of the real run) under dl2d on Slurm and in its twin, for the learned policy, elastic
and Slurm as it is.

In both worlds every job finishes; dl2d resizes jobs on Slurm under the learned policy; in no slot does Slurm
hold a GPU that dl2d counted free (its nodes' GRES in use, just before each slot's decision, against the slot's
allocation); the average JCTs agree and elastic beats Slurm-as-it-is in both worlds. The bounds asserted are
looser than the figures measured (docs/BENCHMARKS.md: the real world varies from run to run on a loaded
machine); the full side-by-side report is printed."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dl2d.daemon.conform.worlds import clean_env

pytestmark = pytest.mark.slurm

POLICIES = ("dl2-target", "elastic", "slurm")


def test_one_trace_on_slurm_and_in_its_twin_under_three_policies(slurm, tmp_path):
    """``dl2ctl conform`` as docs/cli.md gives it (its defaults: 12 demo jobs, 2 JAX jobs, seed 0, 3 s slots, the
    three policies)."""
    out = tmp_path / "conform.json"
    cp = subprocess.run([sys.executable, "-m", "dl2d.cli.main", "conform", "--timeout", "240", "--out", str(out)],
                        env=clean_env(slurm.env), capture_output=True, text=True, timeout=1200)
    print(cp.stdout, cp.stderr)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(out.read_text())
    reports = doc["reports"]
    assert [r["policy"] for r in reports] == list(POLICIES) and (doc["jobs"], doc["jax_jobs"]) == (12, 2)
    lines = cp.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines[:3]] == list(POLICIES) and lines[3].startswith("ordering by average JCT")
    print("first divergences:", json.dumps({r["policy"]: r["divergences"][:3] for r in reports}))
    for rep in reports:
        assert rep["real"]["finished"] == rep["twin"]["finished"] == 14, rep["policy"]
        # the JAX jobs trained on Slurm, and the twin ran them at the speed calibrate fitted from that
        assert rep["jax"]["class"] == "jax-mlp" and rep["jax"]["observed"], rep["jax"]
        assert all(rep["jobs"][f"cf-jax-{i}"]["ratio"] for i in (0, 1)), rep["jobs"]
        assert rep["slurm_checked_slots"] >= 10 and rep["slurm_over_held"] == [], (rep["policy"],
                                                                                    rep["slurm_over_held"])
        # the share of job-slots that agree is printed, not asserted: one job finishing a slot apart can shift a
        # whole queue (under slurm, a CI run agreed on 32 % with JCTs 16 % apart; alone on 2 cores, 96-99 %).
        # The learned policy's JCT ratio is bounded more loosely: it reads progress and measured speeds that
        # differ by a start's latency, and three runs of this trace here gave 0.80, 0.91 and 1.04
        # (docs/BENCHMARKS.md, "Real Slurm against its twin")
        low, high = (0.6, 1.67) if rep["policy"] == "dl2-target" else (0.75, 1.25)
        assert low <= rep["avg_jct_ratio"] <= high, (rep["policy"], rep["avg_jct_ratio"])
    learned = reports[0]
    assert sum(learned["real"]["resizes"].values()) > 0  # the learned policy resizes jobs on the real Slurm
    by = {r["policy"]: r for r in reports}
    for world in ("real", "twin"):  # resizing beats Slurm as it is, in both worlds
        assert by["elastic"][world]["avg_jct_s"] < by["slurm"][world]["avg_jct_s"], world
