"""Suite-wide collection rule for running the suite on two processes (pytest-xdist, `scripts/test.sh`):
every test module runs whole on one worker (its module fixtures are built once), and every test of the
local Slurm cluster (tests/slurm: one slurmctld + slurmd + munge for the session) on the same worker."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SLURM_TESTS = Path(__file__).parent / "slurm"

# One persistent XLA compilation cache for the whole run (both workers, and the daemons the tests start, which
# inherit the environment): many tests compile the same programs (the training step, the policy's network) at the
# same shapes, and on 2 cores compiling is much of the suite's time. A compiled program is keyed by its HLO, the
# options and the jaxlib version, so a cached one is the program that would have been compiled. Kept between
# local runs in .jax-cache/ (git ignores it), at most 512 MB.
# XLA's backend optimisation off: the tests' programs run on a few jobs for a few slots, so compiling them costs far
# more than running them (a compile-bound test about a quarter faster cold); what they compute is the same program.
_CACHE = {"JAX_COMPILATION_CACHE_DIR": str(Path(__file__).parent.parent / ".jax-cache"),
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5",
          "JAX_COMPILATION_CACHE_MAX_SIZE": str(512 << 20),
          "XLA_FLAGS": "--xla_backend_optimization_level=0"}
for _name, _value in _CACHE.items():
    os.environ.setdefault(_name, _value)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        group = "slurm" if SLURM_TESTS in path.parents else str(path.relative_to(Path(__file__).parent))
        item.add_marker(pytest.mark.xdist_group(group))
