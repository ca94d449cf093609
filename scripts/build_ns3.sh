#!/usr/bin/env bash
# Build ns3-scratch/build/libphantora-ns3.so and phantora-ns3-runner against the ns3 PyPI wheel.
# Incremental: only changed sources are recompiled; an up-to-date tree costs a second.
# Usage: scripts/build_ns3.sh [-j N] [models | all | clean]   (models: the library and the runner; all, the
# default: also the C++ TestSuites)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PHANTORA_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
JOBS=2
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -j) JOBS="$2"; shift 2 ;;
    -j*) JOBS="${1#-j}"; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
NS3_DIR="$("$PY" -c 'import ns3; print(list(ns3.__path__)[0])' 2>/dev/null || true)"
if [ -z "$NS3_DIR" ] || [ ! -d "$NS3_DIR/include/ns3" ] || [ ! -d "$NS3_DIR/lib64" ]; then
  echo "build_ns3.sh: cannot find the ns3 wheel (pip install ns3==3.44.post0) with $PY" >&2
  exit 1
fi
NS3_VER="$(ls "$NS3_DIR/lib64" | sed -n 's/^libns3\.\([0-9.]*\)-core\.so$/\1/p' | head -1)"
if [ -z "$NS3_VER" ]; then
  echo "build_ns3.sh: no libns3.*-core.so in $NS3_DIR/lib64" >&2
  exit 1
fi
# One build at a time: parallel runs (sweeps, tests) wait for the first to finish, then find it up to date.
mkdir -p "$ROOT/ns3-scratch/build"
exec flock "$ROOT/ns3-scratch/build/.lock" nice -n 10 make -C "$ROOT/ns3-scratch" -j"$JOBS" NS3_DIR="$NS3_DIR" \
  NS3_VER="$NS3_VER" "${ARGS[@]}"
