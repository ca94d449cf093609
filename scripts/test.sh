#!/usr/bin/env bash
# The README's test command: set up what is missing (with the dev and frameworks extras: scripts/setup.sh --dev),
# then run the test suite (slow benchmarks are skipped by default; pass -m slow to run them). Extra arguments go to pytest.
# The suite runs in one pytest-xdist worker per core (-n auto), a test file at a time on one worker (--dist loadfile:
# a module's fixtures, such as the live run its tests share, run once), heaviest files first (tests/conftest.py's
# LONGEST_FIRST, then the conformance and frameworks runs; --no-loadscope-reorder keeps that order). `-n 0` runs it
# in this process.
# Python keeps its bytecode (__pycache__, git-ignored) even where PYTHONDONTWRITEBYTECODE is set, as in many
# containers and on the machine of this project's CI: the suite starts hundreds of Python processes (fork servers,
# coordinators, network servers, CLI runs), and without bytecode each compiled the phantora and bridge modules it
# imports from source again, and each worker rewrote every test module's asserts again (tests/test_run_dir.py: 20.2
# -> 13.7-15.1 CPU s; a worker's collection 19.9 -> 7.0 CPU s).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
unset PYTHONDONTWRITEBYTECODE
scripts/setup.sh --dev
exec .venv/bin/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder "$@"
