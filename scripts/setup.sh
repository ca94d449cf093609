#!/usr/bin/env bash
# Idempotent set-up on a fresh clone: create .venv if missing, install phantora, build the ns-3 models in
# ns3-scratch/. Every other script calls this first.
#   scripts/setup.sh         what the main job needs: phantora and its core dependencies (torch CPU, ns3, ...)
#   scripts/setup.sh --dev   also the dev and frameworks extras (pytest, ruff, mypy, ray, pyarrow; torchtitan,
#                            transformers, deepspeed, megatron-core, triton): the tests and CI
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MODE=core
case "${1:-}" in
  "") ;;
  --dev) MODE=dev ;;
  *) echo "usage: scripts/setup.sh [--dev]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
core_stamp=.venv/.phantora-installed
dev_stamp=.venv/.phantora-installed-dev
fresh() { [ -f "$1" ] && [ ! pyproject.toml -nt "$1" ]; }
if [ "$MODE" = dev ]; then
  spec=".[dev,frameworks]"
  check="import phantora, bridge, torch, numpy, zmq, msgpack, pytest, xdist, ruff, mypy, torchtitan, triton, evaluate"
  done_already=$(fresh "$dev_stamp" && echo 1 || true)
else
  spec="."
  check="import phantora, bridge, torch, numpy, zmq, msgpack"
  done_already=$( (fresh "$core_stamp" || fresh "$dev_stamp") && echo 1 || true)
fi
# A .venv linked from another working tree (a private clone sharing a checkout's venv) is that tree's: installing
# here would point its editable phantora at this clone for everyone who uses it. Leave it alone; PYTHONPATH=$ROOT
# runs this tree's code with it.
venv_home=$(dirname "$(readlink -f .venv)")
if [ -L .venv ] && [ "$venv_home" != "$(pwd -P)" ] && [ -z "$done_already" ]; then
  echo "[setup] .venv links to $(readlink -f .venv): phantora not reinstalled into it (PYTHONPATH=$ROOT runs this tree's code)" >&2
  done_already=1
fi
if [ -z "$done_already" ]; then
  if [ "$MODE" = dev ]; then
    echo "[setup] installing phantora with its dev and frameworks extras into .venv (pytest, ruff, mypy, ray," \
      "torchtitan, transformers, deepspeed, ...)"
  else
    echo "[setup] installing phantora and its dependencies into .venv (torch==2.13.0 CPU, ns3==3.44.post0, ...)"
  fi
  # the constraints keep torch==2.13.0 (the frameworks would replace it)
  .venv/bin/python -m pip install -q -e "$spec" -c scripts/constraints.txt 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "$check" || { echo "[setup] install failed" >&2; exit 1; }
  touch "$core_stamp"
  [ "$MODE" = dev ] && touch "$dev_stamp"
fi
# the simulated GPU's compiled per-op fast path (setup.py's optional extension; `pip install -e` builds it too): built
# in place when missing or older than its source; without a C compiler phantora runs the Python one (it warns)
fastop_src=phantora/runtime/simcuda/_fastop.c
fastop_so=$(ls phantora/runtime/simcuda/_fastop.*.so 2>/dev/null | head -1 || true)
if [ -f "$fastop_src" ] && { [ -z "$fastop_so" ] || [ "$fastop_src" -nt "$fastop_so" ]; }; then
  echo "[setup] building the compiled per-op fast path (phantora/runtime/simcuda/_fastop.c)"
  .venv/bin/python setup.py -q build_ext --inplace >/dev/null 2>&1 \
    || echo "[setup] warning: the compiled fast path did not build (a C compiler and Python's headers are needed); ops run through the Python one" >&2
fi
# its tensor reader and op caller (simcuda/tensorinfo.cc, opcall.cc), built against torch once into the user cache,
# here rather than at a first run (without them the compiled path uses torch's Python bindings; it warns)
.venv/bin/python -c "from phantora.runtime.simcuda import compiled; compiled.load()" >/dev/null || true
if [ -x scripts/build_ns3.sh ]; then
  # the main job needs the library and the runner; the tests (--dev) also the C++ TestSuites
  if [ "$MODE" = dev ]; then scripts/build_ns3.sh; else scripts/build_ns3.sh models; fi
fi
