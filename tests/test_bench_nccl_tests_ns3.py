"""bench/bench_nccl_tests.py through ns-3 (issue 33 item 6): its `--table NAME@SIZE` and `--set` options, and the
gap it reports between ns-3 and the flow network where a NIC is the bound, against the wire's closed form."""

from __future__ import annotations

import pytest
from script_modules import load

from phantora.collectives.nccl.published import tables
from phantora.errors import InputError

bench = load("bench/bench_nccl_tests.py")
MiB = 1 << 20


def test_tables_take_their_own_largest_size() -> None:
    """`NAME@SIZE` caps the tables whose name contains NAME (nccl-tests' size syntax), else `--max-size`; a table
    named twice keeps its first spec; the data's order is kept."""
    chosen = bench.chosen_tables(["alcfsophia@64M", "a100_16gpu_2node@1G", "309_vm"], 5)
    got = {t.name: limit for t, limit in chosen}
    assert got["a100_16gpu_2node_hdr200assumed_all_gather_alcfsophia"] == 64 * MiB
    assert got["a100_16gpu_2node_hdr200_all_gather_mscclppndmv4"] == 1 << 30
    assert got["h100_32gpu_4node_ndr400_all_reduce_nccltests309_vm"] == 5
    order = [t.name for t in tables(include_held_out=True)]
    assert [t.name for t, _ in chosen] == [n for n in order if n in got]
    with pytest.raises(InputError, match="invalid size"):
        bench.chosen_tables(["alcfsophia@64Q"], 5)


def test_set_reaches_the_packet_engine_and_the_flow_network_takes_its_own_fields_only() -> None:
    spec = bench.engine_spec("ns3", ["wire=roce4k", "nic_latency=1us"])
    assert (spec.packet.payload_bytes, spec.packet.header_bytes, spec.nic_latency_ns) == (4096, 62, 1000)
    assert spec.packet.queue_sample_ns == 0  # no queues.csv to write
    with pytest.raises(InputError, match="ns3 only"):
        bench.engine_spec("flow", ["wire=roce4k"])
    assert bench.flow_spec(["wire=roce4k", "ecmp_hash=hpcc"]).packet.ecmp_hash == "hpcc"
    wire = bench.wire_spec(spec)
    assert (wire.network, wire.flow_goodput, wire.packet) == ("flow", True, spec.packet)


@pytest.mark.ns3
def test_a_nic_bound_send_recv_through_ns3_pays_its_headers_and_the_acks_of_what_it_receives(ns3_lib) -> None:
    """The held-out two-host B200 send/recv at 64 MiB: the PXN relay GPU's NIC sends 4 channels to the next host
    and receives the other host's 4, at its line rate. ns-3's wire carries 1048 B per 1000 B of payload and a 48 B
    ACK per packet received: busbw 1000 / 1096 of the flow network's, less NCCL's latency's share (< 0.3 points
    at this size); the flow network at goodput with the ACK stream gives ns-3's figure within 0.1%."""
    table = next(t for t in tables(include_held_out=True) if t.name == "b200_16gpu_2node_ib400_sendrecv_togetherp2p")
    size = 64 * MiB
    ns3, choice = bench.simulate(table, size, "ns3")
    flow, _ = bench.simulate(table, size, "flow")
    wire, _ = bench.simulate(table, size, bench.wire_spec(bench.engine_spec("ns3")))
    assert choice["algorithm"] == "p2p"
    assert 1000 / 1096 <= ns3 / flow <= 1000 / 1096 + 0.003
    assert ns3 == pytest.approx(wire, rel=1e-3)
