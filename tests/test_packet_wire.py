"""Wire presets and ACK coalescing (`--set wire=roce4k`, issue 13)."""

from __future__ import annotations

import pytest

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import WIRE_PRESETS, PacketConfig, apply_overrides
from phantora.topology.model import Topology

G = 10**9


def test_presets_set_packets_acks_and_pfc_thresholds_and_later_fields_win() -> None:
    cfg = apply_overrides(PacketConfig(), ["wire=roce4k"])
    assert (cfg.payload_bytes, cfg.header_bytes, cfg.ack_interval) == (4096, 62, 4)
    assert cfg.reserve_bytes == 4 * 4158 and cfg.resume_offset_bytes == 3 * 4158
    back = apply_overrides(cfg, ["wire=hpcc"])
    assert back == PacketConfig()  # hpcc is the default setting, field for field
    mixed = apply_overrides(PacketConfig(), ["wire=roce4k", "ack_interval=1"])
    assert (mixed.payload_bytes, mixed.ack_interval) == (4096, 1)
    with pytest.raises(InputError, match="roce4k") as exc:
        apply_overrides(PacketConfig(), ["wire=jumbo"])
    assert exc.value.field == "wire"
    assert set(WIRE_PRESETS) == {"hpcc", "roce4k"}


def pair(bps: int = 100 * G, lat: int = 1000) -> Topology:
    t = Topology("pair")
    a, s, b = t.add_node("host"), t.add_node("switch"), t.add_node("host")
    t.add_link(a, s, bps, lat)
    t.add_link(s, b, bps, lat)
    return t.validate()


@pytest.mark.parametrize("wire", ["hpcc", "roce4k"])
def test_a_lone_flow_runs_at_line_rate_less_its_headers(ns3_lib, wire: str) -> None:
    """FCT = packets x wire bytes / rate + 2 hops' propagation + one packet's store and forward."""
    cfg = apply_overrides(PacketConfig(), [f"wire={wire}"])
    size = 10 * 2**20
    with Ns3Simulator(pair(), cfg) as sim:
        sim.submit([Flow(1, 0, 2, size)], 0)
        (done,) = sim.drain()
        acks = sim.stats()["acks"]
    wire_bytes = cfg.payload_bytes + cfg.header_bytes
    packets = -(-size // cfg.payload_bytes)
    want = (packets * wire_bytes + wire_bytes) * 8 / 100 + 2000
    assert done.end_ns == pytest.approx(want, rel=0.002)
    assert acks == pytest.approx(packets / cfg.ack_interval, abs=2)


def test_coalesced_acks_never_stall_a_window_limited_sender(ns3_lib) -> None:
    """HPCC's window can fall below ack_interval packets: the ACK timer (ack_delay_ns) keeps the flow going
    where a pure every-4th-packet ACK would wait for packets the sender may not send."""
    t = Topology("star")
    sw = t.add_node("switch")
    hosts = [t.add_node("host") for _ in range(5)]
    for h in hosts:
        t.add_link(h, sw, 100 * G, 1000)
    t.validate()
    cfg = apply_overrides(PacketConfig(cc="hpcc"), ["wire=roce4k"])
    with Ns3Simulator(t, cfg) as sim:
        sim.submit([Flow(i, hosts[i], hosts[0], 2**20) for i in range(1, 5)], 0)
        done = sim.drain(limit_ns=10**9)
    assert len(done) == 4
    # 4 MiB through one 100G port: at least line rate's time, and no stall (well under 2x)
    span = max(c.end_ns for c in done)
    line = 4 * 2**20 * 8 / 100
    assert line < span < 2 * line
