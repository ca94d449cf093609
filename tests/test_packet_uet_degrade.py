"""A slowed port's thresholds under `--set thresholds_follow_rate=true` (issue 37; htsim's `-failed`, which runs a
slowed link's queue and ECN thresholds at the same fraction of the fabric's as its speed), against closed forms.

Two hosts send 1 MB each at 100 Gb/s to a third whose link a scenario slows to 25 Gb/s from time 0, over RUD with
trimming, no CC and no ECN: the egress queue to the slow host sits at the trim point. With the thresholds following
the rate it sits at trim_bytes / 4, else at trim_bytes; and the port's ECN kmin / kmax read back scaled by 1/4.
"""

from __future__ import annotations

import pytest
from test_packet_engine import star  # n hosts on one switch

from phantora.netsim.base import Flow
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.packet_faults import FaultyNs3Simulator
from phantora.netsim.scenario import parse_scenario

pytestmark = pytest.mark.ns3

G = 10**9
TRIM = 100_000  # bytes of the egress class queue
WIRE = 1000 + 48  # one data packet on the wire
KMIN, KMAX = 40_000, 80_000  # ECN thresholds at 100 Gb/s (the second run)


def slowed_run(follow: bool, ecn: bool) -> tuple[int, int, int, int]:
    """(largest sampled data queue at the switch's port to host 0, trims, that port's kmin, kmax after the run)
    for host 0's link slowed to 25 Gb/s at 0 and hosts 1, 2 sending it 1 MB each."""
    topo = star(3, 100 * G)
    body = '[[events]]\nkind = "link_degrade"\nat = "0ns"\nlink = ["switch3", "host0"]\nrate = "25Gbps"\n'
    config = PacketConfig(
        rx="rud", pfc=False, trim_priority=True, trim_bytes=TRIM, ecn=ecn, thresholds_follow_rate=follow,
        kmin_map={100 * G: KMIN}, kmax_map={100 * G: KMAX}, queue_sample_ns=100,
    )  # fmt: skip
    with FaultyNs3Simulator(topo, parse_scenario(body, "slow.toml"), config) as sim:
        sim.submit([Flow(1, 1, 0, 1_000_000), Flow(2, 2, 0, 1_000_000)], at=0)
        assert len(sim.drain()) == 2
        peak = max(q.bytes for q in sim.queue_samples() if q.node == 3 and q.port == 0 and q.prio != 0)
        port = sim.effective().switches[3].ports[0]
        assert port.rate_bps == 25 * G
        return peak, int(sim.stats()["trims"]), port.kmin_bytes, port.kmax_bytes  # type: ignore[call-overload]


@pytest.mark.parametrize("follow", [False, True])
def test_a_slowed_port_trims_at_its_scaled_threshold(ns3_lib, follow: bool) -> None:
    """The queue to the slowed host peaks within two packets under the trim point: TRIM / 4 when the
    thresholds follow the rate (htsim's -failed), TRIM when they stay as installed (the default)."""
    peak, trims, _, _ = slowed_run(follow, ecn=False)
    limit = TRIM // 4 if follow else TRIM
    assert limit - 2 * WIRE < peak <= limit
    assert trims > 0


def test_a_slowed_ports_ecn_thresholds_follow_its_rate(ns3_lib) -> None:
    """kmin / kmax of the slowed port scale by 25/100 (rounded down) with the thresholds following the rate, and
    stay as set without."""
    assert slowed_run(True, ecn=True)[2:] == (KMIN // 4, KMAX // 4)
    assert slowed_run(False, ecn=True)[2:] == (KMIN, KMAX)


def test_a_slowed_port_with_no_packet_since_reports_its_scaled_thresholds(ns3_lib) -> None:
    """Host 0's link slowed to 25 Gb/s at 0 while only hosts 1 and 2 exchange a flow: no packet goes to port 0
    after the change, yet the port's kmin / kmax read back scaled by 25/100, as its rate does (the switch rescales
    a port as packets arrive or leave it; the read-back did not, and gave the installed 40 / 80 kB)."""
    body = '[[events]]\nkind = "link_degrade"\nat = "0ns"\nlink = ["switch3", "host0"]\nrate = "25Gbps"\n'
    config = PacketConfig(
        pfc=False, ecn=True, thresholds_follow_rate=True, kmin_map={100 * G: KMIN}, kmax_map={100 * G: KMAX}
    )
    with FaultyNs3Simulator(star(3, 100 * G), parse_scenario(body, "slow.toml"), config) as sim:
        sim.submit([Flow(1, 1, 2, 10_000)], at=0)
        assert len(sim.drain()) == 1
        port = sim.effective().switches[3].ports[0]
        assert (port.rate_bps, port.kmin_bytes, port.kmax_bytes) == (25 * G, KMIN // 4, KMAX // 4)
