"""UET delivery modes and congestion controls side by side (issue 37): an n-to-1 incast under `--set transport=uet`
with each receiver mode and congestion control given, in one table: trims, trim NACKs that reached senders,
retransmitted packets, out-of-order arrivals, timeouts, drops and the last FCT, and each row's retransmissions per
trim. A second table runs the incast with endless flows and gives, per CC, the port's share the senders take
together and the smallest and largest sender's share x n (1 = a fair share of the line) from 100 to 600 us, and
the last trim. Prints figures, asserts nothing (the closed-form checks are in tests/test_packet_uet.py).

    .venv/bin/python bench/bench_uet_delivery.py                      # 8-to-1, 2 MB each, 100 and 400 Gb/s
    .venv/bin/python bench/bench_uet_delivery.py --modes rud rod --ccs nscc rccc --gbps 400
    .venv/bin/python bench/bench_uet_delivery.py --ccs nscc rccc nscc,cc.ReceiverCredit=true   # NSCC + RCCC
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.base import Flow
from phantora.netsim.cli_config import packet_config_from_flags
from phantora.netsim.packet import Ns3Simulator
from phantora.topology.model import Topology

G = 10**9
KEYS = ("trims", "trim_nacks", "retx_packets", "ooo_packets", "timeouts", "drops")


def star(n: int, bps: int) -> Topology:
    """n hosts on one switch, 1 us links (host 0 receives)."""
    t = Topology("star")
    hosts = [t.add_node("host") for _ in range(n)]
    sw = t.add_node("switch")
    for h in hosts:
        t.add_link(h, sw, bps, 1000)
    return t.validate()


def cc_sets(spec: str) -> list[str]:
    """--set items of a CC given as NAME[,ATTR=VALUE...] (e.g. nscc,cc.ReceiverCredit=true)."""
    name, *attrs = spec.split(",")
    return [f"cc={name}", *attrs]


def incast(n: int, size: int, gbps: int, sets: list[str]) -> dict[str, float]:
    """Counters and the last FCT (us) of hosts 1..n each sending `size` to host 0."""
    with Ns3Simulator(star(n + 1, gbps * G), packet_config_from_flags(sets=sets, queue_sample_ns=0)) as sim:
        sim.submit([Flow(i, i, 0, size) for i in range(1, n + 1)], 0)
        done = list(sim.drain())
        sim.finish()
        stats = sim.stats()
    return {k: float(stats[k]) for k in KEYS} | {"last_us": max(c.end_ns for c in done) / 1000}  # type: ignore[arg-type]


def shares(n: int, gbps: int, sets: list[str], a: int = 100_000, b: int = 600_000) -> tuple[list[float], int]:
    """Each sender's share of the line rate from `a` to `b` ns (wire bytes on its uplink) and the last trim (ns)."""
    with Ns3Simulator(star(n + 1, gbps * G), packet_config_from_flags(sets=sets, queue_sample_ns=0)) as sim:
        sim.submit([Flow(i, i, 0, 10**12) for i in range(1, n + 1)], 0)
        marks = []
        for t in (a, b):
            sim.advance(t)
            used = {(c.src, c.dst): c.bytes for c in sim.channel_usage()}
            marks.append([used.get((i, n + 1), 0) for i in range(1, n + 1)])
        last_trim = max((t.time_ns for t in sim.trims()), default=0)
    line = gbps / 8  # bytes per ns
    return [(marks[1][i] - marks[0][i]) / (b - a) / line for i in range(n)], last_trim


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--senders", type=int, default=8)
    ap.add_argument("--size", type=int, default=2_000_000)
    ap.add_argument("--gbps", type=int, nargs="+", default=[100, 400])
    ap.add_argument("--modes", nargs="+", default=["rud", "rod"])
    ap.add_argument("--ccs", nargs="+", default=["nscc"])
    args = ap.parse_args()
    print(f"{args.senders}-to-1 incast, {args.size} B each, transport=uet")
    head = ["link", "rx", "cc", "trims", "trim NACKs", "retransmitted", "retx / trim", "out-of-order", "timeouts"]
    print("| " + " | ".join([*head, "drops", "last FCT"]) + " |")
    print("|---|---|---" + "|---:" * 8 + "|")
    for gbps in args.gbps:
        for cc in args.ccs:
            for mode in args.modes:
                r = incast(args.senders, args.size, gbps, ["transport=uet", f"rx={mode}", *cc_sets(cc)])
                per = f"{r['retx_packets'] / r['trims']:.2f}" if r["trims"] else "-"
                counts = [f"{r[k]:,.0f}" for k in ("trims", "trim_nacks", "retx_packets")]
                rest = [f"{r[k]:,.0f}" for k in ("ooo_packets", "timeouts", "drops")]
                cells = [f"{gbps}G", mode, cc, *counts, per, *rest, f"{r['last_us']:.1f} us"]
                print("| " + " | ".join(cells) + " |")
    print()
    print(f"{args.senders}-to-1 incast of endless flows, transport=uet, 100-600 us")
    print("| link | cc | port share | min share x n | max share x n | last trim |")
    print("|---|---|---:|---:|---:|---:|")
    for gbps in args.gbps:
        for cc in args.ccs:
            share, last = shares(args.senders, gbps, ["transport=uet", *cc_sets(cc)])
            n = args.senders
            cells = [f"{sum(share):.4f}", f"{min(share) * n:.3f}", f"{max(share) * n:.3f}", f"{last / 1000:.2f} us"]
            print(f"| {gbps}G | {cc} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
