#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (as root), then runs it.
# Used by the README and by .ci/run. Real Slurm and PostgreSQL are started by the tests themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="slurmctld slurmd slurm-client munge postgresql systemd python3-venv"
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  missing=""
  for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    echo "== installing Debian packages:$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
fi

echo "== installing dl2d and its test dependencies"
python3 -m pip install -q --disable-pip-version-check -e '.[test]'

# PyTorch's CPU build, for the PyTorch example job's test (tests/job/test_example_jobs.py). "+cpu" is never on
# PyPI itself (it would bring GBs of CUDA packages): only where a CPU build is offered (a local wheel, the
# PyTorch CPU index). Without it that one test skips, and fails under CI.
if ! python3 -c "import torch" >/dev/null 2>&1; then
  echo "== installing PyTorch (CPU build)"
  python3 -m pip install -q --disable-pip-version-check --only-binary=:all: "torch==2.13.0+cpu" \
    || echo "   PyTorch's CPU build is not to be had here: the PyTorch example's test will skip"
fi

echo "== checking the import contracts (docs/ARCHITECTURE.md)"
lint-imports --no-cache

# Two processes (pytest-xdist): a module runs whole on one, the local Slurm cluster's tests all on one
# (tests/conftest.py). DL2D_TEST_WORKERS=0 runs everything in this process. The conformance harness (real
# Slurm against its twin, slot by slot in wall-clock time) runs after them, alone on the machine: other tests'
# load on the same cores would be its noise.
ALONE=tests/slurm/test_conformance_real.py
echo "== running the test suite"
python3 -m pytest -q -n "${DL2D_TEST_WORKERS:-2}" --dist loadgroup --deselect "$ALONE" "$@"
if [ "$#" -eq 0 ]; then
  echo "== running the conformance harness alone"
  python3 -m pytest -q "$ALONE"
fi
