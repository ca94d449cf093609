"""Credit-based flow control in the switches (issue 37, item 4: `--set cbfc=true`), against closed forms.

A port sends a data class only against link credit for the next switch's buffer; the switch gives the credit back
(a 64-byte credit frame, the new cumulative limit) as each packet leaves its buffer. The credit loop of a host's
uplink through one switch with an idle egress is one packet's serialisation P/R, the link delay d, a credit frame's
serialisation F/R and d back: T = P/R + F/R + 2d. Hence:

- with C bytes of credit, C a whole number k of packets: throughput = min(R, k P / T);
- credit sized to the loop's bandwidth-delay product (the default) gives line rate;
- an 8-to-1 incast with PFC off into a 300 KB buffer drops packets without credits and none with them, finishing
  as PFC does, within 0.5% of the receiver's line rate, the buffer never above 8 credit sizes;
- a packet the link loses (gray loss) does not leak its credit: the next packet carries the sender's cumulative
  count (InfiniBand's FCTBS) and the receiver gives the gap back; a cable failure resynchronises both ends.
"""

from __future__ import annotations

import pytest
from test_packet_engine import star  # n hosts on one switch

from phantora.netsim.base import Flow
from phantora.netsim.cli_config import packet_config_from_flags
from phantora.netsim.packet import Ns3Simulator

pytestmark = pytest.mark.ns3

G = 10**9
US = 1000
PACKET = 1000 + 48  # payload + header on the wire
FRAME = 64  # a credit frame (pfc_bytes)
R = 100 * G
LINE = R / 8 / G  # bytes per ns
LOOP_NS = (PACKET + FRAME) / LINE + 2 * US  # the credit loop: P/R + F/R + 2d


def uplink_rate(sets: list[str], size: int = 20_000_000) -> tuple[float, dict[str, object]]:
    """Bytes per ns host 0 puts on its uplink from 0.5 to 1.5 ms, one flow host 0 -> host 1 through one switch."""
    config = packet_config_from_flags(sets=sets, queue_sample_ns=0)
    marks = []
    with Ns3Simulator(star(2, R), config) as sim:
        sim.submit([Flow(1, 0, 1, size)], at=0)
        for t in (500 * US, 1500 * US):
            sim.advance(t)
            marks.append({(c.src, c.dst): c.bytes for c in sim.channel_usage()}[(0, 2)])
        sim.drain()
        stats = sim.stats()
    return (marks[1] - marks[0]) / (1000 * US), stats


@pytest.mark.parametrize("packets", [4, 8, 16])
def test_too_few_credits_give_credit_over_the_loop_time(ns3_lib, packets: int) -> None:
    """k packets of credit: throughput k P / T within 0.5% (k P < R T), no drop, the switch holds one packet."""
    rate, stats = uplink_rate(["cbfc=true", f"cbfc_credit_bytes={packets * PACKET}", "pfc=false"])
    assert packets * PACKET / LOOP_NS < LINE
    assert rate == pytest.approx(packets * PACKET / LOOP_NS, rel=0.005)
    assert stats["drops"] == 0 and stats["pfc_pause"] == 0
    assert stats["credit_frames"] == 20_000  # one per packet freed (credit update = one packet)
    assert stats["max_switch_buffer_bytes"] == PACKET


@pytest.mark.parametrize("sets", [["cbfc=true"], ["cbfc=true", f"cbfc_credit_bytes={26 * PACKET}"]])
def test_credit_of_one_bandwidth_delay_product_gives_line_rate(ns3_lib, sets: list[str]) -> None:
    """The default credit (R x 2d + 2 P + F + one update) and 26 packets (26 P >= R T) both run at line rate."""
    rate, stats = uplink_rate([*sets, "pfc=false"])
    assert rate == pytest.approx(LINE, rel=0.001)
    assert stats["drops"] == 0 and stats["credit_blocked_ns"] == 0


def incast(sets: list[str], n: int = 8, size: int = 2_000_000) -> tuple[float, dict[str, object]]:
    """n hosts each send `size` to host 0 through one switch (300 KB buffer): last completion / the receiver's
    line-rate bound n x size x P / payload / R, and the stats."""
    config = packet_config_from_flags(sets=[*sets, "buffer_bytes=300000"], queue_sample_ns=0)
    with Ns3Simulator(star(n + 1, R), config) as sim:
        sim.submit([Flow(i, i, 0, size) for i in range(1, n + 1)], at=0)
        end = max(c.end_ns for c in sim.drain())
        stats = sim.stats()
    return end / (n * size * PACKET / 1000 / LINE), stats


@pytest.mark.slow
def test_credits_make_a_lossy_incast_lossless_at_line_rate(ns3_lib) -> None:
    """PFC off: without credits the incast drops (and times out); with them nothing drops, no PFC frame is sent,
    the receiver's port stays full (within 0.5% of its line-rate bound, as with PFC) and the buffer holds at most
    the 8 senders' credit (8 x 28,208 B by default; 8 x 4 packets with 4-packet credit)."""
    lossy, lossy_stats = incast(["pfc=false"])
    assert lossy_stats["drops"] > 0 and lossy > 2
    pfc, _ = incast([])
    default_credit = 25_000 + 2 * PACKET + FRAME + PACKET
    for sets, credit in (([], default_credit), ([f"cbfc_credit_bytes={4 * PACKET}"], 4 * PACKET)):
        ratio, stats = incast(["cbfc=true", "pfc=false", *sets])
        assert stats["drops"] == 0 and stats["pfc_pause"] == 0 and stats["timeouts"] == 0
        assert ratio == pytest.approx(pfc, rel=1e-6) and ratio < 1.005
        assert 0 < stats["max_switch_buffer_bytes"] <= 8 * credit


def test_credit_lost_on_the_link_comes_back(ns3_lib) -> None:
    """2% random loss on the sender's uplink and 4 packets of credit: the flow completes (a leak would stall it
    once 4 packets were lost), every loss resent."""
    config = packet_config_from_flags(
        sets=["cbfc=true", f"cbfc_credit_bytes={4 * PACKET}", "pfc=false", "rto_ns=100us"], queue_sample_ns=0
    )
    with Ns3Simulator(star(2, R), config) as sim:
        sim._net.ScheduleLinkDegrade(0, 0, 0, 0, 0.02, 7)  # link 0: host 0 - switch
        sim.submit([Flow(1, 0, 1, 2_000_000)], at=0)
        (done,) = sim.drain(limit_ns=100_000 * US)
        stats = sim.stats()
    assert done.size == 2_000_000
    assert stats["wire_lost_packets"] > 20 and stats["retx_packets"] >= stats["wire_lost_packets"] // 2


def test_credit_survives_a_cable_failure(ns3_lib) -> None:
    """The sender's cable fails at 100 us for 200 us under 4 packets of credit: the flow completes afterwards."""
    config = packet_config_from_flags(
        sets=["cbfc=true", f"cbfc_credit_bytes={4 * PACKET}", "pfc=false", "rto_ns=100us"], queue_sample_ns=0
    )
    with Ns3Simulator(star(2, R), config) as sim:
        sim._net.ScheduleLinkState(100 * US, 0, False)
        sim._net.ScheduleLinkState(300 * US, 0, True)
        sim.submit([Flow(1, 0, 1, 2_000_000)], at=0)
        (done,) = sim.drain(limit_ns=100_000 * US)
        stats = sim.stats()
    assert done.size == 2_000_000 and done.end_ns > 300 * US
    assert stats["wire_lost_packets"] > 0 and stats["drops"] == 0


def test_credit_below_a_packet_is_refused(ns3_lib) -> None:
    config = packet_config_from_flags(sets=["cbfc=true", "cbfc_credit_bytes=1500"], queue_sample_ns=0)
    with pytest.raises(Exception, match="CreditSize 1500 B is below one packet"):
        with Ns3Simulator(star(2, R), config) as sim:
            sim.submit([Flow(1, 0, 1, 10_000)], at=0)
            sim.drain()
