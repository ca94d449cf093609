"""The packet engine charges a rate-capped flow's cap for the packet being sent (issue 33): packet k's last bit
leaves the NIC no earlier than start + (k + 1) x payload x 8 / cap, so the flow's last byte leaves at
start + size x 8 / cap, what the flow engine and the standalone FCT (`PhantoraFabric::StandaloneNs`) charge. Closed
forms on one switch (100 Gb/s links of 1 us; 1000-byte payloads, 48 header bytes, ACKs of 48 bytes, no CC), and
NCCL's 4-byte all-reduce across testbed16's hosts in both modes (docs/packet-model.md "Per-flow rate cap")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.cli import main as phantora_main
from phantora.netsim.base import Flow
from tests.test_packet_engine import G, star

pytestmark = pytest.mark.ns3

LAT = 1000  # ns, each link
LINE = 100 * G
PAYLOAD, HEADER, ACK = 1000, 48, 48


def ns(nbytes: int, bps: int) -> float:
    return nbytes * 8 * G / bps


def run_one(size: int, cap: int) -> tuple[int, int, int]:
    """One flow from host 0 to host 1: (its completion - start, its FCT at the last ACK, its standalone FCT)."""
    from phantora.netsim.packet import Ns3Simulator
    from phantora.netsim.packet_config import PacketConfig

    with Ns3Simulator(star(2), PacketConfig()) as sim:
        sim.submit([Flow(1, 0, 1, size, rate_bps=cap)], at=0)
        (done,) = sim.drain()
        assert sim.finish()
        (rec,) = sim.fct_records()
    return done.end_ns - done.start_ns, rec.fct_ns, rec.standalone_ns


@pytest.mark.parametrize(("size", "cap"), [(500, 10 * G), (16, 35_555_556), (10_500, 10 * G), (1_000_000, 25 * G)])
def test_capped_flow_ends_at_size_over_cap_plus_the_path(ns3_lib, size: int, cap: int) -> None:
    """The last bit leaves the NIC at size / cap (one packet: held for its payload at the cap, not sent at once),
    then the switch's hop of the last packet at line rate and the two delays; the FCT adds the ACK's way back.
    The standalone FCT is base RTT (2 x 2 delays + a full packet per hop) + size / cap: the measured FCT differs
    from it only by those per-packet terms (the cap's share is the same: size / cap)."""
    last = size - (size - 1) // PAYLOAD * PAYLOAD  # the last packet's payload
    out = ns(size, cap)
    assert out > ns(last + HEADER, LINE)  # the cap binds
    arrive = out + ns(last + HEADER, LINE) + 2 * LAT
    took, fct, alone = run_one(size, cap)
    assert took == pytest.approx(arrive, abs=2)
    assert fct == pytest.approx(arrive + 2 * ns(ACK, LINE) + 2 * LAT, abs=3)
    base_rtt = 4 * LAT + 2 * ns(PAYLOAD, LINE)
    assert alone == pytest.approx(base_rtt + out, abs=1)


@pytest.mark.parametrize("size", [500, 1000, 10_000, 10_500])
def test_a_cap_at_the_payload_line_rate_holds_nothing(ns3_lib, size: int) -> None:
    """A cap of the line rate in payload bits (100 Gb/s): a packet's payload at it takes less than its wire bytes
    at line rate, so the flow goes as uncapped, to the ns: packets back to back, then the last one's second hop
    (for whole packets; a short last one waits at the switch for the full one before it)."""
    free = run_one(size, 0)
    capped = run_one(size, LINE)
    assert capped == free
    pkts = (size + PAYLOAD - 1) // PAYLOAD
    if size % PAYLOAD == 0 or pkts == 1:
        last = size - (pkts - 1) * PAYLOAD
        assert free[0] == pytest.approx(ns(size + pkts * HEADER, LINE) + ns(last + HEADER, LINE) + 2 * LAT, abs=2)


def _replay(tmp_path: Path, network: list[str]) -> tuple[int, list[dict[str, str]]]:
    import csv

    work = tmp_path / "w.toml"
    work.write_text('name = "ar4"\n[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = 4\nranks = [0, 1, 8, 9]\n')
    out = tmp_path / ("ns3" if network else "flow")
    assert phantora_main(["replay", str(work), "--topology", "testbed16", *network, "--out", str(out), "--quiet"]) == 0
    (op,) = json.loads((out / "results.json").read_text())["ops"]
    with (out / "flows.csv").open() as f:
        return int(op["time_ns"]), list(csv.DictReader(f))


def test_small_ll_all_reduce_across_hosts_agrees_between_the_modes(ns3_lib, tmp_path: Path) -> None:
    """NCCL's Ring LL 4-byte all-reduce on GPUs [0, 1, 8, 9] of testbed16: each cross-host flow is one 16-byte
    packet capped at its proxy's turn (16 B in `proxy_us` 3.6 us). Flow mode charges 16 B / cap = 3,600 ns; so
    does the packet engine now (before: 17,706 against 21,300 ns a call, the packet not held). What remains is
    the one 64-byte packet's store and forward at the switches (about 1.3 ns a 400G hop) and whole-ns rounding."""
    flow_ns, flow_rows = _replay(tmp_path, [])
    pkt_ns, pkt_rows = _replay(tmp_path, ["--network", "ns3", "--cc", "dcqcn"])
    assert flow_ns == 21_300
    assert abs(pkt_ns - flow_ns) <= 0.001 * flow_ns
    cross = [r for r in pkt_rows if int(r["rate_cap_bps"]) < 10**9]
    assert len(cross) == 2 and all(int(r["size_bytes"]) == 16 for r in cross)
    for r in cross:
        assert int(r["fct_ns"]) >= ns(16, int(r["rate_cap_bps"])) + 1000  # the cap's 3,600 ns and more
        assert float(r["slowdown"]) == pytest.approx(1.0, abs=0.01)
    flow_took = {r["flow_id"]: int(r["end_ns"]) - int(r["start_ns"]) for r in flow_rows}
    for r in cross:  # each cross-host flow within a few ns of the flow engine's
        assert int(r["end_ns"]) - int(r["start_ns"]) == pytest.approx(flow_took[r["flow_id"]], abs=10)
