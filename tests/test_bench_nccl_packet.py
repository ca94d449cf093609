"""bench/bench_nccl_packet.py's closed form: a call costs NCCL's latency, then max(the proxies' turns, the transfer),
each network connection at least the turns (its rate cap) and at least its own transfer, not their sum.

The fabric: 4 hosts of one H100 on 2 leaves of 2 hosts and one spine, 400 Gbps NICs and 100 Gbps uplinks, so the
ring's hop from one leaf to the other is the network's bottleneck, slower than NCCL's model (which rates the NICs).
NCCL picks Ring/LL on 4 channels for an all-gather of 64 KiB and 256 KiB. Figures by hand:
- latency: baseLat Ring/LL 6.6 us + 3 network hops x hwLat NET 5.0 us (one GPU a node: the Tree/LL figure,
  NCCL 2.26 tuning.cc) = 21.6 us;
- the turns: each GPU's proxy serves 4 channels x (1 network send + 1 receive) x 3 steps (n - 1, each rank's chunk
  of 4 or 16 KiB a channel is one LL step) x 0.6 us (proxy.PROXY_STEP_US) = 14.4 us;
- the transfer: the busiest link direction, a leaf's uplink, carries one GPU's sends, 3 x S/4 x 2 (LL) bytes, at
  100 Gbps: 1.966 us x 4 = 7.864 us at 64 KiB, 31.457 us at 256 KiB.
At 64 KiB the turns bind (21.6 + 14.4 = 36.0 us); at 256 KiB the transfer does (21.6 + 31.457 = 53.057 us), where
the turns' excess over NCCL's time added to the transfer (the form before 07d2d18) gave 57.82 us.
"""

from __future__ import annotations

from typing import Any

import pytest
from script_modules import load

from phantora.collectives import AlgoOptions
from phantora.netsim.flow import FlowSimulator
from phantora.report import nccl_tests as nt
from phantora.topology import leaf_spine
from tests.test_tree_window import two_host_tree

bench = load("bench/bench_nccl_packet.py")
KiB, MiB = 1024, 1024**2
LAT_US = 6.6 + 3 * 5.0
TURNS_US = 4 * 2 * 3 * 0.6


def _call(size: int) -> tuple[dict[str, Any], float, float]:
    """(NCCL's choice, the busiest link's time, the call's time on the flow network), us."""
    topo = leaf_spine(2, 2, 1, gpus_per_host=1, uplink_rate="100Gbps", gpu="h100")
    it = nt.build_iteration(nt.find_test("all_gather_perf"), (0, 1, 2, 3), size, "fp32", 0, topo, AlgoOptions(), 0,
                            "t")  # fmt: skip
    assert it.choice is not None and bench.crosses_nodes(topo, it.flows)
    assert (it.choice["algorithm"], it.choice["protocol"], it.choice["channels"]) == ("Ring", "LL", 4)
    assert it.choice["model_lat_us"] == pytest.approx(LAT_US)
    return it.choice, bench.link_bound_us(topo, it.flows), nt.run_iteration(FlowSimulator(topo), it) / 1e3


def test_the_turns_bind_a_small_call() -> None:
    choice, link, flow = _call(64 * KiB)
    assert link == pytest.approx(3 * 16 * KiB * 2 * 8 / 100e3, abs=1e-3)  # 7.864 us, under the turns
    assert bench.closed_form_us(choice, link) == pytest.approx(LAT_US + TURNS_US, abs=0.002)
    assert flow == pytest.approx(LAT_US + TURNS_US, abs=0.01)


def test_the_transfer_binds_a_larger_call_without_the_turns_on_top() -> None:
    choice, link, flow = _call(256 * KiB)
    assert link == pytest.approx(3 * 64 * KiB * 2 * 8 / 100e3, abs=1e-3)  # 31.457 us, over the turns
    nccl = float(choice["model_time_us"]) - LAT_US  # NCCL's transfer, 9.64 us: under the turns
    assert nccl < TURNS_US < link
    assert float(choice["proxy_us"]) == pytest.approx(TURNS_US - nccl, abs=0.002)
    assert bench.closed_form_us(choice, link) == pytest.approx(LAT_US + link, abs=0.002)
    assert flow == pytest.approx(LAT_US + link, abs=0.01)
    assert flow < LAT_US + (TURNS_US - nccl) + link - 4.0  # not the sum (57.82 us)


def test_the_wire_bytes_are_the_data_flows_and_ns3_also_delivers_the_clear_to_sends() -> None:
    """A chunked tree all-reduce of 4 MiB on 2 GPUs, each a host of its own: 64 steps of 64 KiB up and 64 down, each
    across hosts answered by its receiver's 64 B clear-to-send (sizeof(ncclIbSendFifo), net_ib/common.h). The data
    flows carry the payload's closed form, 2(n - 1)S = 8 MiB (Simple: wire factor 1), and the clear-to-sends
    128 x 64 B = 8 KiB beside it; ns-3's counter holds both, so a row is right with the one and the other apart."""
    flows, up, down = two_host_tree(1_000, 8)
    assert len(up) == len(down) == 64
    wire, data, cts = bench.wire_bytes(flows)
    assert wire == bench.payload_closed_form("all_reduce", "Tree", 2, 2, 4 * MiB) == 8 * MiB
    assert data == 128 and cts == 128 * 64
    row = bench.Row("star", bench.Case("all_reduce_perf", 4 * MiB), {}, len(flows), wire, 8 * MiB, 0,
                    wire + cts, cts, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0)  # fmt: skip
    assert bench.check(row, 0.02) == []
    row.delivered = wire  # the clear-to-sends lost
    assert bench.check(row, 0.02) == [f"ns-3 delivered {wire} != flows' {wire} + CTS {cts}"]
