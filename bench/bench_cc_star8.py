"""TIMELY and DCTCP on HPCC's star8 (100G, 1 us links): the figures docs/packet-model.md quotes for them.

    .venv/bin/python bench/bench_cc_star8.py

- two-to-one (two 10 MB flows into host 0, the reference case) with none and TIMELY: the bottleneck port's
  largest queue and the FCTs against the line-rate closed form (every packet back to back on one port);
- seven 5 MB flows into host 0 with DCTCP: the bottleneck queue sampled every 1 us (mean over the middle half
  of the samples, max), PFC pauses, ECN marks, and the last FCT against the line rate.
Simulated figures: deterministic, a few seconds of wall time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.readers import read_hpcc

STAR8 = Path(__file__).resolve().parents[1] / "topologies" / "hpcc" / "star8.topo.txt"
PAYLOAD, HEADER, RATE = 1000, 48, 100e9
SWITCH, PORT = 8, 0  # star8's switch and its port towards host 0


def line_rate_ns(nbytes: int) -> float:
    """Every packet (payload + header) of `nbytes` back to back on one 100 Gb/s port."""
    return -(-nbytes // PAYLOAD) * (PAYLOAD + HEADER) * 8e9 / RATE


@dataclass(frozen=True)
class Star8Run:
    """One star8 run: sorted FCTs (ns), the bottleneck's max queue and 1 us samples (bytes), engine stats."""

    fct: list[int]
    qmax: int
    samples: list[int]
    stats: dict[str, Any]


def run(cc: str, flows: list[tuple[int, int]]) -> Star8Run:
    """FCTs, the bottleneck's max queue and its 1 us samples, pauses and marks of one star8 run."""
    topo = read_hpcc(STAR8)
    with Ns3Simulator(topo, PacketConfig(cc=cc, queue_sample_ns=1000)) as sim:
        sim.submit([Flow(i, src, 0, size) for i, (src, size) in enumerate(flows)], at=0)
        sim.drain()
        assert sim.finish()
        fcts = sorted(r.fct_ns for r in sim.fct_records())
        (usage,) = [u for u in sim.channel_usage() if u.src == SWITCH and u.dst == 0]
        samples = [s.bytes for s in sim.queue_samples() if s.node == SWITCH and s.port == PORT]
        stats = sim.stats()
    return Star8Run(fcts, usage.max_queue_bytes, samples, dict(stats))


def main() -> None:
    two = [(1, 10_000_000), (2, 10_000_000)]
    line = line_rate_ns(sum(size for _, size in two))
    print(f"two-to-one, 2 x 10 MB into one 100G port (line rate: last FCT {line / 1000:.1f} µs)")
    for cc in ("none", "timely"):
        r = run(cc, two)
        fct, st = r.fct, r.stats
        print(
            f"  {cc:7} queue max {r.qmax / 1000:8.1f} KB  FCTs {fct[0] / 1000:.1f} / {fct[-1] / 1000:.1f} µs "
            f"(last {fct[-1] / line:.3f} x line rate)  pfc pauses {st.get('pfc_pause', 0)}"
        )
    seven = [(i, 5_000_000) for i in range(1, 8)]
    line = line_rate_ns(sum(size for _, size in seven))
    r = run("dctcp", seven)
    q, fct, st = r.samples, r.fct, r.stats
    middle = q[len(q) // 4 : 3 * len(q) // 4]
    print(f"incast, 7 x 5 MB into one 100G port, dctcp (line rate: last FCT {line / 1000:.1f} µs)")
    print(
        f"  queue: mean {mean(middle) / 1000:.1f} KB over the middle half of {len(q)} samples, max "
        f"{max(q) / 1000:.1f} KB  pfc pauses {st.get('pfc_pause', 0)}  ecn marks {st.get('ecn_marks', 0)}  "
        f"last FCT {fct[-1] / line:.3f} x line rate"
    )


if __name__ == "__main__":
    main()
