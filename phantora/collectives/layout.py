"""Who talks to whom: host blocks, per-channel ring orders, chains, and the double binary tree.

Everything here works on group positions 0..n-1 (indices into `Collective.ranks`).
"""

from __future__ import annotations

from phantora.topology.model import Topology


def host_blocks(topo: Topology, nodes: list[int]) -> list[list[int]]:
    """Positions grouped by host, hosts in order of first appearance; an endpoint without a host is its own block."""
    blocks: dict[object, list[int]] = {}
    for pos, node in enumerate(nodes):
        host = topo.nodes[node].host
        blocks.setdefault(("h", host) if host is not None else ("n", node), []).append(pos)
    return list(blocks.values())


def uniform_size(blocks: list[list[int]]) -> int:
    """Ranks per host if every block has the same size, else 0."""
    sizes = {len(b) for b in blocks}
    return sizes.pop() if len(sizes) == 1 else 0


def multi_host(blocks: list[list[int]]) -> int:
    """Ranks per host if the group spans several hosts with the same number (>= 2) of ranks on each, else 0."""
    m = uniform_size(blocks)
    return m if len(blocks) > 1 and m >= 2 else 0


def rotate(seq: list[int], k: int) -> list[int]:
    k %= len(seq)
    return seq[k:] + seq[:k]


def fabric_switch(topo: Topology, node: int) -> int | None:
    """The switch an endpoint's NIC attaches to (its first non-NVSwitch switch), or None."""
    for v, _ in topo.neighbours(node):
        if topo.nodes[v].kind == "switch":
            return v
    return None


def rail_aligned(topo: Topology, nodes: list[int], blocks: list[list[int]]) -> bool:
    """Whether a multi-host group sits on a rail-optimised fabric: the rank at local index i of every host
    reaches the fabric through one switch (rail i), and different local indices through different switches."""
    m = multi_host(blocks)
    if not m:
        return False
    rails = [{fabric_switch(topo, nodes[b[i]]) for b in blocks} for i in range(m)]
    if any(len(r) != 1 or None in r for r in rails):
        return False
    return len(set().union(*rails)) == m


def ring_order(blocks: list[list[int]], channel: int, alternate: bool = False) -> list[int]:
    """The ring of one channel: hosts one after another, each host's ranks contiguous.

    On a multi-host group with m ranks per host, channel c rotates every host's local order by
    c mod m, so the ring leaves each host from a different GPU (and its NIC) on each of m
    consecutive channels, as NCCL's rings do. Otherwise the ring is the host-contiguous group order.

    `alternate` (rail-optimised fabrics, `rail_aligned`): every other host runs its local order backwards,
    so the ring enters a host at the local index it left the previous one from, and each host-to-host hop
    joins two NICs of one rail (NCCL's alternating rings, 2.20: rings without cross-rail traffic). With an odd
    number of hosts the hop from the last host back to the first still crosses rails. (The NCCL model on NVSwitch
    hosts with a NIC per GPU runs NCCL's search's rings instead: nccl/nvswitch_rings.py.)
    """
    m = multi_host(blocks)
    if not m:
        return [p for b in blocks for p in b]
    if not alternate:
        return [p for b in blocks for p in rotate(b, channel % m)]
    out: list[int] = []
    for h, b in enumerate(blocks):
        local = rotate(b, channel % m)
        out += local if h % 2 == 0 else local[::-1]
    return out


def chain_order(blocks: list[list[int]], channel: int, root: int, alternate: bool = False) -> list[int]:
    """The channel's ring, opened at the root: root first, then its successors."""
    ring = ring_order(blocks, channel, alternate)
    return rotate(ring, ring.index(root))


def _btree_parent(rank: int, n: int) -> int | None:
    """Parent of `rank` in NCCL's binary tree over ranks 0..n-1 (graph/trees.cc `ncclGetBtree`, v2.29.7-1).

    Rank 0 is the root, with one child (the largest power of two below n). Rank r > 0 with lowest set bit b goes
    up to r with bit b cleared and bit 2b set, or, when that is out of range, to r with bit b cleared.
    """
    if rank == 0:
        return None
    bit = rank & -rank
    up = (rank ^ bit) | (bit << 1)
    return up if up < n else rank ^ bit


def dbt_parents(n: int, which: int) -> list[int | None]:
    """Parent of each of n units in tree `which` (0 or 1) of NCCL's double binary tree; the root's parent is None.

    graph/trees.cc `ncclGetDtree` (v2.29.7-1): tree 0 is `ncclGetBtree` (root unit 0, the odd units its leaves);
    tree 1 is tree 0 mirrored (u -> n-1-u) when n is even and shifted (u -> u+1 mod n) when n is odd.
    connect.cc `connectTrees` runs tree 0 on the search's channels and tree 1 on their copies
    (`nccl/tree_channels.py`).
    """
    tree0 = [_btree_parent(u, n) for u in range(n)]
    if which == 0:
        return tree0
    if n % 2 == 0:

        def phi(u: int) -> int:
            return n - 1 - u
    else:

        def phi(u: int) -> int:
            return (u + 1) % n

    # Unit phi(u) of tree 1 sits where u sits in tree 0.
    tree1: list[int | None] = [None] * n
    for u, p in enumerate(tree0):
        tree1[phi(u)] = None if p is None else phi(p)
    return tree1


def tree_parents(blocks: list[list[int]], which: int, rotation: int) -> list[int | None]:
    """Parent position of each position in one NCCL-like tree: a chain inside each host, a binary tree between hosts.

    Each host's ranks form a chain (rotated by `rotation`) whose head is the host's tree node;
    tree `which` of the double binary tree links the heads. Without host structure every rank
    is its own host, and this is the plain double binary tree over the group.
    """
    n = sum(len(b) for b in blocks)
    parent: list[int | None] = [None] * n
    chains = [rotate(b, rotation) for b in blocks]
    units = dbt_parents(len(chains), which)
    for u, chain in enumerate(chains):
        for a, b in zip(chain, chain[1:], strict=False):
            parent[b] = a
        pu = units[u]
        parent[chain[0]] = None if pu is None else chains[pu][0]
    return parent


def children_of(parent: list[int | None]) -> list[list[int]]:
    """Children lists from a parent array, each sorted."""
    kids: list[list[int]] = [[] for _ in parent]
    for v, p in enumerate(parent):
        if p is not None:
            kids[p].append(v)
    return kids


def topo_order(parent: list[int | None]) -> list[int]:
    """Positions ordered root first, each before its children (breadth first)."""
    kids = children_of(parent)
    order = [v for v, p in enumerate(parent) if p is None]
    i = 0
    while i < len(order):
        order.extend(kids[order[i]])
        i += 1
    return order
