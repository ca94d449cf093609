#!/usr/bin/env bash
# Idempotent set-up on a fresh clone: create .venv if missing, install phantora with its dev and frameworks extras,
# and build the ns-3 models in ns3-scratch/. Every other script calls this first.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.phantora-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] installing phantora and its dependencies into .venv (torch==2.13.0 CPU, ns3==3.44.post0, ...)"
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
  # frameworks: torchtitan & co. for the simulated CUDA device's tests; the constraints keep torch==2.13.0
  .venv/bin/python -m pip install -q -e ".[dev,frameworks]" -c scripts/constraints.txt 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import phantora, bridge, torch, numpy, zmq, msgpack, torchtitan, triton" || { echo "[setup] install failed" >&2; exit 1; }
  touch "$stamp"
fi
if [ -x scripts/build_ns3.sh ]; then
  scripts/build_ns3.sh
fi
