"""A chunked Simple ring all-reduce across hosts of 8 H100 on a leaf-spine, against coarse flows (NCCL's time).

Where no link is shared (uplinks as wide as a leaf's NICs together), the chunked call's first delay nets exactly the
propagation and credits its longest chain pays, so it ends where coarse does, at every size. On testbed16's spines
(4 at 800G) ECMP puts six of the ring's network connections on one spine link: coarse then ends at its first delay
plus that link's bytes at its rate (plus the last hop's propagation), and the chunked call no sooner than its own
first delay plus those bytes, nor than its time without the shared link, and no later than coarse (its chain's
latency, netted from its delay, runs while the link carries other connections' steps).
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_cts
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.topology import Topology
from phantora.topology.generators import leaf_spine

MiB = 1 << 20
ENV = nccl_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})
SPINE_BPS = 800e9


def fabric(hosts: int, uplink: str) -> Topology:
    """testbed16's fabric with `hosts` leaves: a host of 8 H100 a leaf, a 400G NIC a GPU, 4 spines, 1 µs links."""
    return leaf_spine(hosts, 8, 4, nic_rate="400Gbps", uplink_rate=uplink, latency="1us", gpus_per_host=8,
                      nvlink_latency="25ns")  # fmt: skip


def run(topo: Topology, nbytes: int, granularity: str) -> tuple[list[Flow], int, int]:
    """The call's flows, its end on the idle flow network and its first delay (ns)."""
    coll = Collective("all_reduce", tuple(range(topo.num_ranks)), nbytes, "fp32")
    flows = decompose(coll, topo, AlgoOptions(granularity=granularity, nccl_env=ENV)).flows
    sim = FlowSimulator(topo)
    sim.submit(flows, at=0)
    end = max(c.end_ns for c in sim.drain())
    return flows, end, max(f.delay_ns for f in flows if not f.deps and not is_cts(f))


def busiest_spine_bytes(topo: Topology, flows: list[Flow]) -> tuple[int, int]:
    """(bytes, connections) of the directed spine link that carries the most data of `flows` (not clear-to-sends)."""
    on: dict[int, list[Flow]] = {}
    for f in flows:
        if f.size > 0 and f.src != f.dst and not is_cts(f):
            for c in topo.route(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic):
                link = topo.links[c >> 1]
                if 2 in (topo.nodes[link.a].tier, topo.nodes[link.b].tier):
                    on.setdefault(c, []).append(f)
    most = max(on.values(), key=lambda fs: sum(f.size for f in fs))
    return sum(f.size for f in most), len({(f.src, f.dst, f.key) for f in most})


@pytest.mark.parametrize(("hosts", "size"), [(2, 1), (2, 16), (2, 64), pytest.param(4, 16, marks=pytest.mark.slow)])
def test_without_a_shared_link_chunked_takes_coarse_time(hosts: int, size: int) -> None:
    """Uplinks at 3.2T (8 x 400G over 4 spines): chunked ends within 0.1% of coarse (NCCL's latency and bandwidth)."""
    topo = fabric(hosts, "3200Gbps")
    _, coarse, _ = run(topo, size * MiB, "coarse")
    _, chunked, _ = run(topo, size * MiB, "chunked")
    assert chunked == pytest.approx(coarse, rel=1e-3)


def test_on_an_overloaded_spine_link_chunked_is_between_its_bounds() -> None:
    """testbed16 (spines at 800G), 16 MiB: six connections of 2 x 15/16 x 1 MiB each on the busiest spine link;
    coarse ends at its delay + those bytes at 800 Gbit/s + the 4 µs path; chunked no sooner than its delay + those
    bytes, nor than the same call with wide uplinks, and sooner than coarse."""
    topo = fabric(2, "800Gbps")
    flows, coarse, coarse_delay = run(topo, 16 * MiB, "coarse")
    spine, conns = busiest_spine_bytes(topo, flows)
    assert (spine, conns) == (6 * 2 * 15 * MiB // 16, 6)
    load = spine * 8e9 / SPINE_BPS
    assert coarse == pytest.approx(coarse_delay + load + 4_000, abs=50)
    chunked_flows, chunked, chunked_delay = run(topo, 16 * MiB, "chunked")
    assert busiest_spine_bytes(topo, chunked_flows)[0] == spine
    _, unshared, _ = run(fabric(2, "3200Gbps"), 16 * MiB, "chunked")
    assert max(chunked_delay + load, unshared) <= chunked < coarse
