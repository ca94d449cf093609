"""Swift's standing queue follows its target: the figures of docs/tutorial-cc.md §4.

Two equal flows (4 MB each) into host 0 of a star of 3 hosts (100G, 1 µs links), with Swift at
`--set cc.BaseTarget=T` for each T given. Prints, per target, the mean queueing delay at the bottleneck port
(queues sampled every 1 us over 30-90 % of the run), what Swift's target predicts there (BaseTarget plus the
flow-based scaling of section 3.5 at the flows' window, as tests/test_cc_registry.py computes it), the flows'
window, and the two FCTs against the line-rate time of both flows' wire bytes.

    .venv/bin/python bench/bench_swift_target.py [--targets 2us,5us,10us]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.base import Flow
from phantora.netsim.cli_config import packet_config_from_flags
from phantora.netsim.packet import Ns3Simulator
from phantora.topology.model import Topology

G = 10**9
B = 100 * G
PAYLOAD, HEADER = 1000, 48
SIZE = 4_000_000


def star3() -> Topology:
    """3 hosts (0..2) on one switch (node 3), 100G, 1 us."""
    t = Topology("star3")
    for _ in range(3):
        t.add_node("host")
    s = t.add_node("switch")
    for i in range(3):
        t.add_link(i, s, B, 1000)
    return t.validate()


def predicted_delay_ns(base_target_ns: float, base_rtt_ns: float, delay_ns: float) -> tuple[float, float]:
    """Swift's target minus the base RTT, and the window (packets) each of the two flows holds at that delay."""
    cwnd = B * (base_rtt_ns + delay_ns) / 8 / G / 2 / (PAYLOAD + HEADER)
    fs_range, lo, hi = 5 * base_target_ns, 0.1, 100.0
    alpha = fs_range / (1 / math.sqrt(lo) - 1 / math.sqrt(hi))
    return base_target_ns + min(max(alpha / math.sqrt(cwnd) - alpha / math.sqrt(hi), 0.0), fs_range), cwnd


def run(target: str) -> dict[str, float]:
    """One incast with BaseTarget = target."""
    config = packet_config_from_flags(cc="swift", sets=[f"cc.BaseTarget={target}"]).with_updates(queue_sample_ns=1000)
    with Ns3Simulator(star3(), config) as sim:
        sim.submit([Flow(1, 1, 0, SIZE), Flow(2, 2, 0, SIZE)], at=0)
        done = sim.drain()
        end = max(c.end_ns for c in done)
        queue = [
            s.bytes for s in sim.queue_samples() if s.node == 3 and s.port == 0 and 0.3 * end < s.time_ns < 0.9 * end
        ]
        base_rtt = sim.base_rtt_ns(1, 0)
    delay = mean(queue) * 8 * G / B
    fcts = sorted(c.end_ns - c.start_ns for c in done)
    return {"delay": delay, "base_rtt": base_rtt, "first": fcts[0], "last": fcts[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="2us,5us,10us", help="comma-separated BaseTarget values")
    args = ap.parse_args()
    both = -(-2 * SIZE // PAYLOAD) * (PAYLOAD + HEADER) * 8 * G / B  # both flows' wire bytes at line rate
    print("2-to-1 incast of 4 MB flows, star of 3 hosts at 100G, 1 µs links, Swift")
    print(
        f"{'BaseTarget':>10}  {'base RTT µs':>11}  {'queue delay µs':>14}  {'Swift target µs':>15}  "
        f"{'window pkts':>11}  {'FCT first/last µs':>17}  {'last / line rate':>16}"
    )
    for target in args.targets.split(","):
        r = run(target)
        base_ns = float(target.removesuffix("us")) * 1000
        want, cwnd = predicted_delay_ns(base_ns, r["base_rtt"], r["delay"])
        fct = f"{r['first'] / 1e3:.2f}/{r['last'] / 1e3:.2f}"
        print(
            f"{target:>10}  {r['base_rtt'] / 1e3:>11.2f}  {r['delay'] / 1e3:>14.2f}  {want / 1e3:>15.2f}  "
            f"{cwnd:>11.1f}  {fct:>17}  {r['last'] / both:>16.4f}"
        )


if __name__ == "__main__":
    main()
