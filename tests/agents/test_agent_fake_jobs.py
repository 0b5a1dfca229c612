"""The test-only `--fake-job GPU=SLURMJOB[@UTIL]` option of `dl2-agent --fake-gpus`."""
from __future__ import annotations

import click
import pytest

from dl2d.agents.features import job_gpu_features
from dl2d.agents.main import fake_reader


def test_fake_jobs_appear_as_gpu_processes_of_their_slurm_jobs():
    gpus = fake_reader(3, ("0=7@30", "1=7", "1=8@60")).read().gpus
    assert [g["util_gpu_pct"] for g in gpus] == [30, 60, 0]
    assert [[p["slurm_job_id"] for p in g["processes"]] for g in gpus] == [["7"], ["7", "8"], []]
    assert gpus[1]["mem_used_bytes"] == 2 * 4 * 1024**3
    f = job_gpu_features([{"node": "n", "ts": 1.0, "gpus": gpus}])
    assert (f["7"]["gpus"], f["7"]["shared_gpu"], f["8"]["gpus"]) == (2, True, 1)


@pytest.mark.parametrize("bad", ["3=7", "x=7", "0=", "7"])
def test_malformed_fake_jobs_are_refused(bad):
    with pytest.raises(click.BadParameter):
        fake_reader(3, (bad,))
