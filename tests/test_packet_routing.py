"""ECMP in the ns-3 fabric equals phantora.topology.model.Topology.route, in its tables and on the wire."""

from __future__ import annotations

import pytest

from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

pytestmark = pytest.mark.ns3

G = 10**9


def two_tier() -> Topology:
    """Hosts 0-3 on leaf 8, 4-7 on leaf 9, four spines 10-13; hosts 14 and 15 are dual-homed to both leaves."""
    t = Topology("two-tier")
    for _ in range(8):
        t.add_node("host")
    leaves = [t.add_node("switch"), t.add_node("switch")]
    spines = [t.add_node("switch") for _ in range(4)]
    duals = [t.add_node("host"), t.add_node("host")]
    for h in range(8):
        t.add_link(h, leaves[h // 4], 100 * G, 1000)
    for leaf in leaves:
        for s in spines:
            t.add_link(leaf, s, 100 * G, 1000)
    for d in duals:
        t.add_link(d, leaves[0], 100 * G, 1000)  # links 16, 18
        t.add_link(d, leaves[1], 100 * G, 1000)  # links 17, 19
    return t.validate()


def test_ecmp_tables_equal_python_routes(ns3_lib) -> None:
    topo = two_tier()
    hosts = topo.endpoints
    with Ns3Simulator(topo) as sim:
        used = set()
        for key in range(64):
            for s in hosts:
                for d in hosts:
                    if s != d:
                        path = topo.route(s, d, key)
                        assert sim.route(s, d, key) == path, (s, d, key)
                        used.add(tuple(path))
        # The hash really spreads: cross-leaf flows use all four spines; between the dual-homed hosts (two
        # equal-cost paths, chosen at the sending NIC) both uplinks.
        assert len({p[1] for p in used if len(p) == 4}) >= 8
        assert {topo.route(14, 15, k)[0] for k in range(64)} == {2 * 16, 2 * 17}


def test_packets_follow_the_python_route(ns3_lib) -> None:
    topo = two_tier()
    for key in (3, 11, 42):
        with Ns3Simulator(topo) as sim:
            sim.submit([Flow(1, 1, 6, 200_000, key=key)], at=0)
            sim.drain()
            forward = {u.channel for u in sim.channel_usage() if u.bytes >= 200_000}
            assert forward == set(topo.route(1, 6, key))


def test_nvswitch_paths_and_speed(ns3_lib) -> None:
    """Two DGX-like hosts of 2 GPUs: GPUs of one host talk over the NVSwitch, others through the leaf."""
    topo = leaf_spine(1, 4, 0, nic_rate="400Gbps", gpus_per_host=2, nvlink_rate="3600Gbps", latency="1us")
    gpus = topo.endpoints
    with Ns3Simulator(topo) as sim:
        for s in gpus:
            for d in gpus:
                if s != d:
                    assert sim.route(s, d, 7) == topo.route(s, d, 7)
        size = 9_000_000
        sim.submit([Flow(1, gpus[0], gpus[1], size), Flow(2, gpus[0], gpus[2], size)], at=0)
        done = {c.flow_id: c for c in sim.drain()}
        lat = topo.path_latency_ns(topo.route(gpus[0], gpus[1], 1))
        pkt = 1048 * 8 / 3600  # ns per packet on NVLink
        assert done[1].end_ns == pytest.approx(size // 1000 * pkt + pkt + lat, abs=5)
        pkt = 1048 * 8 / 400
        assert done[2].end_ns == pytest.approx(size // 1000 * pkt + pkt + 2000, abs=5)
