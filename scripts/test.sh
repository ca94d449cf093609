#!/usr/bin/env bash
# The README's test command: set up what is missing (with the dev and frameworks extras: scripts/setup.sh --dev),
# then run the test suite (slow benchmarks are skipped by default; pass -m slow to run them). Extra arguments go to pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/setup.sh --dev
exec .venv/bin/python -m pytest -q "$@"
