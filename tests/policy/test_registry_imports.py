"""The architecture's rule at run time (docs/ARCHITECTURE.md): the registry lists every policy without importing
one, builds a policy by importing its module alone, and the daemon's decision path with any policy it may run
holds no simulator module: what `lint-imports` checks of static imports, checked of a live process."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dl2d.policy import registry

LISTING = """
import json, sys
from dl2d.policy import registry
names = registry.names(); registry.get("elastic"); registry.names(heuristic=True)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("dl2d."))))
"""

DAEMON = """
import json, sys
from dl2d.daemon.config import load_config
from dl2d.daemon.main import make_policy
import dl2d.daemon.loop, dl2d.daemon.plan, dl2d.daemon.slurm.backend
overrides = {"policy.name": sys.argv[1], "policy.allow_untrained": True, "backend": "slurm"}
if len(sys.argv) > 2:
    overrides["policy.checkpoint"] = sys.argv[2]
cfg = load_config(None, env={}, overrides=overrides)
policy, _ = make_policy(cfg)
print(json.dumps({"name": policy.name, "loaded": sorted(m for m in sys.modules if m.startswith("dl2d."))}))
"""

#: Policies that plan on the simulator's own program and lookahead (dl2d.policy.planning): they carry
#: dl2d.sim into the process by design, and say so in their room's docstring.
PLANNING = {"lp-lookahead", "dl2-plan-checked"}


def run(script: str, *args: str) -> object:
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_listing_the_policies_imports_none_of_them():
    loaded = run(LISTING)
    assert [m for m in loaded if m.startswith("dl2d.policy.")] == ["dl2d.policy.registry"], loaded
    assert registry.names()[:3] == ("elastic", "elastic-chooser", "dl2-target")  # the catalog's order


@pytest.mark.parametrize("name", [n for n in registry.names(daemon=True) if n not in PLANNING])
def test_the_daemon_with_its_policy_holds_no_simulator_module(name, tmp_path):
    args = [name]
    if name.startswith("chic"):  # Chic ships no checkpoint: an initial one of the right kind
        from dl2d.policy.seeds import chic

        cfg = chic.ChicConfig(pair=name == "chic-pair")
        chic.save_checkpoint(tmp_path / "chic.npz", cfg, chic.init_params(cfg))
        args.append(str(tmp_path / "chic.npz"))
    out = run(DAEMON, *args)
    sim = [m for m in out["loaded"] if m == "dl2d.sim" or m.startswith("dl2d.sim.")]
    assert sim == [], (name, sim)
    rooms = {m.split(".")[2] for m in out["loaded"] if m.startswith("dl2d.policy.") and m.count(".") >= 3}
    assert "planning" not in rooms, (name, rooms)


def test_a_policy_that_plans_on_the_simulator_is_the_planning_rooms_alone():
    for name in PLANNING:
        assert registry.get(name).build.startswith("dl2d.policy.planning."), name
