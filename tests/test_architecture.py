"""The dependency rules of docs/ARCHITECTURE.md hold (import-linter, contracts in pyproject.toml), and a
violation does break them: a copy of the package where the core imports the simulator fails the check."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lint(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the package found first on PYTHONPATH=root."""
    exe = shutil.which("lint-imports", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert exe, "import-linter is not installed (pip install -e '.[test]')"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([exe, "--no-cache", "--config", str(ROOT / "pyproject.toml")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_a_core_module_importing_the_simulator_breaks_the_contracts(tmp_path):
    shutil.copytree(ROOT / "dl2d", tmp_path / "dl2d", ignore=shutil.ignore_patterns("__pycache__", "data"))
    limits = tmp_path / "dl2d" / "core" / "limits.py"
    limits.write_text(limits.read_text() + "\nfrom dl2d.sim.engine import SimConfig  # a violation\n")
    r = lint(tmp_path)
    assert r.returncode != 0
    assert "the core contract imports nothing else of dl2d BROKEN" in " ".join(r.stdout.split())
