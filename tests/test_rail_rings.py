"""Rings on rail-optimised fabrics stay on their rails (phantora's own alternating rings), and nothing changes
elsewhere. The NCCL model's rings on NVSwitch hosts are NCCL's search's (tests/test_nccl_nvswitch_rings.py)."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.layout import host_blocks, rail_aligned, ring_order
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine, rail_optimized


def _ring_flows(topo, nbytes: int = 8 << 20, channels: int = 8, model: str = "nccl"):
    ranks = list(range(topo.num_ranks))
    opts = AlgoOptions("ring", "coarse", channels, model=model)
    return decompose(Collective("all_reduce", ranks, nbytes), topo, opts).flows


def _cross_rail(topo, flows) -> list[tuple[int, int]]:
    """The (src, dst) of flows between hosts whose route climbs above the rail leaves."""
    out = []
    for f in flows:
        if f.size and topo.nodes[f.src].host != topo.nodes[f.dst].host:
            if any(topo.nodes[topo.channel_ends(ch)[1]].tier >= 2 for ch in topo.route(f.src, f.dst)):
                out.append((f.src, f.dst))
    return out


@pytest.mark.parametrize("hosts", [2, 4, 16])
def test_every_host_to_host_hop_of_a_ring_stays_on_one_rail(hosts: int) -> None:
    topo = rail_optimized(hosts, 8, spines=8, nic_rate="400Gbps", uplink_rate="800Gbps")
    nodes = [topo.node_of_rank(r) for r in range(topo.num_ranks)]
    assert rail_aligned(topo, nodes, host_blocks(topo, nodes))
    flows = _ring_flows(topo)
    assert sum(1 for f in flows if topo.nodes[f.src].host != topo.nodes[f.dst].host) >= hosts
    assert _cross_rail(topo, flows) == []


def test_an_odd_host_count_crosses_rails_once_per_channel() -> None:
    """The ideal model's rings: the hop from the last host back to the first joins local indices c-1 and c when the
    host count is odd (NCCL's rings do not: tests/test_nccl_nvswitch_rings.py)."""
    topo = rail_optimized(3, 4, spines=4, nic_rate="100Gbps", uplink_rate="100Gbps")
    flows = _ring_flows(topo, channels=4, model="ideal")
    assert len(_cross_rail(topo, flows)) == 4


def test_each_rank_appears_once_and_hosts_stay_contiguous() -> None:
    blocks = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    for c in range(4):
        ring = ring_order(blocks, c, alternate=True)
        assert sorted(ring) == list(range(16))
        assert [set(ring[4 * h : 4 * h + 4]) for h in range(4)] == [set(b) for b in blocks]
        local = [p % 4 for p in ring]
        assert all(local[4 * h + 3] == local[4 * h + 4] for h in range(3))  # leave and enter on one rail
        assert local[-1] == local[0]


def test_a_leaf_per_host_fabric_keeps_its_rings() -> None:
    """One leaf per host (testbed16's shape): no rails, so the ideal model's rings are the rotated host-contiguous
    ones."""
    topo = leaf_spine(2, 8, 4, gpus_per_host=8, nic_rate="400Gbps", uplink_rate="800Gbps")
    nodes = [topo.node_of_rank(r) for r in range(topo.num_ranks)]
    blocks = host_blocks(topo, nodes)
    assert not rail_aligned(topo, nodes, blocks)
    firsts = [f for f in _ring_flows(topo, channels=2, model="ideal")][:16]
    order = ring_order(blocks, 0)
    assert {(f.src, f.dst) for f in firsts} == {
        (nodes[a], nodes[b]) for a, b in zip(order, order[1:] + order[:1], strict=False)
    }


def test_ring_all_reduce_on_rails_takes_the_closed_form() -> None:
    """Coarse ring all-reduce, NVLink far faster than the NICs: 2 (n-1)/n x S / B_nic per channel share. The
    ideal decomposition's line-rate closed form (the NCCL model's own are in tests/test_nccl_model.py)."""
    topo = rail_optimized(4, 8, spines=8, nic_rate="400Gbps", uplink_rate="800Gbps")
    nbytes = 64 << 20
    flows = _ring_flows(topo, nbytes, model="ideal")
    sim = FlowSimulator(topo)
    sim.submit(flows, 0)
    done = sim.drain()
    n = topo.num_ranks
    ideal = 2 * (n - 1) / n * nbytes / 8 * 8 / 400e9 * 1e9  # 8 channels, one NIC each per host
    end = max(c.end_ns for c in done)
    assert end == pytest.approx(ideal, rel=0.02)
