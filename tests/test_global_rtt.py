"""The fabric-wide base RTT and BDP every CC is told (HPCC's GLOBAL_T; `PhantoraFabric::ComputeGlobalRtt`), against
their closed form over Python's own routes: for every ordered pair of endpoints (key 0), 2 x the path's propagation
plus one payload's serialisation per hop (integer ps, floored to ns), and that RTT times the path's bottleneck rate.
On a leaf-spine whose every link has its own latency and rate, so the maximum depends on the hop each ECMP policy
picks, and with hosts of two GPUs (pairs through a shared NVSwitch)."""

from __future__ import annotations

import pytest

from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

pytestmark = pytest.mark.ns3

PAYLOAD = 1000


def uneven(ecmp: str) -> Topology:
    """leaf_spine(3, 4, 3, gpus_per_host=2) with a latency and a rate of its own on each link."""
    base = leaf_spine(3, 4, 3, gpus_per_host=2)
    topo = Topology(name="uneven", ecmp_hash=ecmp)
    for n in base.nodes:
        topo.add_node(n.kind, n.name, n.host, n.tier)
    for lk in base.links:
        topo.add_link(lk.a, lk.b, (100, 200, 400)[lk.id % 3] * 10**9, 200 + 137 * (lk.id % 7))
    return topo


def closed_form(topo: Topology) -> tuple[int, int]:
    """(max RTT ns, max BDP bytes) over every ordered endpoint pair, from `Topology.route` with key 0."""
    eps = [n.id for n in topo.nodes if n.kind in ("gpu", "host")]
    rtt_max = bdp_max = 0
    for s in eps:
        for d in eps:
            if s == d:
                continue
            path = topo.route(s, d, 0)
            links = [topo.links[ch >> 1] for ch in path]
            tx_ps = sum(PAYLOAD * 8 * 10**12 // lk.bandwidth_bps for lk in links)
            rtt = 2 * sum(lk.latency_ns for lk in links) + tx_ps // 1000
            rtt_max = max(rtt_max, rtt)
            bdp_max = max(bdp_max, rtt * min(lk.bandwidth_bps for lk in links) // 8_000_000_000)
    return rtt_max, bdp_max


@pytest.mark.parametrize("ecmp", ["phantora", "hpcc"])
def test_global_rtt_and_bdp_are_the_closed_form(ns3_lib, ecmp: str) -> None:
    topo = uneven(ecmp)
    rtt, bdp = closed_form(topo)
    sim = Ns3Simulator(topo, PacketConfig(cc="hpcc", payload_bytes=PAYLOAD, ecmp_hash=ecmp))
    try:
        stats = sim.stats()
    finally:
        sim.close()
    assert (stats["cc_base_rtt_ns"], stats["cc_bdp_bytes"]) == (rtt, bdp)
    assert rtt > 2 * 3 * 200  # the uneven latencies count (three hops of at least 200 ns each way)
