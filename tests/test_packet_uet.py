"""Ultra Ethernet transport in packet mode (issue 37), against closed forms.

- NSCC (`--cc nscc`): on a 2-to-1 incast, a flow that joins a line-rate flow converges to the fair share, each
  flow sending line rate / 2 within 5%, and together the whole port.
"""

from __future__ import annotations

import pytest
from test_packet_engine import star  # n hosts on one switch

from phantora.netsim.base import Flow
from phantora.netsim.cc_registry import registry
from phantora.netsim.cli_config import packet_config_from_flags
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import PacketConfig

pytestmark = pytest.mark.ns3

G = 10**9
US = 1000
PAYLOAD, HEADER = 1000, 48


def uet_marking(bps: int) -> list[str]:
    """--set items for htsim's UET marking (0.2..0.8 of a one-BDP queue, probability 1) at one link rate; the
    BDP of an 8 us RTT, 1000 bytes per Gb/s (transport=uet's default, packet_config.uet_switch_maps)."""
    bdp = bps // G * 1000
    return [f"kmin_map={bps} {bdp // 5}", f"kmax_map={bps} {bdp * 4 // 5}", f"pmax_map={bps} 1.0"]


# ----- NSCC ------------------------------------------------------------------------------------------------------
def port_shares(config: PacketConfig, bps: int, join_ns: int, windows: list[tuple[int, int]]) -> list[list[float]]:
    """Flow 1 (host 1 -> host 0) alone from 0, flow 2 (host 2 -> host 0) from `join_ns`, both longer than the run;
    each flow's share of the line rate over each (from, to) window, from the bytes on its host's uplink."""
    line = bps / 8 / G  # bytes per ns
    with Ns3Simulator(star(3, bps), config) as sim:
        sim.submit([Flow(1, 1, 0, 10**10)], at=0)
        sim.submit([Flow(2, 2, 0, 10**10)], at=join_ns)
        marks: dict[int, tuple[int, int]] = {}
        for t in sorted({t for w in windows for t in w}):
            sim.advance(t)
            used = {(c.src, c.dst): c.bytes for c in sim.channel_usage()}
            marks[t] = (used.get((1, 3), 0), used.get((2, 3), 0))
    return [[(marks[b][i] - marks[a][i]) / (b - a) / line for i in (0, 1)] for a, b in windows]


@pytest.mark.parametrize("gbps", [100, 400])
def test_nscc_converges_to_the_fair_share_on_a_two_to_one_incast(ns3_lib, gbps: int) -> None:
    """Flow 2 joins a line-rate flow 1 at 100 us. From 200 us after the join, over two 1 ms windows, each flow
    sends half the port within 5% (wire bytes on its uplink), and the two fill it (>= 99%)."""
    bps = gbps * G
    config = packet_config_from_flags(cc="nscc", sets=uet_marking(bps), queue_sample_ns=0)
    join = 100 * US
    windows = [(join + 200 * US, join + 1200 * US), (join + 1200 * US, join + 2200 * US)]
    for first, second in port_shares(config, bps, join, windows):
        assert first == pytest.approx(0.5, rel=0.05) and second == pytest.approx(0.5, rel=0.05)
        assert first + second >= 0.99


def test_nscc_is_registered_with_its_attributes(ns3_lib) -> None:
    known = registry()
    assert known["nscc"].typeid == "ns3::CcNscc"
    assert {"TargetQdelay", "Gamma", "QaGate", "QuickAdapt", "Fi", "Eta", "Alpha", "MaxWindow"} <= set(
        known["nscc"].attributes
    )
    assert known["nscc"].attributes["Gamma"].default == "0.8"
    config = packet_config_from_flags(cc="nscc", sets=["cc.QuickAdapt=false", "cc.TargetQdelay=3us"])
    assert config.cc_attrs == {"QuickAdapt": "false", "TargetQdelay": "3us"}
