"""Is UET's CPU per event under load the preset or the measurement? (issue 37). Prints figures, asserts nothing.

bench_uet_cpu.py times the UET and the RoCE replay of a live job's flows one after the other in one process, so
on a shared machine the two halves of a pair can meet different loads. Here each pair runs side by side instead:
the two replays start together in two processes (each times only its own event loop by its own CPU clock, as
bench_uet_cpu.replay does), so whatever load the machine has, both meet it at once. The pair is repeated, and
then run once more one after the other (`--sequential`), for comparison on the same machine that hour. Per pair
it prints each side's CPU per event and the ratio UET / RoCE, and the machine's 1-minute load at the start.

    .venv/bin/python bench/bench_uet_cpu_pairs.py --flows runs/uet-cpu/fsdp-roce+dcqcn-healthy/flows.csv --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install


ROOT = Path(__file__).resolve().parent
PRESETS = ("roce", "uet")


def one(flows: Path, preset: str, cc: str) -> tuple[int, float]:
    """(events, CPU s of the event loop) of one replay of `flows` under `preset` (roce with `cc`), in this process."""
    import bench_uet_cpu as cpu

    from phantora.launcher import resolve_topology

    fabric, configs = cpu.prepare(flows.parent.parent, cc)
    return cpu.replay(resolve_topology(fabric), cpu.read_flows(flows), configs[preset])


def spawn(flows: Path, preset: str, cc: str) -> subprocess.Popen[str]:
    """A child process replaying `flows` under `preset`; it prints its (events, CPU s) as JSON."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--flows", str(flows), "--cc", cc, "--one", preset]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT.parent)


def result(proc: subprocess.Popen[str]) -> tuple[int, float]:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"a replay failed (exit {proc.returncode})")
    events, seconds = json.loads(out.strip().splitlines()[-1])
    return int(events), float(seconds)


def pair(flows: Path, cc: str, side_by_side: bool, swap: bool) -> dict[str, tuple[int, float]]:
    """One pair: both presets at once (`side_by_side`), else one after the other (RoCE first unless `swap`)."""
    order = PRESETS[::-1] if swap else PRESETS
    if side_by_side:
        procs = {p: spawn(flows, p, cc) for p in order}
        return {p: result(proc) for p, proc in procs.items()}
    return {p: result(spawn(flows, p, cc)) for p in order}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flows", type=Path, required=True, help="a live run's flows.csv (bench_uet_cpu.py's source)")
    ap.add_argument("--cc", default="dcqcn", help="RoCE's congestion control (default dcqcn)")
    ap.add_argument("--pairs", type=int, default=5, help="side-by-side pairs, then as many one after the other")
    ap.add_argument("--one", choices=PRESETS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.flows.is_file():
        raise SystemExit(f"{args.flows}: no such flows.csv")
    if args.one:
        print(json.dumps(one(args.flows.resolve(), args.one, args.cc)))
        return
    print("| mode | load | roce ns / event | uet ns / event | UET / RoCE |")
    print("|---|---:|---:|---:|---:|")
    for mode in ("side by side", "one after the other"):
        ratios = []
        for i in range(args.pairs):
            load = os.getloadavg()[0]
            got = pair(args.flows.resolve(), args.cc, mode == "side by side", i % 2 == 1)
            per = {p: got[p][1] / got[p][0] * 1e9 for p in PRESETS}
            ratios.append(per["uet"] / per["roce"])
            print(f"| {mode} | {load:.1f} | {per['roce']:.1f} | {per['uet']:.1f} | {ratios[-1]:.3f}x |", flush=True)
        print(f"<!-- {mode}: min {min(ratios):.3f}x, median {statistics.median(ratios):.3f}x, "
              f"max {max(ratios):.3f}x -->", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
