"""SLEEK on a lossy UET incast: the figures docs/packet-model.md quotes, printed by a command.

An 8-to-1 incast of 2 MB flows at 100 Gb/s into one switch, trimming off and a 300 KB buffer, so packets are
dropped and no NACK reports them; with `sleek=true` and without. Prints the drops, the packets resent, the
retransmission timeouts and when the last flow ends, against the line-rate closed form n * size * 1048 / 1000 *
8 / rate. tests/test_packet_uet.py asserts the bounds (SLEEK within 3% of it and no timeout; without it, over
1.5x with timeouts); this prints the figures.

    .venv/bin/python bench/bench_uet_sleek.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from star_fabric import star, stat_count

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.base import Flow
from phantora.netsim.cli_config import packet_config_from_flags
from phantora.netsim.packet import Ns3Simulator

N, SIZE, GBPS = 8, 2_000_000, 100
PAYLOAD, HEADER = 1000, 48
LOSSY = ["transport=uet", "trim_bytes=0", "buffer_bytes=300000"]


def run(sets: list[str]) -> dict[str, int]:
    """The incast to the end: drops, resent packets, timeouts and the last flow's end (ns)."""
    flows = [Flow(i, i, 0, SIZE) for i in range(1, N + 1)]
    with Ns3Simulator(star(N + 1), packet_config_from_flags(sets=sets, queue_sample_ns=0)) as sim:
        sim.submit(flows, 0)
        done = sim.drain()
        sim.finish()
        st = sim.stats()
    return {
        "drops": stat_count(st, "drops"),
        "retx": stat_count(st, "retx_packets"),
        "timeouts": stat_count(st, "timeouts"),
        "last_ns": max(c.end_ns for c in done),
    }


def main() -> None:
    """Print the closed form, then one line per mode."""
    line_ns = N * SIZE * (PAYLOAD + HEADER) / PAYLOAD * 8 / GBPS
    head = f"{N}-to-1 incast of {SIZE:,} B at {GBPS} Gb/s, trimming off, 300 KB buffer"
    print(f"{head}; line rate {line_ns / 1000:,.1f} µs")
    for name, sets in (("sleek", [*LOSSY, "sleek=true"]), ("no sleek", LOSSY)):
        r = run(sets)
        print(
            f"{name:<8} {r['drops']} drops, {r['retx']} resent, {r['timeouts']} timeouts, "
            f"last flow ends at {r['last_ns'] / 1000:,.1f} µs ({r['last_ns'] / line_ns:.3f} x line rate)"
        )


if __name__ == "__main__":
    main()
