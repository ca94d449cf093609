"""Fixed CPU cost of one ns-3 run call (`PhantoraNetwork::RunUntil` one ns ahead on an idle 2-host fabric),
per build: what exact co-simulation pays per step besides the events themselves (since the SIGTERM / SIGINT
handler check, two sigaction queries per call). Builds alternate, each in its own process
(`PHANTORA_NS3_LIB`); the best of --rounds is kept, so a loaded machine inflates both sides alike.

    .venv/bin/python bench/bench_run_call.py --build /tmp/old-build --build ns3-scratch/build
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install


def measure(calls: int) -> float:
    """CPU seconds per RunUntil call of this process's library."""
    from phantora.netsim.packet import Ns3Simulator
    from phantora.topology.model import Topology

    topo = Topology("star2")
    for _ in range(2):
        topo.add_node("host")
    sw = topo.add_node("switch")
    for i in range(2):
        topo.add_link(i, sw, 100 * 10**9, 1000)
    with Ns3Simulator(topo) as sim:
        net = sim._net  # the facade itself: the call as the engine makes it, without Python-side checks
        t0 = time.process_time()
        for ns in range(1, calls + 1):
            net.RunUntil(ns)
        return (time.process_time() - t0) / calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, action="append", help="build directory with libphantora-ns3.so")
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5, help="runs per build, alternating (best kept)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child: this process's library
    args = ap.parse_args()
    if args.one:
        print(measure(args.calls))
        return 0
    builds = args.build or [Path("ns3-scratch/build")]
    best = {b: float("inf") for b in builds}
    for _ in range(args.rounds):
        for b in builds:
            env = {**os.environ, "PHANTORA_NS3_LIB": str(b.resolve() / "libphantora-ns3.so")}
            cmd = [sys.executable, __file__, "--one", "--calls", str(args.calls)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            best[b] = min(best[b], float(out.split()[-1]))
    print(f"{args.calls} RunUntil calls per run, best of {args.rounds}")
    for b in builds:
        print(f"{str(b):<40}{best[b] * 1e6:8.2f} us CPU per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
