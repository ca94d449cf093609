"""phantora's double binary tree is NCCL's (graph/trees.cc `ncclGetBtree` / `ncclGetDtree`, v2.29.7-1), and each
channel runs the tree `connectTrees` (connect.cc) gives it: tree 0 on the search's s channels, tree 1 on their
copies c + s.

The expected trees come from a restatement of trees.cc's rules written here, in closed form, not phantora's code:
tree 0 has root 0 with the one child 2^(bitlen(n-1)-1) (the largest power of two below n); a rank r > 0 with lowest
set bit b has parent r + b when r = b mod 4b and r + b < n ("xx01[0] -> xx10[0]"), else r - b ("xx11[0] ->
xx10[0]", or "xx00[0]" when xx10[0] is out of bounds); children r - b/2 and the first of r + b/2, r + b/4, ... below
n (none when b = 1). Tree 1 is tree 0 mirrored (r -> n-1-r) for an even n and shifted (r -> r+1 mod n) for an odd
one. The figures of trees.cc's comments (14 ranks; 12 mirrored; 13 shifted) are checked as published.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.layout import children_of, dbt_parents
from phantora.collectives.nccl.settings import nccl_env
from phantora.topology import rail_optimized

MiB = 1 << 20


def nccl_btree(n: int) -> tuple[list[int | None], list[set[int]]]:
    """Parent and children of every rank in NCCL's binary tree (tree 0), from the closed form above."""
    parent: list[int | None] = [None] * n
    kids: list[set[int]] = [set() for _ in range(n)]
    if n > 1:
        kids[0] = {1 << ((n - 1).bit_length() - 1)}
    for r in range(1, n):
        b = r & -r
        parent[r] = r + b if r % (4 * b) == b and r + b < n else r - b
        half = b // 2
        if half:
            kids[r].add(r - half)
            while half and r + half >= n:
                half //= 2
            if half:
                kids[r].add(r + half)
    return parent, kids


def nccl_dtree(n: int, which: int) -> tuple[list[int | None], list[set[int]]]:
    """Tree `which` of NCCL's double binary tree: tree 0, or tree 0 mirrored (even n) or shifted (odd n)."""
    parent, kids = nccl_btree(n)
    if which == 0:
        return parent, kids
    phi = (lambda r: (r + 1) % n) if n % 2 else (lambda r: n - 1 - r)
    p1: list[int | None] = [None] * n
    k1: list[set[int]] = [set() for _ in range(n)]
    for r in range(n):
        p = parent[r]
        p1[phi(r)] = None if p is None else phi(p)
        k1[phi(r)] = {phi(k) for k in kids[r]}
    return p1, k1


def edges(tree: dict[int, tuple[int, ...]]) -> dict[int, set[int]]:
    return {p: set(ks) for p, ks in tree.items()}


# trees.cc's illustrations: parent -> children, every rank not listed a leaf
FIG_14 = {0: (8,), 8: (4, 12), 4: (2, 6), 12: (10, 13), 2: (1, 3), 6: (5, 7), 10: (9, 11)}
FIG_12 = ({0: (8,), 8: (4, 10), 4: (2, 6), 10: (9, 11), 2: (1, 3), 6: (5, 7)},
          {11: (3,), 3: (1, 7), 1: (0, 2), 7: (5, 9), 5: (4, 6), 9: (8, 10)})  # fmt: skip
FIG_13 = ({0: (8,), 8: (4, 12), 4: (2, 6), 12: (10,), 2: (1, 3), 6: (5, 7), 10: (9, 11)},
          {1: (9,), 9: (5, 0), 5: (3, 7), 0: (11,), 3: (2, 4), 7: (6, 8), 11: (10, 12)})  # fmt: skip


@pytest.mark.parametrize(("n", "which", "fig"), [(14, 0, FIG_14), (12, 0, FIG_12[0]), (12, 1, FIG_12[1]),
                                                 (13, 0, FIG_13[0]), (13, 1, FIG_13[1])])  # fmt: skip
def test_the_closed_form_draws_trees_cc_figures(n: int, which: int, fig: dict[int, tuple[int, ...]]) -> None:
    _, kids = nccl_dtree(n, which)
    assert {r: k for r, k in enumerate(kids) if k} == edges(fig)


@pytest.mark.parametrize("n", range(1, 65))
def test_phantora_builds_nccl_trees(n: int) -> None:
    """Both trees, every rank's parent and children, for 1..64 nodes: roots 0 and n-1 (even n) or 1 (odd n)."""
    for which in (0, 1):
        parent, kids = nccl_dtree(n, which)
        assert all(parent[k] == r for r in range(n) for k in kids[r])  # the closed form's two halves agree
        got = dbt_parents(n, which)
        assert got == parent
        assert [set(k) for k in children_of(got)] == kids
    if n > 1:
        assert dbt_parents(n, 0).index(None) == 0
        assert dbt_parents(n, 1).index(None) == (1 if n % 2 else n - 1)


@pytest.mark.parametrize("hosts", [3, 5])
def test_a_chunked_tree_all_reduce_runs_tree_0_on_the_search_channels_and_tree_1_on_their_copies(hosts: int) -> None:
    """A 16 MiB Tree/Simple all-reduce on `hosts` hosts of 8 H100s with a 400G NIC each: the search finds s = 8
    channels (8 NICs of 50 GB/s, test_nccl_tree_channels), the communicator runs 16; channel c < 8 runs tree 0, the
    rest tree 1. Each channel's flows between hosts join exactly its tree's edges, both ways (up and down)."""
    topo = rail_optimized(hosts, 8, gpu="h100")
    opts = AlgoOptions(nccl_env=nccl_env({"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}), granularity="chunked")
    dag = decompose(Collective("all_reduce", tuple(range(8 * hosts)), 16 * MiB, "fp32"), topo, opts)
    host_of = {r: r // 8 for r in range(8 * hosts)}  # rank order: 8 a host, hosts in order
    links: dict[int, set[tuple[int, int]]] = defaultdict(set)
    names: dict[int, set[str]] = defaultdict(set)
    for f in dag.flows:
        a, b = host_of[topo.endpoints.index(f.src)], host_of[topo.endpoints.index(f.dst)]
        if a != b:
            name, ch = f.tag.split("/")[:2]
            c = int(ch.removeprefix("ch"))
            links[c].add((a, b))
            names[c].add(name)
    assert sorted(links) == list(range(16))
    for c in range(16):
        which = int(c >= 8)
        parent, _ = nccl_dtree(hosts, which)
        tree = {(u, p) for u, p in enumerate(parent) if p is not None}
        assert names[c] == {f"tree{which}"}
        assert links[c] == tree | {(p, u) for u, p in tree}
