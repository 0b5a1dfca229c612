#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (as root), then runs it.
# Used by the README and by .ci/run. Real Slurm and PostgreSQL are started by the tests themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="slurmctld slurmd slurm-client munge postgresql systemd"
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

echo "== checking the import contracts (docs/ARCHITECTURE.md)"
lint-imports --no-cache

echo "== running the test suite"
exec python3 -m pytest -q "$@"
