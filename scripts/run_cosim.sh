#!/usr/bin/env bash
# The main job: co-simulate a real PyTorch training job on a simulated GPU cluster, in packet mode
# (ns-3, RDMA + PFC + congestion control) and in flow mode (max-min), then compare the two.
# Sets up what is missing first (.venv, phantora's core install, ns-3 scratch build: scripts/setup.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

TOPOLOGY=${PHANTORA_TOPOLOGY:-testbed16}
SCRIPT=${PHANTORA_SCRIPT:-examples/gpt_ddp.py}
NPROC=${PHANTORA_NPROC:-16}
CC=${PHANTORA_CC:-dcqcn}
WINDOW=${PHANTORA_WINDOW:-}
STEPS=${PHANTORA_STEPS:-3}
OUT=${PHANTORA_OUT:-runs/cosim-$(date +%Y%m%d-%H%M%S)}
MODES=${PHANTORA_MODES:-ns3,flow}

usage() {
  cat <<EOF
usage: scripts/run_cosim.sh [options] [-- script args]
(default script args: --d-model 256 --layers 4)

Co-simulates SCRIPT on NPROC simulated GPUs of TOPOLOGY in each network mode, then prints a
side-by-side comparison (iteration time, collectives, FCTs, PFC, queues, ECN, links) and writes it
with plots under OUT/compare.

options (environment variable in brackets, default after it):
  --topology T   topology file or shipped name       [PHANTORA_TOPOLOGY=$TOPOLOGY]
  --script S     training script                      [PHANTORA_SCRIPT=$SCRIPT]
  --nproc N      ranks (simulated GPUs)               [PHANTORA_NPROC=$NPROC]
  --cc CC        packet-mode congestion control: none, dcqcn, hpcc, timely, dctcp, swift, ... (phantora cc lists all)  [PHANTORA_CC=$CC]
  --window W     co-simulation window (e.g. 10us; empty = the default, 0 = exact, in both modes)  [PHANTORA_WINDOW=$WINDOW]
  --steps K      training steps                       [PHANTORA_STEPS=$STEPS]
  --modes M      network modes to run, comma-separated, first is the baseline  [PHANTORA_MODES=$MODES]
  --out DIR      output directory                     [PHANTORA_OUT=runs/cosim-<date>]
  --overwrite    DIR may hold an earlier run: replace it (otherwise refused before anything runs)
  -h, --help     this help

Progress: each step of rank 0 as it finishes (its "step ..." lines), and a heartbeat every
PHANTORA_HEARTBEAT seconds (default 30) while a mode runs.
EOF
}

EXTRA=()
OVERWRITE=()
while [ $# -gt 0 ]; do
  case "$1" in
    --topology) TOPOLOGY=$2; shift 2 ;;
    --script) SCRIPT=$2; shift 2 ;;
    --nproc) NPROC=$2; shift 2 ;;
    --cc) CC=$2; shift 2 ;;
    --window) WINDOW=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --overwrite) OVERWRITE=(--overwrite); shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "run_cosim.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [ ${#EXTRA[@]} -eq 0 ] && [ "$SCRIPT" = examples/gpt_ddp.py ]; then
  EXTRA=(--d-model 256 --layers 4)  # big enough (3.4M params) for the gradient all-reduces to matter
fi

IFS=, read -r -a MODE_LIST <<< "$MODES"
if [ ${#OVERWRITE[@]} -eq 0 ]; then
  for mode in "${MODE_LIST[@]}"; do
    if [ -n "$(ls -A "$OUT/$mode" 2>/dev/null)" ]; then
      echo "run_cosim.sh: $OUT/$mode holds an earlier run; choose another --out, or pass --overwrite" >&2
      exit 2
    fi
  done
fi

scripts/setup.sh
PH=.venv/bin/phantora
mkdir -p "$OUT"
echo "[run_cosim] $SCRIPT on $NPROC GPUs of $TOPOLOGY; modes $MODES (packet mode: $CC); results in $OUT"

# Progress while a mode runs: rank 0's "step ..." lines as they appear in its log, and a heartbeat
# every PHANTORA_HEARTBEAT seconds (default 30) with the elapsed time and the steps done so far.
# The watcher stops when stop_watcher creates its stop file, after one last look at the log, so
# the final steps are always shown (a kill could land before they were read).
HEARTBEAT=${PHANTORA_HEARTBEAT:-30}
watch_progress() {
  local mode=$1 log=$2 stop=$3 t0=$SECONDS shown=0 last=$SECONDS n
  while :; do
    n=0
    if [ -f "$log" ]; then
      n=$(grep -c '^step ' "$log" || true)
      if [ "$n" -gt "$shown" ]; then
        grep '^step ' "$log" | sed -n "$((shown + 1)),${n}p" | sed "s/^/[run_cosim] $mode: /"
        shown=$n
        last=$SECONDS
      fi
    fi
    [ -e "$stop" ] && return 0
    if [ $((SECONDS - last)) -ge "$HEARTBEAT" ]; then
      if [ "$n" -eq 0 ] && [ "$mode" = ns3 ]; then
        what="starting ranks and loading ns-3, no step finished yet"
      elif [ "$n" -eq 0 ]; then
        what="starting ranks, no step finished yet"
      else
        what="$n of $STEPS steps done"
      fi
      echo "[run_cosim] $mode: $((SECONDS - t0)) s, $what"
      last=$SECONDS
    fi
    sleep 0.5 </dev/null >/dev/null 2>&1  # sleep holds no pipe of ours open
  done
}
WATCHER=
WATCH_STOP=
stop_watcher() {
  if [ -n "$WATCHER" ]; then
    touch "$WATCH_STOP"
    wait "$WATCHER" 2>/dev/null || true
    rm -f "$WATCH_STOP"
    WATCHER=
  fi
}
trap stop_watcher EXIT

RUNS=()
for mode in "${MODE_LIST[@]}"; do
  args=(run --topology "$TOPOLOGY" --network "$mode" --nproc "$NPROC" --out "$OUT/$mode" --quiet "${OVERWRITE[@]}")
  [ "$mode" = ns3 ] && args+=(--cc "$CC")
  [ -n "$WINDOW" ] && args+=(--window "$WINDOW")
  echo "[run_cosim] === $mode mode ==="
  start=$SECONDS
  rm -f "$OUT/$mode/logs/rank0.log"  # with --overwrite: the earlier run's log would show stale steps
  WATCH_STOP=$OUT/.watch-$mode.stop
  rm -f "$WATCH_STOP"
  watch_progress "$mode" "$OUT/$mode/logs/rank0.log" "$WATCH_STOP" &
  WATCHER=$!
  "$PH" "${args[@]}" "$SCRIPT" --steps "$STEPS" "${EXTRA[@]}"
  stop_watcher
  echo "[run_cosim] $mode mode took $((SECONDS - start)) s wall"
  RUNS+=("$OUT/$mode")
done

echo "[run_cosim] === comparison ==="
"$PH" compare "${RUNS[@]}" --out "$OUT/compare"
echo "[run_cosim] done: runs in ${RUNS[*]}; report and plots in $OUT/compare"
