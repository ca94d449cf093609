#!/usr/bin/env bash
# Build htsim_uec, the UEC's reference simulator (ultraethernet/uet-htsim at the commit docs/validation.md's
# comparison used), into the shared data folder's uet-htsim/ ($PHANTORA_SHARED, else phantora.paths.shared_dir()),
# where the docs' [needs=uet-htsim] blocks find it: uet-htsim/htsim/sim/build/datacenter/htsim_uec, beside the
# sources (bench/uet_htsim_compare.py runs the generator in htsim/sim/datacenter/connection_matrices).
# Usage: scripts/build_htsim.sh [SOURCE]   SOURCE: a clone or a bare git directory of uet-htsim (default: clone it
# from GitHub). Idempotent: an existing binary is kept.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMIT=40ccb05
URL=https://github.com/ultraethernet/uet-htsim
SHARED="${PHANTORA_SHARED:-$("$ROOT/.venv/bin/python" -c 'import sys; sys.path.insert(0, sys.argv[1]); from phantora.paths import shared_dir; print(shared_dir())' "$ROOT")}"
DEST="$SHARED/uet-htsim"
BIN="$DEST/htsim/sim/build/datacenter/htsim_uec"
if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi
SRC="${1:-}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
if [ -z "$SRC" ]; then
  git clone -q "$URL" "$TMP/clone"
  SRC="$TMP/clone"
fi
if [ -d "$SRC/.git" ]; then GITDIR="$SRC/.git"; else GITDIR="$SRC"; fi
git --git-dir="$GITDIR" cat-file -e "$COMMIT^{commit}" 2>/dev/null || {
  echo "build_htsim.sh: $SRC has no commit $COMMIT of $URL" >&2
  exit 1
}
mkdir -p "$DEST.part"
git --git-dir="$GITDIR" archive "$COMMIT" | tar -x -C "$DEST.part"
cmake -S "$DEST.part/htsim/sim" -B "$DEST.part/htsim/sim/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
nice -n 10 make -C "$DEST.part/htsim/sim/build" -j"${JOBS:-2}" htsim_uec >/dev/null
rm -rf "$DEST"
mv "$DEST.part" "$DEST"
echo "$BIN"
