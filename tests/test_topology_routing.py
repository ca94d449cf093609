"""Routing on generated topologies: hop counts, NVSwitch use, ECMP spread, determinism, speed, connectivity."""

from __future__ import annotations

import time
from collections import Counter

import networkx as nx
import pytest

from phantora.errors import InputError
from phantora.topology import Topology, fat_tree, leaf_spine, load_topology, rail_optimized


def hop_names(t: Topology, src: int, dst: int, key: int = 0) -> list[str]:
    return [t.nodes[t.channel_ends(ch)[1]].name for ch in t.route(src, dst, key)]


def check_path(t: Topology, src: int, dst: int, path: list[int]) -> None:
    """The channels chain from src to dst and every intermediate node forwards (switch/NVSwitch)."""
    node = src
    for i, ch in enumerate(path):
        a, b = t.channel_ends(ch)
        assert a == node
        if i < len(path) - 1:
            assert t.nodes[b].kind in ("switch", "nvswitch")
        node = b
    assert node == dst


def reference_hops(t: Topology, src: int, dst: int) -> int:
    """Shortest path through switches only, by networkx on a graph without other endpoints or NVSwitches."""
    g = nx.Graph()
    for lk in t.links:
        ka, kb = t.nodes[lk.a].kind, t.nodes[lk.b].kind
        if "nvswitch" in (ka, kb):
            continue
        if (ka != "switch" and lk.a not in (src, dst)) or (kb != "switch" and lk.b not in (src, dst)):
            continue
        g.add_edge(lk.a, lk.b)
    return nx.shortest_path_length(g, src, dst)


def test_fat_tree_hops() -> None:
    k = 4
    t = fat_tree(k)
    eps = t.endpoints
    assert len(t.route(eps[0], eps[1])) == 2  # same edge switch
    assert len(t.route(eps[0], eps[2])) == 4  # same pod, other edge
    assert len(t.route(eps[0], eps[4])) == 6  # other pod: edge-agg-core-agg-edge
    # all (k/2)^2 core paths between pods are used by some key
    cores = {hop_names(t, eps[0], eps[15], key)[2] for key in range(400)}
    assert cores == {f"core{c}" for c in range(k * k // 4)}


@pytest.mark.parametrize(
    "make",
    [
        lambda: fat_tree(6),
        lambda: leaf_spine(4, 16, 3, gpus_per_host=8),
        lambda: rail_optimized(6, 4, 2, hosts_per_leaf=3),
        lambda: load_topology("hpcc/twoleaf8"),
    ],
)
def test_routes_are_shortest_switch_paths(make) -> None:
    t = make()
    eps = t.endpoints
    for i, src in enumerate(eps):
        dst = eps[(i * 7 + 3) % len(eps)]
        if dst == src:
            continue
        path = t.route(src, dst, flow_key=i)
        check_path(t, src, dst, path)
        if t.shared_nvswitch(src, dst) is None:
            assert len(path) == reference_hops(t, src, dst)
        else:
            assert [t.nodes[t.channel_ends(ch)[1]].kind for ch in path] == ["nvswitch", t.nodes[dst].kind]


def test_testbed16_paths() -> None:
    t = load_topology("testbed16")
    assert hop_names(t, 0, 7) == ["nvsw0", "gpu7"]  # intra-host: NVSwitch
    for key in range(20):
        names = hop_names(t, 3, 12, key)  # cross-host: leaf -> spine -> leaf
        assert names[0] == "leaf0" and names[1].startswith("spine") and names[2] == "leaf1" and names[3] == "gpu12"
    path = t.route(3, 12)
    assert t.path_latency_ns(path) == 4 * 1000
    assert t.path_bottleneck_bps(path) == 400 * 10**9


def test_rail_paths() -> None:
    t = load_topology("rail128")
    assert hop_names(t, 0, 8) == ["rail0", "gpu8"]  # same rail, other host: one switch
    assert hop_names(t, 0, 5) == ["nvsw0", "gpu5"]  # same host: NVSwitch
    names = hop_names(t, 0, 9)  # other rail, other host: rail0 -> spine -> rail1
    assert names[0] == "rail0" and names[1].startswith("spine") and names[2:] == ["rail1", "gpu9"]


def test_ecmp_spreads_evenly_over_spines() -> None:
    t = load_topology("leafspine1024")
    spines = Counter(hop_names(t, 0, 1023, key)[1] for key in range(8000))
    assert set(spines) == {f"spine{j}" for j in range(8)}
    # 8000 keys over 8 spines: 1000 each, binomial sd ~30; allow 5 sd
    assert all(850 <= c <= 1150 for c in spines.values()), spines


def test_routes_are_deterministic() -> None:
    a, b = load_topology("leafspine1024"), load_topology("leafspine1024")
    for key in range(50):
        assert a.route(key, 1023 - key, key) == b.route(key, 1023 - key, key)
        assert a.route(key, 1023 - key, key) == a.route(key, 1023 - key, key)


def test_build_and_route_1024_is_fast() -> None:
    t0 = time.perf_counter()
    t = load_topology("leafspine1024")
    n = t.num_ranks
    paths = [t.route(t.endpoints[i], t.endpoints[(i + 37) % n], i) for i in range(n)]
    elapsed = time.perf_counter() - t0
    assert all(len(p) == 4 for p in paths)  # rank i and i+37 are on different leaves (32 per leaf)
    assert elapsed < 3.0, f"building and routing 1024 flows took {elapsed:.2f}s"


def test_disconnected_fabrics_are_refused() -> None:
    t = Topology(name="split")
    h = [t.add_node("host") for _ in range(4)]
    s0, s1 = t.add_node("switch"), t.add_node("switch")
    for e, s in ((h[0], s0), (h[1], s0), (h[2], s1), (h[3], s1)):
        t.add_link(e, s, 10**9, 1)
    with pytest.raises(InputError, match="disconnected") as err:
        t.validate(source="split.toml")
    assert "split.toml" in str(err.value)


def test_endpoints_do_not_bridge_fabrics() -> None:
    # host1 is dual-homed to two separate switches: host0 and host2 still have no route
    t = Topology(name="bridge")
    h = [t.add_node("host") for _ in range(3)]
    s0, s1 = t.add_node("switch"), t.add_node("switch")
    t.add_link(h[0], s0, 10**9, 1)
    t.add_link(h[1], s0, 10**9, 1)
    t.add_link(h[1], s1, 10**9, 1)
    t.add_link(h[2], s1, 10**9, 1)
    with pytest.raises(InputError, match="host0 .* cannot reach host2"):
        t.validate()


def test_gpu_without_nic_cannot_leave_its_host() -> None:
    t = leaf_spine(1, 8, 0, gpus_per_host=8)
    lonely = Topology(name="lonely")
    for n in t.nodes:
        lonely.add_node(n.kind, n.name, n.host, n.tier)
    for lk in t.links:
        if not (lk.a == 3 and t.nodes[lk.b].kind == "switch"):
            lonely.add_link(lk.a, lk.b, lk.bandwidth_bps, lk.latency_ns)
    lonely.add_node("gpu", "gpu_far")
    lonely.add_link(len(lonely.nodes) - 1, 9, 10**9, 1)  # node 9 is the leaf
    with pytest.raises(InputError, match="gpu3"):
        lonely.validate()


def test_direct_links_and_single_host_are_valid() -> None:
    t = Topology(name="pair")
    a, b = t.add_node("host"), t.add_node("host")
    t.add_link(a, b, 10**9, 5)
    t.validate()
    assert t.route(a, b) == [0] and t.route(b, a) == [1]
    chain = Topology(name="chain")
    x, y, z = (chain.add_node("host") for _ in range(3))
    chain.add_link(x, y, 10**9, 1)
    chain.add_link(y, z, 10**9, 1)
    with pytest.raises(InputError, match="disconnected"):
        chain.validate()  # endpoints do not forward, so x cannot reach z


def test_one_path_is_whether_the_key_can_change_the_route() -> None:
    """`one_path` (route caches key such pairs by pair alone): true for NVLink pairs and pairs under one leaf, false
    across leaves with two spines, and where it says true every key of 64 gives the same route, where false some
    two keys differ (networkx counts the shortest paths the ECMP choices span)."""
    t = leaf_spine(2, 4, 2, gpus_per_host=2)
    eps = t.endpoints
    for src in eps:
        for dst in eps:
            if src == dst:
                continue
            routes = {tuple(t.route(src, dst, key)) for key in range(64)}
            assert t.one_path(src, dst) == (len(routes) == 1), (src, dst)
    a, b = eps[0], eps[-1]  # opposite leaves: one path a spine
    assert t.shared_nvswitch(eps[0], eps[1]) is not None and t.one_path(eps[0], eps[1])
    assert not t.one_path(a, b)
    g = nx.DiGraph(
        [t.channel_ends(c) for c in range(t.num_channels) if t.nodes[t.channel_ends(c)[0]].kind != "nvswitch"]
    )
    assert len(list(nx.all_shortest_paths(g, a, b))) == 2
