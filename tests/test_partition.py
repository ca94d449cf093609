"""phantora.netsim.partition: switch groups of any fabric, against closed forms (issue 38)."""

from __future__ import annotations

import pytest

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.partition import INF_NS, NO_GROUP, adopted, partition_fabric, partition_params
from phantora.topology.generators import fat_tree, leaf_spine
from phantora.topology.loader import load_topology


@pytest.mark.parametrize(("leaves", "spines", "n"), [(8, 4, 2), (8, 4, 4), (32, 8, 8), (6, 3, 3)])
def test_leaf_spine_cut_is_the_balanced_bipartite_cut(leaves: int, spines: int, n: int) -> None:
    """K(L, S) split into n equal groups of leaves and spines keeps L*S/n links inside: L*S*(1 - 1/n) are cut."""
    topo = leaf_spine(leaves, 4, spines, latency="700ns")
    p = partition_fabric(topo, n)
    assert len(p.cut_links) == leaves * spines * (n - 1) // n
    assert p.lookahead_ns == 700
    for g in range(n):
        names = [topo.nodes[v].name for v in p.members(g)]
        assert sum(x.startswith("leaf") for x in names) == leaves // n
        assert sum(x.startswith("spine") for x in names) == spines // n
    assert len(set(p.loads)) == 1


def test_nics_stay_with_their_leaf_and_nvswitches_are_outside_the_fabric() -> None:
    topo = load_topology("leafspine1024")
    p = partition_fabric(topo, 8)
    for link in topo.links:
        kinds = {topo.nodes[link.a].kind, topo.nodes[link.b].kind}
        if kinds == {"gpu", "switch"}:
            assert p.groups[link.a] == p.groups[link.b] != NO_GROUP
    assert all(p.groups[v] == NO_GROUP for v, node in enumerate(topo.nodes) if node.kind == "nvswitch")
    assert all(topo.nodes[topo.links[i].a].kind == "switch" for i in p.cut_links)


def _worker_groups(topo_name: str, n: int) -> tuple[list[int], list[tuple[int, int]]]:
    """A worker's partition.Groups under nvlink=fluid, and the (a, b) of every NVLink cable."""
    topo = load_topology(topo_name)
    params = dict(partition_params(topo, n, nvlink_fluid=True, worker=0))
    groups = [int(x) for x in params["partition.Groups"].split(",")]
    kinds = [node.kind for node in topo.nodes]
    return groups, [(lk.a, lk.b) for lk in topo.links if "nvswitch" in (kinds[lk.a], kinds[lk.b])]


def test_fluid_nvlink_cuts_no_nvlink_cable_where_hosts_sit_in_one_group() -> None:
    """leafspine1024 (4 hosts a leaf) into 4 groups: each NVSwitch runs with its 8 GPUs, so none of the 1024 NVLink
    cables is cut (their 25 ns would be every window's bound, not the fabric's 1 us) and no group n is left."""
    groups, nvlink = _worker_groups("leafspine1024", 4)
    assert len(nvlink) == 1024
    assert all(groups[a] == groups[b] for a, b in nvlink)
    assert set(groups) == {0, 1, 2, 3}


def test_fluid_nvlink_on_a_rail_fabric_keeps_the_nvswitch_in_a_group_of_its_own() -> None:
    """rail128 into 2: GPUs 0-3 of a host on one side, 4-7 on the other, so each NVSwitch is group n = 2, named
    idle (partition.Idle: it carries no packet, so its 25 ns cables bound no window); leafspine1024 has none."""
    groups, nvlink = _worker_groups("rail128", 2)
    topo = load_topology("rail128")
    switches = {v for v, node in enumerate(topo.nodes) if node.kind == "nvswitch"}
    assert {b for _, b in nvlink} | {a for a, _ in nvlink} >= switches
    assert len(switches) == 16 and all(groups[v] == 2 for v in switches)
    params = dict(partition_params(topo, 2, nvlink_fluid=True, worker=1))
    assert {int(v) for v in params["partition.Idle"].split(",")} == switches
    assert "partition.Idle" not in dict(partition_params(topo, 2, worker=1))  # packet NVLink: no idle node
    assert "partition.Idle" not in dict(partition_params(load_topology("leafspine1024"), 4, nvlink_fluid=True))


def test_adopted_needs_every_neighbour_in_one_group() -> None:
    """A node outside every group joins its neighbours' one group; with two groups, or an outside neighbour, it
    stays out."""
    topo = leaf_spine(2, 2, 1, gpus_per_host=1, nvswitch=False)  # nodes: 4 NICs, 2 leaves, 1 spine
    links = [(lk.a, lk.b) for lk in topo.links]
    leaf_of = {a: b for a, b in links if topo.nodes[a].kind == "gpu"} | {
        b: a for a, b in links if topo.nodes[b].kind == "gpu"
    }
    nic = next(iter(leaf_of))
    groups = [0 if topo.nodes[v].kind != "switch" or v == leaf_of[nic] else 1 for v in range(len(topo.nodes))]
    groups[nic] = NO_GROUP
    assert adopted(topo, groups)[nic] == groups[leaf_of[nic]]
    spine = next(v for v, node in enumerate(topo.nodes) if node.name.startswith("spine"))
    split = [g if v != spine else NO_GROUP for v, g in enumerate(groups)]
    assert adopted(topo, split)[spine] == NO_GROUP  # its leaves are in groups 0 and 1


def test_packet_nvlink_keeps_a_leaf_spine_host_whole() -> None:
    """Without nvlink=fluid the NVSwitch is in the fabric; whole hosts under one leaf cut no NVLink."""
    topo = load_topology("testbed16")
    p = partition_fabric(topo, 2, nvlink_fluid=False)
    assert len(p.cut_links) == 2 * 4 // 2
    assert p.lookahead_ns == 1000


def test_fat_tree_pods_stay_whole() -> None:
    """k-ary fat tree into k groups: every pod whole, each core with one pod: (k/2)^2 * (k - 1) core links cut."""
    k = 4
    topo = fat_tree(k)
    p = partition_fabric(topo, k)
    assert len(p.cut_links) == (k // 2) ** 2 * (k - 1)


def test_recorded_traffic_groups_the_leaves_that_talk() -> None:
    """4 leaves, traffic only leaf0 <-> leaf2 over spine0 and leaf1 <-> leaf3 over spine1 (ECMP keys picked so):
    the partition puts talking leaves together (topology order alone would pair leaf0 with leaf1), and the cut
    carries none of the bytes."""
    topo = leaf_spine(4, 2, 2)
    gpus = topo.endpoints  # 2 per leaf, in leaf order
    leaf = {topo.nodes[v].name: v for v in range(len(topo.nodes))}

    def key_via(a: int, b: int, spine: str) -> int:
        return next(k for k in range(64) if any(topo.channel_ends(ch)[1] == leaf[spine] for ch in topo.route(a, b, k)))

    pairs = [(0, 4, "spine0"), (1, 5, "spine0"), (2, 6, "spine1"), (3, 7, "spine1")]
    flows = [Flow(i, gpus[a], gpus[b], 1 << 20, key=key_via(gpus[a], gpus[b], s)) for i, (a, b, s) in enumerate(pairs)]
    plain = partition_fabric(topo, 2)
    assert plain.groups[leaf["leaf0"]] == plain.groups[leaf["leaf1"]]
    p = partition_fabric(topo, 2, flows)
    assert p.groups[leaf["leaf0"]] == p.groups[leaf["leaf2"]] != p.groups[leaf["leaf1"]]
    assert p.groups[leaf["leaf1"]] == p.groups[leaf["leaf3"]] == p.groups[leaf["spine1"]]
    assert p.cut_weight == len(p.cut_links)  # 1 per cut link: no byte crosses a cut


def test_one_group_cuts_nothing_and_deterministic() -> None:
    topo = load_topology("rail128")
    p = partition_fabric(topo, 1)
    assert p.cut_links == () and p.lookahead_ns == INF_NS
    assert partition_fabric(topo, 4) == partition_fabric(topo, 4)


def test_too_many_groups_is_refused() -> None:
    with pytest.raises(InputError, match="switch groups at most"):
        partition_fabric(leaf_spine(2, 2, 1), 4)
    with pytest.raises(InputError):
        partition_fabric(leaf_spine(2, 2, 1), 0)
