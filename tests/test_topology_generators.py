"""Generators: node/link counts against closed forms, oversubscription, hosts, tiers, bad parameters."""

from __future__ import annotations

from collections import Counter

import pytest

from phantora.errors import InputError
from phantora.topology import dgx_host, fat_tree, leaf_spine, rail_optimized
from phantora.topology.describe import leaf_oversubscription, rank_bisection_bps

G = 10**9


def kinds(topo) -> Counter:
    return Counter(n.kind for n in topo.nodes)


@pytest.mark.parametrize("k", [2, 4, 6, 8])
def test_fat_tree_counts(k: int) -> None:
    t = fat_tree(k)
    assert t.num_ranks == k**3 // 4
    assert kinds(t)["switch"] == 5 * k * k // 4
    tiers = Counter(n.tier for n in t.nodes if n.kind == "switch")
    assert tiers == {1: k * k // 2, 2: k * k // 2, 3: k * k // 4}
    assert len(t.links) == 3 * k**3 // 4  # host-edge, edge-agg, agg-core: k^3/4 each
    # every switch has k ports, every endpoint one
    degree = Counter(x for link in t.links for x in (link.a, link.b))
    assert all(degree[n.id] == (1 if n.kind == "gpu" else k) for n in t.nodes)


def test_fat_tree_full_bisection() -> None:
    t = fat_tree(4, link_rate="100Gbps")
    assert rank_bisection_bps(t) == (4**3 // 8) * 100 * G  # k^3/8 hosts per half at line rate
    assert leaf_oversubscription(t) == [1.0] * 8


def test_fat_tree_odd_k_rejected() -> None:
    with pytest.raises(InputError, match="field 'k'"):
        fat_tree(5)


@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 1.5])
def test_leaf_spine_oversubscription(ratio: float) -> None:
    t = leaf_spine(4, 24, 4, nic_rate="400Gbps", oversubscription=ratio)
    uplinks = {link.bandwidth_bps for link in t.links if t.nodes[link.a].kind == "switch" == t.nodes[link.b].kind}
    assert uplinks == {round(24 * 400 * G / (4 * ratio))}
    assert leaf_oversubscription(t) == pytest.approx([ratio] * 4)
    assert t.meta["oversubscription"] == pytest.approx(ratio)


def test_leaf_spine_counts_with_dgx_hosts() -> None:
    leaves, per_leaf, spines = 4, 16, 2
    t = leaf_spine(leaves, per_leaf, spines, gpus_per_host=8, gpu="h100")
    assert kinds(t) == {"gpu": 64, "nvswitch": 8, "switch": leaves + spines}
    assert len(t.links) == 64 + 64 + leaves * spines  # NVLink + NIC + leaf-spine
    nvlinks = [lk for lk in t.links if "nvswitch" in (t.nodes[lk.a].kind, t.nodes[lk.b].kind)]
    assert {lk.bandwidth_bps for lk in nvlinks} == {3600 * G}  # H100: 450 GB/s per direction
    # host h holds GPUs 8h..8h+7; its NVSwitch belongs to the same host; ranks are GPU ids
    assert [t.nodes[e].host for e in t.endpoints] == [r // 8 for r in range(64)]
    assert t.endpoints == list(range(64))
    for lk in nvlinks:
        assert t.nodes[lk.a].host == t.nodes[lk.b].host
    # a host's 8 NICs sit under one leaf
    for h in range(8):
        leaves_of_host = {v for g in range(8 * h, 8 * h + 8) for v, _ in t.neighbours(g) if t.nodes[v].kind == "switch"}
        assert len(leaves_of_host) == 1


def test_leaf_spine_4to1_bisection() -> None:
    t = leaf_spine(8, 16, 4, nic_rate="100Gbps", oversubscription=4)
    # each half has 4 leaves whose uplinks carry a quarter of their 16 x 100G downlinks
    assert rank_bisection_bps(t) == 4 * 16 * 100 * G // 4


def test_leaf_spine_star_and_argument_errors() -> None:
    star = leaf_spine(1, 8, 0, nic_rate="100Gbps")
    assert kinds(star) == {"gpu": 8, "switch": 1}
    with pytest.raises(InputError, match="field 'spines'"):
        leaf_spine(2, 8, 0)
    with pytest.raises(InputError, match="field 'oversubscription'"):
        leaf_spine(2, 8, 2, uplink_rate="400Gbps", oversubscription=2)
    with pytest.raises(InputError, match="field 'gpus_per_host'"):
        leaf_spine(2, 12, 2, gpus_per_host=8)
    with pytest.raises(InputError, match="field 'nic_rate'"):
        leaf_spine(2, 8, 2, nic_rate="0Gbps")
    with pytest.raises(InputError, match="field 'leaves'"):
        leaf_spine("2", 8, 2)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="field 'latency'"):
        leaf_spine(2, 8, 2, latency="soon")


def test_rail_optimized_rails() -> None:
    hosts, gpus, spines = 16, 8, 8
    t = rail_optimized(hosts, gpus, spines, nic_rate="400Gbps", gpu="h100")
    assert kinds(t) == {"gpu": 128, "nvswitch": 16, "switch": gpus + spines}
    assert len(t.links) == 128 + 128 + gpus * spines
    for e in t.endpoints:
        leaf = [t.nodes[v] for v, _ in t.neighbours(e) if t.nodes[v].kind == "switch"]
        assert [n.name for n in leaf] == [f"rail{e % gpus}"]  # GPU i of every host on rail i
        assert leaf[0].tier == 1
    # non-blocking by default: each rail leaf has as much up as down
    assert leaf_oversubscription(t) == [1.0] * gpus
    up = {lk.bandwidth_bps for lk in t.links if t.nodes[lk.a].kind == t.nodes[lk.b].kind == "switch"}
    assert up == {hosts * 400 * G // spines}


def test_rail_optimized_groups() -> None:
    t = rail_optimized(8, 4, 2, hosts_per_leaf=4, nic_rate="100Gbps", oversubscription=2)
    leaves = [n for n in t.nodes if n.tier == 1]
    assert len(leaves) == 2 * 4  # two groups of four rails
    assert leaf_oversubscription(t) == [2.0] * 8
    gpu = t.endpoints[4 * 4 + 1]  # host 4 (second group), GPU 1
    assert [t.nodes[v].name for v, _ in t.neighbours(gpu) if t.nodes[v].kind == "switch"] == ["rail1.1"]


def test_dgx_host_and_nvlink_by_gpu_model() -> None:
    t = dgx_host(8, gpu="a100")
    assert kinds(t) == {"gpu": 8, "nvswitch": 1}
    assert {lk.bandwidth_bps for lk in t.links} == {2400 * G}  # A100: 300 GB/s per direction
    with pytest.raises(InputError, match="nvswitch"):
        leaf_spine(1, 8, 0, gpus_per_host=8, gpu="l40s")  # no NVLink on an L40S
    t2 = leaf_spine(1, 8, 0, gpus_per_host=8, gpu="l40s", nvswitch=False)
    assert kinds(t2)["nvswitch"] == 0


def test_generators_are_deterministic() -> None:
    a, b = rail_optimized(4, 8, 2), rail_optimized(4, 8, 2)
    assert a.nodes == b.nodes and a.links == b.links


def test_every_generator_records_the_hosts_cpu_and_refuses_an_unknown_one() -> None:
    """`cpu` (intel, amd or arm, any case) goes to meta["cpu"], where the NCCL model reads it; absent, nothing is
    recorded (Intel's figures); any other name is an error naming the field."""
    made = [
        fat_tree(4, cpu="AMD"),
        leaf_spine(1, 8, 0, cpu="AMD"),
        rail_optimized(2, 8, 2, cpu="AMD"),
        dgx_host(8, cpu="AMD"),
    ]
    assert [t.meta["cpu"] for t in made] == ["amd"] * 4
    assert "cpu" not in dgx_host(8).meta
    assert dgx_host(8, cpu="arm").meta["cpu"] == "arm"
    with pytest.raises(InputError, match="field 'cpu': expected one of intel, amd, arm, got 'epyc'"):
        rail_optimized(2, 8, 2, cpu="epyc")
    with pytest.raises(InputError, match="field 'cpu'"):
        dgx_host(8, cpu=1)  # type: ignore[arg-type]
