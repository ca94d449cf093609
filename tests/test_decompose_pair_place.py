"""Route (a)'s driver places a fabric flow whose endpoint pair has routes of different propagation by the flow's own
route, and routes each such flow once (`HybridDecomposedSimulator._pair_place` hands its route on to `_placed`).
No ns-3: the fake pool of tests/test_decompose_joins.py."""

from __future__ import annotations

from typing import Any

import pytest

import phantora.netsim.pieces as pieces_mod
from phantora.netsim.base import Flow
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.model import Topology
from tests.test_decompose import L_NS, SETTINGS
from tests.test_decompose_joins import _Pool

GBPS = 10**9


def two_route_piece() -> tuple[Topology, list[int]]:
    """GPUs 0, 1 on leaf a, GPU 2 on leaf b; a and b joined by two links, 1 us and 3 us (equal cost, different
    propagation: the pair 0 -> 2 has no one summary); an idle top-tier switch keeps a and b in one piece."""
    t = Topology("two-route")
    g = [t.add_node("gpu") for _ in range(3)]
    a, b = t.add_node("switch", tier=0), t.add_node("switch", tier=0)
    t.add_node("switch", tier=1)
    for x, leaf in ((g[0], a), (g[1], a), (g[2], b)):
        t.add_link(x, leaf, 100 * GBPS, 1_000)
    t.add_link(a, b, 100 * GBPS, 1_000)
    t.add_link(a, b, 50 * GBPS, 3_000)
    t.validate()
    return t, g


def test_a_pair_of_two_routes_places_each_flow_by_its_route_routing_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    topo, g = two_route_piece()
    pool: Any = _Pool
    sim = HybridDecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=1), pool)
    calls: list[int] = []
    real = pieces_mod.route_in_piece

    def counted(topo_: Topology, pieces: list[int], f: Flow) -> Any:
        calls.append(f.id)
        return real(topo_, pieces, f)

    monkeypatch.setattr(pieces_mod, "route_in_piece", counted)
    size = 1_000_000
    seen = set()
    for k in range(16):  # ECMP keys: both routes taken
        f = Flow(k, g[0], g[2], size, key=k)
        _, path = real(topo, sim.pieces, f)
        prop, bottleneck = topo.path_latency_ns(path), topo.path_bottleneck_bps(path)
        seen.add((prop, bottleneck))
        assert sim._placed(f) == (0, L_NS + prop + size * 8_000_000_000 // bottleneck)
    # closed forms of the two routes: 3 hops of 1 us at 100G; 1 + 3 + 1 us with the 50G link the bottleneck
    assert seen == {(3_000, 100 * GBPS), (5_000, 50 * GBPS)}
    assert calls == list(range(16))  # each flow routed once, the pair's first too
    assert sim._pairs[(g[0], g[2])][3] == -1  # the pair stays routed per flow
    sim.close()
