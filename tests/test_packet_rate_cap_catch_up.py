"""A rate-capped flow keeps its cap's schedule when other packets of its port hold one of its packets back (issue 33,
docs/validation.md "ns-3 against the flow network").

The cap is a producer's rate (an NCCL channel's), not a gap after each packet: a packet the port sends late because
an ACK of the opposite flow was on the wire is made up by the next ones, so the last byte still leaves at
start + size x 8 / cap, the flow network's figure. Before, each packet's cap counted from the previous packet's
actual end, so every such delay added up: two opposite flows capped at 3,452 Gb/s on 7,200 Gb/s links (an NVLS
all-reduce on 8 B200s, 16 MiB) took 6.9% over size / cap with an idle half of the link. A lag longer than one
packet's time at the cap (a pause) is not made up: the flow then sends at most one packet early."""

from __future__ import annotations

import pytest

from phantora.netsim.base import Flow
from phantora.netsim.packet_config import PacketConfig
from tests.stars import G, star

pytestmark = pytest.mark.ns3

LAT = 25  # ns, each link (an NVSwitch's)
PAYLOAD, HEADER = 1000, 48


def ns(nbytes: int, bps: int) -> float:
    return nbytes * 8 * G / bps


def ends(n: int, line: int, cap: int, size: int) -> list[int]:
    """A ring of n capped flows host i -> i + 1 on a star (each host sends one and receives one): their ends."""
    from phantora.netsim.packet import Ns3Simulator

    flows = [Flow(i + 1, i, (i + 1) % n, size, rate_bps=cap) for i in range(n)]
    with Ns3Simulator(star(n, line, LAT), PacketConfig()) as sim:
        sim.submit(flows, at=0)
        done = sim.drain()
        assert sim.stats()["pfc_pause"] == 0
    return [d.end_ns - d.start_ns for d in done]


@pytest.mark.parametrize(
    ("n", "line", "cap"),
    [(2, 7200 * G, 3_452_376_451_612), (8, 7200 * G, 3_452_376_451_612), (2, 400 * G, 150 * G), (4, 100 * G, 40 * G)],
)
def test_opposite_capped_flows_end_at_size_over_cap(ns3_lib, n: int, line: int, cap: int) -> None:
    """Each host's wire carries its data at the cap (1048 B a packet) and an ACK (48 B) per packet it receives:
    cap x 1096 / 1000 is under the line rate, so the cap binds. Every flow's last bit leaves at size / cap; then the
    last packet's second hop at line rate and the two links' delays (within 2 ns: whole-ns events)."""
    size = 4_000_000  # whole packets (a short last one would wait at the switch for the full one before it)
    assert cap * (PAYLOAD + 2 * HEADER) / PAYLOAD < line
    want = ns(size, cap) + ns(PAYLOAD + HEADER, line) + 2 * LAT
    for took in ends(n, line, cap, size):
        assert took == pytest.approx(want, abs=2)


def test_a_lone_capped_flow_is_unchanged(ns3_lib) -> None:
    """Nothing holds a lone flow's packets back: its schedule is the one its previous packet's end gave (the
    rule of test_packet_rate_cap_first_packet.py), size / cap then the path."""
    from phantora.netsim.packet import Ns3Simulator

    size, line, cap = 4_000_000, 7200 * G, 3_452_376_451_612
    with Ns3Simulator(star(2, line, LAT), PacketConfig()) as sim:
        sim.submit([Flow(1, 0, 1, size, rate_bps=cap)], at=0)
        (done,) = sim.drain()
    assert done.end_ns - done.start_ns == pytest.approx(ns(size, cap) + ns(PAYLOAD + HEADER, line) + 2 * LAT, abs=2)
