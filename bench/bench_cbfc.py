"""Credit-based flow control (`--set cbfc=true`): the figures docs/packet-model.md quotes, printed by a command.

One flow through one switch at 100 Gb/s with 1 us links: the bytes per ns its host puts on the uplink from 0.5 to
1.5 ms, for k packets of credit against the closed form k P / T (T = P/R + F/R + 2d, the credit loop), and for the
default credit against R. Then an 8-to-1 incast of 2 MB flows with PFC off into a 300 KB buffer, without credits,
with the default credit and with 4 packets: drops, timeouts, the last completion over the receiver's line-rate
bound, and the largest buffer use. tests/test_packet_cbfc.py asserts the bounds; this prints the figures.

    .venv/bin/python bench/bench_cbfc.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from star_fabric import star, stat_count

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.base import Flow
from phantora.netsim.cli_config import packet_config_from_flags
from phantora.netsim.packet import Ns3Simulator

R = 100 * 10**9
US = 1000
PACKET = 1000 + 48  # payload + header on the wire
FRAME = 64  # a credit frame
LINE = R / 8 / 10**9  # bytes per ns
LOOP_NS = (PACKET + FRAME) / LINE + 2 * US


def uplink_rate(sets: list[str], size: int = 20_000_000) -> float:
    """Bytes per ns host 0 puts on its uplink from 0.5 to 1.5 ms (one flow host 0 -> host 1)."""
    marks = []
    with Ns3Simulator(star(2), packet_config_from_flags(sets=sets, queue_sample_ns=0)) as sim:
        sim.submit([Flow(1, 0, 1, size)], at=0)
        for t in (500 * US, 1500 * US):
            sim.advance(t)
            marks.append({(c.src, c.dst): c.bytes for c in sim.channel_usage()}[(0, 2)])
        sim.drain()
    return (marks[1] - marks[0]) / (1000 * US)


def incast(sets: list[str], n: int = 8, size: int = 2_000_000) -> tuple[float, dict[str, object]]:
    """n hosts send `size` each to host 0 (300 KB buffer): last completion over n x size x P / 1000 / R, stats."""
    config = packet_config_from_flags(sets=[*sets, "buffer_bytes=300000"], queue_sample_ns=0)
    with Ns3Simulator(star(n + 1), config) as sim:
        sim.submit([Flow(i, i, 0, size) for i in range(1, n + 1)], at=0)
        end = max(c.end_ns for c in sim.drain())
        stats = sim.stats()
    return end / (n * size * PACKET / 1000 / LINE), stats


def main() -> None:
    """Print the rate rows, then the incast rows."""
    print(f"credit loop T = P/R + F/R + 2d = {LOOP_NS:,.2f} ns; uplink B/ns from 0.5 to 1.5 ms")
    for k in (4, 8, 16, 26):
        bound = min(LINE, k * PACKET / LOOP_NS)
        rate = uplink_rate(["cbfc=true", f"cbfc_credit_bytes={k * PACKET}", "pfc=false"])
        print(f"  {k:>2} packets: closed form {bound:.4f}, measured {rate:.4f} ({(rate / bound - 1) * 100:+.2f}%)")
    rate = uplink_rate(["cbfc=true", "pfc=false"])
    print(f"  default   : closed form {LINE:.4f}, measured {rate:.4f} ({(rate / LINE - 1) * 100:+.2f}%)")
    print("8-to-1 incast of 2 MB, PFC off, 300 KB buffer")
    for name, sets in (
        ("no credits", ["pfc=false"]),
        ("default credit", ["cbfc=true", "pfc=false"]),
        ("4 packets", ["cbfc=true", f"cbfc_credit_bytes={4 * PACKET}", "pfc=false"]),
    ):
        ratio, st = incast(sets)
        print(
            f"  {name:<14} {stat_count(st, 'drops')} drops, {stat_count(st, 'timeouts')} timeouts, "
            f"{stat_count(st, 'pfc_pause')} PFC pauses, {ratio:.4f} x the bound, "
            f"buffer max {stat_count(st, 'max_switch_buffer_bytes')} B"
        )


if __name__ == "__main__":
    main()
