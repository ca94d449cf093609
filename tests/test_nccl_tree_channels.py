"""NCCL's channel-to-tree mapping (connect.cc, v2.18.1-1 to v2.30.7-1): `connectTrees` gives the search's channel c
tree 0 and its duplicate c + s tree 1, and `copyChannels(start, end)` makes channel k a copy of channel k - start.
Every expected value is worked out from those two rules (and, for the bytes, from enqueue.cc's split at v2.30.7-1)
in the test's docstring."""

from __future__ import annotations

from collections import defaultdict

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.channels import comm_channels, ring_graph
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.collectives.nccl.tree_channels import origins, tree_bytes, tree_of
from phantora.topology import rail_optimized

KiB = 1024


def h100_hosts(nodes: int, nics: int) -> Platform:
    """`nodes` hosts of 8 H100s on NVSwitch with `nics` 400G NICs each."""
    return Platform("hopper", 90, nodes * 8, nodes, 8, "nvlink", True, 360.0, 50.0, nics)


def test_tree_one_is_the_upper_half_of_the_duplicated_channels() -> None:
    """8 NICs of 50 GB/s: the search finds s = 8 channels of 48 GB/s (no duplication on sm90 under 50 GB/s with more
    than 4), the communicator 2 s = 16. Channel c < 8 runs tree 0 on search channel c, channel 8 + c its copy on
    tree 1: not tree c mod 2."""
    p, st = h100_hosts(8, 8), settings_from_env({})
    assert ring_graph(p).nchannels == 8 and comm_channels(p, ring_graph(p), st) == 16
    assert [tree_of(p, st, c) for c in range(16)] == [(0, c) for c in range(8)] + [(1, c) for c in range(8)]


def test_copies_repeat_the_channel_they_copy() -> None:
    """NCCL_MIN_CTAS=24: channels 16..23 copy 0..7 (start 16), so tree 0 has 16 channels and tree 1 8.
    NCCL_MAX_NCHANNELS=4 keeps channels 0..3, all tree 0; with NCCL_MIN_NCHANNELS=6 channels 4, 5 copy 0, 1 (start 4).
    6 NICs: s = 6 channels of 48 GB/s (12 of 24 carry no more), 2 s = 12 < 16 and 48 > 45 on sm90 across nodes, so
    doubled by copy (start 12): 0..5 tree 0, 6..11 tree 1, 12..23 the same again."""
    p = h100_hosts(8, 8)
    st = settings_from_env({"NCCL_MIN_CTAS": "24"})
    assert origins(p, st) == (*range(16), *range(8))
    assert [tree_of(p, st, c)[0] for c in range(24)] == [0] * 8 + [1] * 8 + [0] * 8
    assert origins(p, settings_from_env({"NCCL_MAX_NCHANNELS": "4"})) == (0, 1, 2, 3)
    st = settings_from_env({"NCCL_MAX_NCHANNELS": "4", "NCCL_MIN_NCHANNELS": "6"})
    assert [tree_of(p, st, c) for c in range(6)] == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 0), (0, 1)]
    p6, st = h100_hosts(8, 6), settings_from_env({})
    assert ring_graph(p6).nchannels == 6
    assert origins(p6, st) == (*range(12), *range(12))
    assert [tree_of(p6, st, c) for c in range(24)] == ([(0, c) for c in range(6)] + [(1, c) for c in range(6)]) * 2
    for env in ({}, {"NCCL_MIN_CTAS": "24"}, {"NCCL_MAX_NCHANNELS": "4", "NCCL_MIN_NCHANNELS": "6"}):
        s = settings_from_env(env)
        for q in (p, p6):
            assert len(origins(q, s)) == comm_channels(q, ring_graph(q), s)


def test_a_tree_all_reduces_bytes_per_channel_and_per_tree() -> None:
    """2 MiB Tree/Simple all-reduce on 8 hosts of 8 H100s under NCCL_MIN_CTAS=24 (NCCL 2.30): traffic 4 MiB, budget
    ceil16(4,194,304 // 24) = 174,768, cells of 16 KiB (32 KiB of traffic), 128 of them; lo = mid =
    ceil(174,768 / 32,768) = 6 cells, 20 mids, hi 2: channels 0..20 carry 96 KiB, channel 21 32 KiB, 22 and 23
    nothing. Tree 0 runs channels 0..7 and 16..21: 13 x 96 + 32 = 1,280 KiB; tree 1 channels 8..15: 768 KiB (tree
    c mod 2 would give 1,056 and 992). Each channel's tree crosses hosts at the GPUs of its search channel's local
    index, c mod 8."""
    topo = rail_optimized(8, 8, gpu="h100")
    env = nccl_env({"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple", "NCCL_MIN_CTAS": "24"})
    dag = decompose(Collective("all_reduce", tuple(range(64)), 2 << 20, "fp32"), topo, AlgoOptions(nccl_env=env))
    assert dag.choice is not None and (dag.choice["algorithm"], dag.choice["channels"]) == ("Tree", 24)
    sizes: dict[int, set[int]] = defaultdict(set)
    trees: dict[int, set[str]] = defaultdict(set)
    locals_: dict[int, set[int]] = defaultdict(set)
    for f in dag.flows:
        tree, ch = f.tag.split("/")[:2]
        c = int(ch.removeprefix("ch"))
        sizes[c].add(f.size)
        trees[c].add(tree)
        if topo.nodes[f.src].host != topo.nodes[f.dst].host:
            locals_[c] |= {f.src % 8, f.dst % 8}
    assert sorted(sizes) == list(range(22))
    assert all(sizes[c] == {96 * KiB} for c in range(21)) and sizes[21] == {32 * KiB}
    assert {c: trees[c] for c in sizes} == {c: {"tree1" if 8 <= c < 16 else "tree0"} for c in range(22)}
    assert {c: locals_[c] for c in sizes} == {c: {c % 8} for c in range(22)}
    per_tree = [sum(min(sizes[c]) for c in sizes if trees[c] == {f"tree{t}"}) for t in (0, 1)]
    assert per_tree == [1280 * KiB, 768 * KiB]
    p = h100_hosts(8, 8)
    assert tree_bytes(p, settings_from_env({"NCCL_MIN_CTAS": "24"}), [96 * KiB] * 21 + [32 * KiB]) == (
        1280 * KiB,
        768 * KiB,
    )


def test_a_collective_on_fewer_channels_than_the_search_runs_tree_0_alone() -> None:
    """NCCL_MAX_NCHANNELS=4 on 2 hosts of 8 H100s: a 1 MiB Tree/Simple all-reduce runs channels 0..3, copies of
    nothing, all on tree 0: traffic 2 MiB, budget 524,288, 64 cells of 16 KiB, lo = mid = ceil(524,288 / 32,768) =
    16 cells, so 4 parts of 256 KiB. Its flows cross hosts only at local GPUs 0..3 (tree c mod 2 ran 2 on each
    tree, crossing at GPUs 0 and 1)."""
    topo = rail_optimized(2, 8, gpu="h100")
    env = nccl_env({"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": "4"})
    dag = decompose(Collective("all_reduce", tuple(range(16)), 1 << 20, "fp32"), topo, AlgoOptions(nccl_env=env))
    assert {f.tag.split("/")[0] for f in dag.flows} == {"tree0"}
    assert {f.size for f in dag.flows} == {256 * KiB}
    cross = {f.src % 8 for f in dag.flows if topo.nodes[f.src].host != topo.nodes[f.dst].host}
    assert cross == {0, 1, 2, 3}
