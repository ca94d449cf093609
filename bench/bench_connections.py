"""Persistent queue pairs (issue 33): what a CC's state carried from one message to the next does to the next one.
Prints figures, asserts nothing.

Two senders incast 4 MB each into one receiver on a 100G star; then sender 0 sends a 2 MB message alone, after an
idle gap, either on the same connection (`--set qp=connection`, NCCL's persistent queue pair: the CC starts where
the incast left it) or on a fresh queue pair (`--set qp=flow`: line rate). For each CC it prints the lone message's
FCT against the idle gap, and the line-rate FCT it tends to once the CC has recovered (DCQCN: its rate-increase
timer; the ACK-clocked CCs keep their window until ACKs move it).

    .venv/bin/python bench/bench_connections.py
    .venv/bin/python bench/bench_connections.py --cc dcqcn hpcc --idle-us 0 100 1000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from star_fabric import star

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import PacketConfig

G = 10**9
MB = 1_000_000


def lone_fct_us(cc: str, qp: str, idle_ns: int) -> float:
    """FCT (us) of the 2 MB message sent `idle_ns` after the incast, on connection 11 (or a fresh QP)."""
    with Ns3Simulator(star(3), PacketConfig(cc=cc, qp=qp)) as sim:
        sim.submit([Flow(1, 0, 2, 4 * MB, conn=11), Flow(2, 1, 2, 4 * MB, conn=12)], at=0)
        sim.submit([Flow(3, 0, 2, 2 * MB, deps=(1, 2), delay_ns=idle_ns, conn=11)], at=0)
        done = {c.flow_id: c for c in sim.drain()}
    return (done[3].end_ns - done[3].start_ns) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cc", nargs="+", default=["dcqcn", "hpcc", "timely", "dctcp", "swift"])
    ap.add_argument("--idle-us", nargs="+", type=float, default=[0, 100, 300, 1000, 3000, 10000, 50000])
    args = ap.parse_args()
    idles = [int(us * 1000) for us in args.idle_us]
    print("FCT of a 2 MB message (us) after a 2 x 4 MB incast, by idle gap (us); 'fresh' = its own queue pair")
    print(f"{'cc':<8} {'fresh':>8} " + " ".join(f"{us:>8g}" for us in args.idle_us))
    for cc in args.cc:
        fresh = lone_fct_us(cc, "flow", 0)
        row = [lone_fct_us(cc, "connection", i) for i in idles]
        print(f"{cc:<8} {fresh:>8.1f} " + " ".join(f"{v:>8.1f}" for v in row))


if __name__ == "__main__":
    main()
