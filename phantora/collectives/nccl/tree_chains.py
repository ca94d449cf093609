"""NCCL's tree through a node: the chain of its GPUs each channel runs, and which of them the tree between nodes
attaches to (NVIDIA/nccl v2.19.4-1 to v2.30.7-1; graph/connect.cc, graph/search.cc, graph/trees.cc).

connect.cc `ncclTopoPreset` chains a node's GPUs in the order of the tree graph's channel (`treeIntra`: each GPU's
`tree.up` the one before it, `tree.down[0]` the one after) and names three of them for the tree between nodes: the
GPU that talks to the parent node (`treeToParent`, treeIntra[0]) and those that talk to the child nodes of child
type 0 and 1 (`treeToChild0` / `treeToChild1`). Which, the tree graph's pattern decides:

| pattern        | parent | child type 0 | child type 1 |
| TREE           | 0      | 0            | 0            |
| BALANCED_TREE  | 0      | 1            | 0            |
| SPLIT_TREE     | 0      | 1            | 1            |

`connectTrees` then links a node's `treeToParent` GPU to its parent node's `treeToChild0` or `treeToChild1` GPU
by the node's child type in ncclGetDtree (trees.cc `parentChildType`: 0 when the node is below its parent in the
binary tree's own numbering, the mirrored or shifted one for tree 1). Up and down go over the same connection: a
GPU's `tree.up` both receives the broadcast and takes its reduce.

init.cc searches the tree graph as BALANCED_TREE; on sm90 and up `ncclTopoCompute` tries TREE only when that
search finds no perfect graph. On the DGX-like host phantora models NCCL's search on (NVSwitch, P2P on, a NIC per
GPU, two GPUs and their NICs per PCIe switch: `nvswitch_rings.py`), BALANCED_TREE finds every channel: found channel
g starts at NIC g mod m (`ncclTopoSearchRecNet`) and its first GPU; `ncclTopoSearchRecGpu` goes back to that NIC from
the first GPU and (BALANCED_TREE: `nextBackToNet` = 1) from the second, which `ncclTopoSearchCheckNet` holds to the
same NIC, within the search's first typeInter (PIX: the NIC's PCIe switch). With an NVSwitch,
`ncclTopoSearchNextGpuSort` offers a GPU's previous GPU, then its next (BALANCED_TREE and SPLIT_TREE), so the second
GPU is the first GPU's switch-mate, and the chain goes on in that direction (the way back is used). Where the first
GPU is the NIC's:
- from v2.28 (`nvswitch_rings.LOCAL_GPU_FROM`: the previous channel is replayed only with sameChannels 1) found
  channel g runs from GPU g: g, g + 1, g + 2, ... for an even g, g, g - 1, g - 2, ... for an odd one;
- before, a channel first replays the channel before it from its NIC (FORCED_ORDER_REPLAY, with sameChannels 0
  too), which holds on the NIC's switch: found channels 2k and 2k + 1 both run 2k, 2k + 1, ..., and 2k + 1 crosses
  by NIC 2k + 1 (its first GPU's switch-mate).
Each GPU of a channel crosses by the channel's one NIC (search.cc `ncclTopoGetNetDev`: treeIntra[0] by inter[0],
the others by inter[1], the same NIC here): a GPU that is not the NIC's reaches it over its PCIe switch (GPU
Direct RDMA, no NVLink hop), which phantora does not simulate: its flows between nodes leave from and arrive at
the NIC's GPU (as `nvswitch_rings.py` does for rings).
"""

from __future__ import annotations

from collections.abc import Sequence

from phantora.collectives.layout import dbt_parents
from phantora.collectives.nccl.nvswitch_rings import LOCAL_GPU_FROM

TREE, BALANCED_TREE, SPLIT_TREE = "tree", "balanced_tree", "split_tree"


def attach(pattern: str) -> tuple[int, int, int]:
    """(parent, child type 0, child type 1): the chain indices of the GPUs a node's tree between nodes attaches to
    under the tree graph's `pattern` (connect.cc `ncclTopoPreset`)."""
    if pattern not in (TREE, BALANCED_TREE, SPLIT_TREE):
        raise ValueError(f"tree_chains: unknown tree pattern {pattern!r} (tree, balanced_tree or split_tree)")
    return 0, 0 if pattern == TREE else 1, 1 if pattern == SPLIT_TREE else 0


def child_types(n: int, which: int) -> list[int | None]:
    """Each of n units' child type in tree `which` of the double binary tree (None: the root): 0 when it is below
    its parent in the numbering of the binary tree the tree is made from (tree 1: units mirrored, n-1-u, for an even
    n, shifted, u-1 mod n, for an odd one), else 1 (trees.cc `ncclGetBtree` / `ncclGetDtree`)."""
    parent = dbt_parents(n, which)
    if which == 0:
        own = list(range(n))
    elif n % 2 == 0:
        own = [n - 1 - u for u in range(n)]
    else:
        own = [(u - 1) % n for u in range(n)]
    return [None if p is None else int(own[u] > own[p]) for u, p in enumerate(parent)]


def chained_tree(chains: Sequence[Sequence[int]], which: int, pattern: str = TREE) -> list[int | None]:
    """Parent position of every position: each node's positions chained in `chains[u]` order (treeIntra), and tree
    `which` of the double binary tree over the nodes attached by `pattern` (`attach`): a node's parent-side GPU goes
    up to its parent node's GPU of the node's child type."""
    n = sum(len(c) for c in chains)
    parent: list[int | None] = [None] * n
    units = dbt_parents(len(chains), which)
    types = child_types(len(chains), which)
    up_at, *down_at = attach(pattern)
    for u, chain in enumerate(chains):
        for a, b in zip(chain, chain[1:], strict=False):
            parent[b] = a
        pu, kind = units[u], types[u]
        if pu is not None and kind is not None:
            above = chains[pu]
            parent[chain[min(up_at, len(chain) - 1)]] = above[min(down_at[kind], len(above) - 1)]
    return parent


def host_chain(switch: Sequence[int], found: int, version: tuple[int, int]) -> tuple[tuple[int, ...], int]:
    """Found channel `found`'s BALANCED_TREE chain through a DGX-like host of GPUs 0..m-1 by index (`switch[i]`: GPU
    i's PCIe switch, every GPU with a switch-mate next to it) and the GPU whose NIC it crosses by, under NCCL
    `version` (the module's rules)."""
    m = len(switch)
    nic = found % m
    first = nic
    if version < LOCAL_GPU_FROM and found % m and switch[(nic - 1) % m] == switch[nic]:
        first = (nic - 1) % m  # the channel before's first GPU, replayed from this NIC on its switch
    step = -1 if switch[(first - 1) % m] == switch[first] else 1
    return tuple((first + step * k) % m for k in range(m)), nic


def applies(switch: Sequence[int]) -> bool:
    """Whether every GPU of the host has its switch-mate next to it (the BALANCED_TREE search's second GPU)."""
    m = len(switch)
    return m >= 2 and all(switch[(i - 1) % m] == switch[i] or switch[(i + 1) % m] == switch[i] for i in range(m))
