"""Which found search channel's chain each communicator channel runs (tree_channels.chain_of), as rings and trees:
search.cc `ncclTopoDupChannels` (v2.18.3-1 to v2.30.7-1: found channel g + f copied from g when the found channels
carry 25 GB/s or more, not on sm > 80 under 50 GB/s with more than 4), then connect.cc's doubling (channel c + s
copies c, rings and trees alike) and `copyChannels(start, end)` (channel k copies k - start). Expected values are
worked out from those rules in each docstring; the flows' NICs from NCCL's ring search: found channel g enters
and leaves every host by NIC g mod 8, its GPU's (nccl/nvswitch_rings.py), so it crosses hosts on rail g mod 8."""

from __future__ import annotations

from collections import defaultdict

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import proxy
from phantora.collectives.nccl.channels import comm_channels, found_channels, ring_graph
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.collectives.nccl.tree_channels import chain_of, tree_counts, tree_of
from phantora.topology import rail_optimized

MiB = 1 << 20


def hosts(arch: str, cc: int, nodes: int, ppn: int, nics: int, nic_gbs: float) -> Platform:
    """`nodes` NVSwitch hosts of `ppn` GPUs with `nics` NICs of `nic_gbs` GB/s each."""
    return Platform(arch, cc, nodes * ppn, nodes, ppn, "nvlink", True, 360.0, nic_gbs, nics)


def test_four_found_channels_are_duplicated_and_their_copies_run_the_same_chains() -> None:
    """8 H100s with 4 NICs of 50 GB/s: the search finds f = 4 channels of 48 GB/s; 4 is not more than 4, so
    ncclTopoDupChannels doubles them to 8 of 24 (channels 4-7 copies of 0-3); connect.cc doubles to 16 (24 < 45:
    no H100 copy). Channel c runs found chain (c mod 8) mod 4 = c mod 4, tree 0 for c < 8: not its own c mod 8."""
    p, st = hosts("hopper", 90, 2, 8, 4, 50.0), settings_from_env({})
    assert found_channels(p) == 4 and ring_graph(p).nchannels == 8 and ring_graph(p).bw_intra == 24.0
    assert comm_channels(p, ring_graph(p), st) == 16
    assert [chain_of(p, st, c) for c in range(16)] == [c % 4 for c in range(16)]
    assert [tree_of(p, st, c) for c in range(16)] == [(c // 8, c % 4) for c in range(16)]


def test_eight_nics_find_eight_chains_at_16_24_and_32_channels() -> None:
    """8 H100s with 8 NICs of 50 GB/s: f = 8 channels of 48 GB/s, not duplicated (sm90, under 50, more than 4);
    16 channels, NCCL_MIN_CTAS=24 copies 0-7 to 16-23, NCCL_MIN_NCHANNELS=32 copies 0-15 to 16-31: chain c mod 8.
    A100 with 400G NICs: f = 8 of 48 GB/s doubled (sm80 from 25 GB/s) to 16 of 24, 32 channels: chain c mod 8."""
    p = hosts("hopper", 90, 8, 8, 8, 50.0)
    assert found_channels(p) == ring_graph(p).nchannels == 8
    for env, n in (({}, 16), ({"NCCL_MIN_CTAS": "24"}, 24), ({"NCCL_MIN_NCHANNELS": "32"}, 32)):
        st = settings_from_env(env)
        assert comm_channels(p, ring_graph(p), st) == n
        assert [chain_of(p, st, c) for c in range(n)] == [c % 8 for c in range(n)]
    a100, st = hosts("ampere", 80, 8, 8, 8, 50.0), settings_from_env({})
    assert (found_channels(a100), ring_graph(a100).nchannels, comm_channels(a100, ring_graph(a100), st)) == (8, 16, 32)
    assert [chain_of(a100, st, c) for c in range(32)] == [c % 8 for c in range(32)]


def _rail_bytes(env: dict[str, str]) -> tuple[dict[int, set[int]], dict[int, int], int]:
    """A 96 MiB Ring/Simple all-gather on 8 hosts of 8 H100s: each channel's rails between hosts, bytes per rail
    (summed over senders), and the channels."""
    topo = rail_optimized(8, 8, gpu="h100")
    opts = AlgoOptions(nccl_env=nccl_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", **env}))
    dag = decompose(Collective("all_gather", tuple(range(64)), 96 * MiB, "fp32"), topo, opts)
    rails: dict[int, set[int]] = defaultdict(set)
    per_rail: dict[int, int] = defaultdict(int)
    for f in dag.flows:
        if topo.nodes[f.src].host != topo.nodes[f.dst].host:
            assert f.src % 8 == f.dst % 8  # NCCL's rings leave and enter hosts by one NIC index
            rails[int(f.tag.split("/")[1].removeprefix("ch"))].add(f.src % 8)
            per_rail[f.src % 8] += f.size
    assert dag.choice is not None
    return rails, per_rail, dag.choice["channels"]


def test_a_ring_cut_by_max_and_copied_by_min_runs_the_chains_it_copies() -> None:
    """NCCL_MAX_NCHANNELS=12 NCCL_MIN_NCHANNELS=24: channels 0-11 (chains 0-7, 0-3), then 12-23 copy 0-11. A ring on
    chain r enters and leaves every host by NIC r (NCCL's search: nccl/nvswitch_rings.py), so it crosses on rail r
    alone, 8 crossings each of 63/64 x 96 MiB / 24 = 4,128,768 bytes. Rail k: (chain k among the 24) x 8 x
    4,128,768: rails 0-3 4 chains (132,120,576), 4-7 2 (66,060,288). Channel c's own rotation (c mod 8) would give
    every rail 3. Default 16 channels: every rail 2 x 8 x 63/64 x 96 MiB / 16."""
    rails, per_rail, n = _rail_bytes({"NCCL_MAX_NCHANNELS": "12", "NCCL_MIN_NCHANNELS": "24"})
    chains = [*range(8), *range(4)] * 2
    assert n == 24 and {c: rails[c] for c in range(24)} == {c: {chains[c]} for c in range(24)}
    crossing = 63 * 96 * MiB // 64 // 24
    expect = {k: 8 * crossing * chains.count(k) for k in range(8)}
    assert per_rail == expect and expect[0] == 132_120_576 and expect[4] == 66_060_288
    rails, per_rail, n = _rail_bytes({})
    assert n == 16 and {c: rails[c] for c in range(16)} == {c: {c % 8} for c in range(16)}
    assert per_rail == {k: 16 * 63 * 96 * MiB // 64 // 16 for k in range(8)}


def test_a_tree_cut_by_max_and_copied_by_min_crosses_hosts_at_its_chains_head() -> None:
    """The same cut on a 24 MiB Tree/Simple all-reduce: tree 0 on channels 0-7 and their copies 12-19, tree 1 on
    8-11 and 20-23 (16 and 8), each crossing hosts only at the GPU of its chain's head, chain 0-7, 0-3, 0-7, 0-3.
    The proxy counts the same trees: on 8 hosts the busiest GPU serves 2 x (16 x 3 + 8 x 1) / 8 = 14."""
    topo = rail_optimized(8, 8, gpu="h100")
    cut = {"NCCL_MAX_NCHANNELS": "12", "NCCL_MIN_NCHANNELS": "24"}
    opts = AlgoOptions(nccl_env=nccl_env({"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple", **cut}))
    dag = decompose(Collective("all_reduce", tuple(range(64)), 24 * MiB, "fp32"), topo, opts)
    heads: dict[int, set[int]] = defaultdict(set)
    trees: dict[int, set[str]] = defaultdict(set)
    for f in dag.flows:
        tree, ch = f.tag.split("/")[:2]
        c = int(ch.removeprefix("ch"))
        trees[c].add(tree)
        if topo.nodes[f.src].host != topo.nodes[f.dst].host:
            heads[c] |= {f.src % 8, f.dst % 8}
    chains = [*range(8), *range(4)] * 2
    assert sorted(heads) == list(range(24)) and {c: heads[c] for c in heads} == {c: {chains[c]} for c in range(24)}
    assert {c: trees[c] for c in heads} == {c: {"tree1" if c % 12 >= 8 else "tree0"} for c in range(24)}
    p, st = hosts("hopper", 90, 8, 8, 8, 50.0), settings_from_env(cut)
    assert tree_counts(p, st, 24) == (16, 8)
    assert proxy.connections_per_gpu("tree", p, st, 24) == 14
