"""The registry lists policies in the order of its MODULES, whichever policy module a program imported first."""
from __future__ import annotations

import subprocess
import sys

import pytest

from dl2d.policy import registry

SCRIPT = "import importlib, sys; importlib.import_module(sys.argv[1]); " \
         "from dl2d.policy import registry; print(','.join(registry.names()))"


@pytest.mark.parametrize("first", ["dl2d.policy.tiresias", "dl2d.policy.optimus", "dl2d.policy.elastic"])
def test_listing_order_does_not_depend_on_what_was_imported_first(first):
    out = subprocess.run([sys.executable, "-c", SCRIPT, first], capture_output=True, text=True, timeout=120,
                         check=True).stdout.strip().split(",")
    assert out == list(registry.names())
    # heuristics' DRF .. SRTF, then Optimus's two, ..., Slurm as it is, Tiresias, elastic: module order
    assert out.index("srtf") < out.index("optimus") < out.index("optimus-oracle") < out.index("slurm") \
        < out.index("tiresias") < out.index("elastic")
