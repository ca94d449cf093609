"""NCCL's tree through a node and where the tree between nodes attaches to it (nccl/tree_chains.py).

The expected trees are restated here from NCCL's source (v2.29.7-1), not from phantora's code:
- connect.cc `ncclTopoPreset`: a node's GPUs are chained in treeIntra order (each GPU's up the one before); the GPU
  that talks to the parent node is treeIntra[0]; the one that talks to a child node of child type 0 is treeIntra[1]
  unless the pattern is TREE, the one for child type 1 is treeIntra[1] only under SPLIT_TREE.
  `connectTrees`: a node's treeToParent GPU goes up to its parent node's treeToChild{its child type} GPU.
- trees.cc `ncclGetBtree`: child type 0 when the rank is below its parent (`rank < up`), in the numbering of the
  binary tree the tree is made from (tree 1: ncclGetDtree calls ncclGetBtree on n-1-rank for an even n, on
  rank-1 mod n for an odd one).
- search.cc, BALANCED_TREE on a DGX-like host (NVSwitch, a NIC per GPU, GPUs 2k and 2k+1 on one PCIe switch with
  their NICs): found channel g starts at NIC g's GPU g; its second GPU must reach NIC g within PIX (its switch-mate;
  `ncclTopoSearchNextGpuSort` offers the previous GPU first, then the next), and the chain goes on that way: from
  v2.28, g, g+1, g+2, ... for an even g and g, g-1, g-2, ... for an odd one.
And the maintainers' account of the balanced tree (NVIDIA/nccl issue 548, 2021): "instead of having the same GPU
send to 2 nodes, the two GPUs close to the NIC send to one node each".
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.nccl import tree_chains
from phantora.collectives.nccl.settings import nccl_env
from phantora.topology import rail_optimized

MiB = 1 << 20
GPUS = 8
INDEX = {"tree": (0, 0), "balanced_tree": (1, 0), "split_tree": (1, 1)}  # treeIntra index of child type 0, 1


def btree(n: int, r: int) -> tuple[int | None, int]:
    """(parent, child type) of rank r in ncclGetBtree over n ranks, restated (root 0: (None, 0))."""
    if r == 0:
        return None, 0
    b = r & -r
    up = (r ^ b) | (b << 1)
    if up >= n:
        up = r ^ b
    return up, 0 if r < up else 1


def dtree(n: int, which: int) -> list[tuple[int | None, int]]:
    """(parent, child type) of every unit in tree `which` of ncclGetDtree, restated."""
    if which == 0:
        return [btree(n, u) for u in range(n)]
    to, back = (
        ((lambda u: n - 1 - u), (lambda r: n - 1 - r))
        if n % 2 == 0
        else ((lambda u: (u - 1) % n), (lambda r: (r + 1) % n))
    )
    out: list[tuple[int | None, int]] = []
    for u in range(n):
        p, kind = btree(n, to(u))
        out.append((None if p is None else back(p), kind))
    return out


def expected_tree(chains: list[list[int]], which: int, pattern: str) -> list[int | None]:
    """ncclTopoPreset + connectTrees: every position's up."""
    parent: list[int | None] = [None] * sum(len(c) for c in chains)
    for u, (pu, kind) in enumerate(dtree(len(chains), which)):
        chain = chains[u]
        for i in range(1, len(chain)):
            parent[chain[i]] = chain[i - 1]
        if pu is not None:
            parent[chain[0]] = chains[pu][INDEX[pattern][kind]]
    return parent


@pytest.mark.parametrize("pattern", ["tree", "balanced_tree", "split_tree"])
@pytest.mark.parametrize("n", range(1, 33))
def test_chained_tree_attaches_as_connect_cc(n: int, pattern: str) -> None:
    chains = [[3 * u, 3 * u + 1, 3 * u + 2] for u in range(n)]
    for which in (0, 1):
        assert tree_chains.chained_tree(chains, which, pattern) == expected_tree(chains, which, pattern)


def test_the_balanced_tree_sends_down_to_one_node_a_gpu() -> None:
    """Under BALANCED_TREE no GPU sends its broadcast to two other nodes (issue 548); under TREE the inner nodes'
    first GPU does."""
    for n in range(4, 33):
        chains = [[2 * u, 2 * u + 1] for u in range(n)]
        for which in (0, 1):
            node = [u for u, c in enumerate(chains) for _ in c]
            for pattern, most in (("balanced_tree", 1), ("tree", 2)):
                parent = tree_chains.chained_tree(chains, which, pattern)
                down: dict[int, int] = defaultdict(int)
                for v, p in enumerate(parent):
                    if p is not None and node[p] != node[v]:
                        down[p] += 1
                assert max(down.values()) == most, (n, which, pattern)


def search_chain(g: int) -> list[int]:
    """BALANCED_TREE's found channel g through a DGX-like host of 8 GPUs from v2.28 (the module's rule, restated)."""
    step = 1 if g % 2 == 0 else -1
    return [(g + step * k) % GPUS for k in range(GPUS)]


@pytest.mark.parametrize("hosts", [2, 3, 5])
def test_a_tree_all_reduce_runs_ncclss_chains_and_attaches_edge_for_edge(hosts: int) -> None:
    """A 4 MiB Tree/Simple all-reduce, chunked, on `hosts` hosts of 8 H100s with a 400G NIC per GPU (rail-optimised):
    in every channel each host's GPUs are chained as the search finds them (inside a host every up flow goes from a
    GPU to the one before it in the chain), every flow between hosts leaves and arrives by NIC g's GPU, and the step
    that comes in from a child node is taken on by the GPU `connectTrees` gives it (treeIntra[1] for child type 0,
    treeIntra[0] for type 1): the GPU whose next flows inside the host depend on its arrival."""
    topo = rail_optimized(hosts, GPUS, gpu="h100")
    env = nccl_env({"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"})
    coll = Collective("all_reduce", tuple(range(GPUS * hosts)), 4 * MiB, "fp32")
    dag = decompose(coll, topo, AlgoOptions(nccl_env=env, granularity="chunked"))
    pos = {n: i for i, n in enumerate(topo.endpoints)}
    host = {r: r // GPUS for r in range(GPUS * hosts)}
    data = [f for f in dag.flows if not is_credit(f) and f.src != f.dst]
    by_channel: dict[int, list] = defaultdict(list)
    for f in data:
        by_channel[int(f.tag.split("/")[1].removeprefix("ch"))].append(f)
    consumers: dict[int, set[int]] = defaultdict(set)  # flow -> GPUs whose data flows inside their host wait for it
    for f in data:
        for d in f.deps:
            consumers[d].add(pos[f.src])
    assert sorted(by_channel) == list(range(16))
    for c, flows in by_channel.items():
        which, g = int(c >= GPUS), c % GPUS  # 8 search channels, then their copies (test_nccl_tree_channels)
        chains = [[h * GPUS + k for k in search_chain(g)] for h in range(hosts)]
        parent = expected_tree(chains, which, "balanced_tree")
        links = dtree(hosts, which)
        up_inside = {(pos[f.src], pos[f.dst]) for f in flows if "/up" in f.tag and host[pos[f.src]] == host[pos[f.dst]]}
        assert up_inside == {(v, u) for v, u in enumerate(parent) if u is not None and host[u] == host[v]}
        for f in flows:
            s, d = pos[f.src], pos[f.dst]
            if host[s] == host[d]:
                continue
            assert (s % GPUS, d % GPUS) == (g % GPUS, g % GPUS)  # NIC g's GPU at both ends
            if "/up" in f.tag:
                child, above = host[s], host[d]
                assert links[child][0] == above
                taker = chains[above][INDEX["balanced_tree"][links[child][1]]]
                inside = {v for v in consumers[f.id] if host[v] == above}
                assert inside == {taker}, (c, child, above)


@pytest.mark.parametrize("version", [(2, 27), (2, 28), (2, 30)])
def test_host_chain_follows_the_search_of_the_version(version: tuple[int, int]) -> None:
    """Found channel g on a DGX-like host of 8 GPUs (switches {0, 1}, {2, 3}, ...), NIC g mod 8: from 2.28 the chain
    starts at NIC g's GPU (`search_chain`); before, a channel first replays the channel before it from its NIC, which
    holds on the NIC's switch, so channels 2k and 2k + 1 both run 2k, 2k + 1, ... (search.cc v2.27.3-1
    `ncclTopoSearchRecNet`: the replay with sameChannels 0 too)."""
    switch = [k // 2 for k in range(GPUS)]
    for g in range(2 * GPUS):
        order, nic = tree_chains.host_chain(switch, g, version)
        assert nic == g % GPUS
        if version >= (2, 28):
            assert list(order) == search_chain(g % GPUS)
        else:
            start = g % GPUS - g % 2
            assert list(order) == [(start + k) % GPUS for k in range(GPUS)]
