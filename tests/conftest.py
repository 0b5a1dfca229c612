"""Suite-wide collection rule for running the suite on two processes (pytest-xdist, `scripts/test.sh`):
every test module runs whole on one worker (its module fixtures are built once), and every test of the
local Slurm cluster (tests/slurm: one slurmctld + slurmd + munge for the session) on the same worker."""
from __future__ import annotations

from pathlib import Path

import pytest

SLURM_TESTS = Path(__file__).parent / "slurm"


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        group = "slurm" if SLURM_TESTS in path.parents else str(path.relative_to(Path(__file__).parent))
        item.add_marker(pytest.mark.xdist_group(group))
