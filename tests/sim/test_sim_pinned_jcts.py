"""Pinned JCTs: every heuristic (and the speed oracle) gives bit-identical per-job JCTs on fixed traces and
seeds. The values were taken before the scheduling contract moved to dl2d.core and the policies to the
registry (issue #12); a refactoring that changes any of them changed behaviour. Re-pin only for a change that
is meant to alter the simulation (and say so in its commit), or when a new SciPy / NumPy shifts the
interpolated speed table's last bits (then every value moves at once)."""
from __future__ import annotations

import hashlib

import pytest

from dl2d.policy import registry
from dl2d.sim import engine as E
from dl2d.sim.cluster import preset
from dl2d.sim.trace import TraceConfig, generate

# (policy, seed): (sha256 prefix of the per-job JCTs as float.hex, the average JCT's repr)
PINNED = {
    ("drf", 3): ("e2ed5bc9bc4cc04e", "53.150459102436336"),
    ("tetris", 3): ("257c92b7fef1f52b", "100.30962158158128"),
    ("optimus", 3): ("b52f4f4529ee3c53", "29.23818199336156"),
    ("fifo", 3): ("dcf7d64d6f3e0031", "135.01283197522525"),
    ("srtf", 3): ("b4e3f6ff448c1719", "99.46954712334258"),
    ("oracle", 3): ("2346b2ed6de88d77", "31.07663845712236"),
    ("drf", 11): ("b037157feabdb9be", "51.114862121657666"),
    ("tetris", 11): ("7d67c9829d06a6c5", "84.4676394226295"),
    ("optimus", 11): ("0507287d33122acc", "27.00838120403268"),
    ("fifo", 11): ("db1b2e556a4feac0", "106.62754342238912"),
    ("srtf", 11): ("8983edabdee6875a", "84.63366046143311"),
    ("oracle", 11): ("af5218755917f4e5", "28.41632246464381"),
}


@pytest.mark.parametrize("seed", [3, 11])
def test_heuristics_and_oracle_give_the_pinned_jcts(seed):
    trace = generate(TraceConfig(num_jobs=30), seed=seed)
    cfg = E.SimConfig(cluster=preset("small"))
    for name in ("drf", "tetris", "optimus", "fifo", "srtf", "oracle"):
        res = E.run(trace, registry.build(name), cfg, seed=seed)
        digest = hashlib.sha256(",".join(float(x).hex() for x in res.jct_slots).encode()).hexdigest()[:16]
        assert (digest, repr(res.avg_jct_slots)) == PINNED[(name, seed)], name
