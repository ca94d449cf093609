#!/usr/bin/env bash
# The README's test command: set up what is missing (with the dev and frameworks extras: scripts/setup.sh --dev),
# then run the test suite (slow benchmarks are skipped by default; pass -m slow to run them). Extra arguments go to pytest.
# The suite runs in one pytest-xdist worker per core (-n auto), a test file at a time on one worker (--dist loadfile:
# a module's fixtures, such as the live run its tests share, run once), heaviest files first (tests/conftest.py's
# LONGEST_FIRST, then the conformance and frameworks runs; --no-loadscope-reorder keeps that order). `-n 0` runs it
# in this process.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/setup.sh --dev
exec .venv/bin/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder "$@"
