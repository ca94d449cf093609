"""Collective decomposition: flow sizes against the algorithms' byte formulas, DAG structure, defaults.

The byte formulas, chunk structure and default options are those of the ideal decomposition (`model="ideal"`:
line rate, no protocol, phantora's own default algorithm and channel rules); the NCCL model, the default, has its
own closed-form tests in tests/test_nccl_model.py. Tests that do not ask for the ideal model run under NCCL's.
"""

from __future__ import annotations

import re
from collections import Counter

import networkx as nx
import pytest

from phantora.collectives import AlgoOptions, Collective, collective_metrics, decompose, default_options
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.layout import dbt_parents, host_blocks, ring_order, tree_parents
from phantora.errors import InputError
from phantora.topology.model import Topology
from tests import stars

B = 100 * 10**9
L = 1000
MiB = 1 << 20
IDEAL = AlgoOptions(model="ideal")


def star(n: int) -> Topology:
    return stars.star(n, B, L, tier=1, switch_first=True)


def cluster(hosts: int, m: int, nic_bps: int = B, nvl_bps: int = 24 * B) -> Topology:
    """`hosts` servers of `m` GPUs, each GPU with its own NIC on one switch and an NVSwitch per server."""
    topo = Topology(name=f"cluster{hosts}x{m}")
    sw = topo.add_node("switch", tier=1)
    for h in range(hosts):
        nv = topo.add_node("nvswitch", host=h)
        for _ in range(m):
            g = topo.add_node("gpu", host=h)
            topo.add_link(g, nv, nvl_bps, 100)
            topo.add_link(g, sw, nic_bps, L)
    return topo.validate()


def sent_by_rank(topo: Topology, dag) -> Counter:
    """The collective's bytes each rank sends (not the clear-to-sends going back: `back_pressure.is_credit`)."""
    rank_of = {node: r for r, node in enumerate(topo.endpoints)}
    out: Counter = Counter()
    for f in dag.flows:
        if not is_credit(f):
            out[rank_of[f.src]] += f.size
    return out


def recv_by_rank(topo: Topology, dag) -> Counter:
    """The collective's bytes each rank receives (not the clear-to-sends)."""
    rank_of = {node: r for r, node in enumerate(topo.endpoints)}
    out: Counter = Counter()
    for f in dag.flows:
        if not is_credit(f):
            out[rank_of[f.dst]] += f.size
    return out


def graph(dag) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(f.id for f in dag.flows)
    g.add_edges_from((d, f.id) for f in dag.flows for d in f.deps)
    return g


GRANS = ("coarse", "chunked")


# ----- bytes per rank ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "protocol", "wire"), [("ideal", "auto", 1), ("nccl", "Simple", 1), ("nccl", "LL", 2)]
)
@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("channels", [1, 3, 4])
def test_ring_bytes_per_rank(n: int, channels: int, gran: str, model: str, protocol: str, wire: int) -> None:
    """The ring's bytes per rank: the ideal decomposition's closed form; under the NCCL model the same payload,
    sent as NCCL's protocol puts it on the wire (Simple: the data; LL: 16-byte lines of 8 data bytes, x2, each
    flow in whole lines: NCCL 2.30's channel parts are whole 16-byte cells but a chunked slice's near-equal
    chunks need not be, so up to 14 wire bytes more a flow)."""
    topo = star(n)
    size = n * channels * 3 * 256 * 1024  # divisible: every slice is whole (and whole LL lines)
    opts = AlgoOptions(
        algorithm="ring", granularity=gran, channels=channels, chunk_bytes=256 * 1024, model=model, protocol=protocol
    )
    want = {"all_reduce": 2 * (n - 1) * size // n, "all_gather": (n - 1) * size // n}
    want["reduce_scatter"] = want["all_gather"]
    for kind, nbytes in want.items():
        dag = decompose(Collective(kind, tuple(range(n)), size), topo, opts)
        assert (dag.choice or {}).get("protocol") == (protocol if model == "nccl" else None)
        sent, recv = sent_by_rank(topo, dag), recv_by_rank(topo, dag)
        flows = Counter(topo.endpoints.index(f.src) for f in dag.flows if not is_credit(f))
        for r in range(n):
            assert sent[r] == recv[r], (kind, r)
            assert 0 <= sent[r] - wire * nbytes <= (14 * flows[r] if protocol == "LL" else 0), (kind, r)


@pytest.mark.parametrize("gran", GRANS)
def test_ring_bytes_uneven_sizes(gran: str) -> None:
    """Sizes that do not divide: the total is exact, each rank within one byte per step and channel (near-equal
    slices); a chunked ring under the NCCL model cuts its last loop in 16-byte aligned chunks, the last of them
    short (all_reduce.h), so a rank is within (n - 1) x 16 B of the even share per phase and channel."""
    n, ch = 5, 3
    topo = star(n)
    size = 10_000_019
    for model in ("ideal", "nccl"):
        opts = AlgoOptions(algorithm="ring", granularity=gran, channels=ch, chunk_bytes=300_000, model=model)
        dag = decompose(Collective("all_reduce", tuple(range(n)), size), topo, opts)
        sent = sent_by_rank(topo, dag)
        assert sum(sent.values()) == 2 * (n - 1) * size
        slack = 2 * (n - 1) * 16 * ch if (model, gran) == ("nccl", "chunked") else 2 * (n - 1) * ch
        for r in range(n):
            assert abs(sent[r] - 2 * (n - 1) / n * size) <= slack


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("algo", ["pairwise", "direct"])
@pytest.mark.parametrize("n", [2, 4, 7])
def test_all_to_all_bytes(n: int, algo: str, gran: str) -> None:
    topo = star(n)
    size = n * 1000
    dag = decompose(
        Collective("all_to_all", tuple(range(n)), size), topo, AlgoOptions(algorithm=algo, granularity=gran)
    )
    sent, recv = sent_by_rank(topo, dag), recv_by_rank(topo, dag)
    pairs = Counter((f.src, f.dst) for f in dag.flows)
    assert len(pairs) == n * (n - 1)  # every ordered pair once
    for r in range(n):
        assert sent[r] == recv[r] == (n - 1) * size // n


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("algo", ["chain", "direct"])
@pytest.mark.parametrize("n", [2, 3, 6])
def test_broadcast_reduce_bytes(n: int, algo: str, gran: str) -> None:
    topo = star(n)
    size, root = 6 * MiB, n - 1
    opts = AlgoOptions(algorithm=algo, granularity=gran, channels=2, chunk_bytes=MiB)
    bc = decompose(Collective("broadcast", tuple(range(n)), size, root=root), topo, opts)
    rd = decompose(Collective("reduce", tuple(range(n)), size, root=root), topo, opts)
    sent_bc, recv_bc, sent_rd = sent_by_rank(topo, bc), recv_by_rank(topo, bc), sent_by_rank(topo, rd)
    for r in range(n):
        assert recv_bc[r] == (0 if r == root else size)  # everyone but the root receives S
        assert sent_rd[r] == (0 if r == root else size)  # everyone but the root sends S
    if algo == "chain":
        # A chain: every rank but the last sends S once; exactly one rank (the chain's end) sends nothing.
        assert sorted(sent_bc[r] for r in range(n)) == [0] + [size] * (n - 1)
        assert sent_bc[root] == size
    else:
        assert sent_bc[root] == (n - 1) * size


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("n", [2, 3, 8, 13])
def test_tree_all_reduce_bytes(n: int, gran: str) -> None:
    """Every tree edge carries the tree's data up and down: 2 (n-1) S in total over both trees (ideal
    decomposition: the NCCL model may send the tree's LL/LL128 lines)."""
    topo = star(n)
    size = 4 * 3 * MiB
    opts = AlgoOptions(algorithm="tree", granularity=gran, channels=4, chunk_bytes=MiB, model="ideal")
    dag = decompose(Collective("all_reduce", tuple(range(n)), size), topo, opts)
    sent, recv = sent_by_rank(topo, dag), recv_by_rank(topo, dag)
    assert sum(sent.values()) == 2 * (n - 1) * size
    for r in range(n):
        assert recv[r] >= size // 2 * 2  # gets its tree-1 and tree-0 halves down (or up, at a root)
    if n % 2 == 0 and n >= 4:
        # Double binary tree: a rank is inner in one tree (<= 2 children) and a leaf in the other, so
        # it sends at most up + 2 down (inner) + up (leaf) = 4 half-buffers = 2 S.
        assert max(sent.values()) == 2 * size


@pytest.mark.parametrize("gran", GRANS)
def test_hierarchical_bytes(gran: str) -> None:
    hosts, m = 3, 4
    topo = cluster(hosts, m)
    n, size = hosts * m, hosts * m * 2 * 192 * 1024
    opts = AlgoOptions(algorithm="hierarchical", granularity=gran, channels=2, chunk_bytes=64 * 1024)
    dag = decompose(Collective("all_reduce", tuple(range(n)), size), topo, opts)
    sent = sent_by_rank(topo, dag)
    want = 2 * (m - 1) * size // m + 2 * (hosts - 1) * size // (hosts * m)
    for r in range(n):
        assert sent[r] == want
    host = {node: topo.nodes[node].host for node in topo.endpoints}
    local = {node: i % m for i, node in enumerate(topo.endpoints)}
    for f in dag.flows:
        if host[f.src] != host[f.dst]:
            assert local[f.src] == local[f.dst], f.tag  # across hosts only between equal local indices


def test_send_recv_and_barrier() -> None:
    topo = star(6)
    dag = decompose(Collective("send_recv", (4, 1), 12345), topo, first_flow_id=7, tag="p")
    assert [(f.id, f.src, f.dst, f.size) for f in dag.flows] == [(7, topo.endpoints[4], topo.endpoints[1], 12345)]
    assert dag.rank_last == {4: [7], 1: [7]} and dag.next_id == 8
    bar = decompose(Collective("barrier", tuple(range(6)), 0), topo)
    assert len(bar.flows) == 2 * 5 and all(f.size == 1 for f in bar.flows)  # one byte up and down each tree edge


# ----- DAG structure -------------------------------------------------------------------------
ALL_CASES = [
    ("all_reduce", "ring"),
    ("all_reduce", "tree"),
    ("all_reduce", "hierarchical"),
    ("all_gather", "ring"),
    ("reduce_scatter", "ring"),
    ("broadcast", "chain"),
    ("broadcast", "direct"),
    ("reduce", "chain"),
    ("reduce", "direct"),
    ("all_to_all", "pairwise"),
    ("all_to_all", "direct"),
    ("barrier", "auto"),
]


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize(("kind", "algo"), ALL_CASES)
def test_dag_is_well_formed(kind: str, algo: str, gran: str) -> None:
    topo = cluster(2, 3)
    ranks = (5, 0, 3, 1, 4, 2)  # a permuted group
    coll = Collective(kind, ranks, 5 * MiB + 3, root=2 if kind in ("broadcast", "reduce") else None)
    opts = AlgoOptions(algorithm=algo, granularity=gran, channels=3, chunk_bytes=MiB)
    first = 1000
    dag = decompose(coll, topo, opts, first_flow_id=first, tag="c9")
    ids = [f.id for f in dag.flows]
    assert ids == list(range(first, dag.next_id)) and ids
    g = graph(dag)
    assert set(g.nodes) == set(ids)  # deps only on flows of this DAG
    assert nx.is_directed_acyclic_graph(g)
    members = {topo.node_of_rank(r) for r in ranks}
    assert all(f.src in members and f.dst in members and (f.src != f.dst or is_credit(f)) for f in dag.flows)
    assert all(f.tag.startswith("c9/") for f in dag.flows)
    # rank_last: each listed flow touches the rank; every flow of the rank is one of them or an ancestor. A flow
    # between hosts may leave by another GPU's NIC of the sender's host (NCCL's rings: nccl/nvswitch_rings.py), so
    # it counts for a rank of that host.
    assert set(dag.rank_last) == set(ranks)
    host = {f.id: topo.nodes[f.src].host for f in dag.flows}
    out = {f.id for f in dag.flows if topo.nodes[f.dst].host != host[f.id]}
    by_host: dict[object, set[int]] = {}
    for r, last in dag.rank_last.items():
        node = topo.node_of_rank(r)
        mine = {f.id for f in dag.flows if node in (f.src, f.dst)}
        leaving = {i for i in out if host[i] == topo.nodes[node].host}
        assert last and set(last) <= mine | leaving
        covered = set(last).union(*(nx.ancestors(g, x) for x in last))
        assert mine - leaving <= covered
        by_host.setdefault(topo.nodes[node].host, set()).update(covered)
    assert all(i in by_host[host[i]] for i in out)


@pytest.mark.parametrize(("kind", "steps"), [("all_reduce", 2), ("all_gather", 1), ("reduce_scatter", 1)])
@pytest.mark.parametrize(("n", "channels", "chunks"), [(2, 1, 1), (4, 2, 3), (5, 3, 2)])
def test_chunked_ring_structure(kind: str, steps: int, n: int, channels: int, chunks: int) -> None:
    """The ideal decomposition's chunked ring: chunk-sized flows, each delayed by the step latency only (the NCCL
    model adds its latency to the first flows and sends protocol lines)."""
    topo = star(n)
    chunk = 64 * 1024
    size = n * channels * chunks * chunk
    step_ns = 700
    opts = AlgoOptions(
        algorithm="ring",
        granularity="chunked",
        channels=channels,
        chunk_bytes=chunk,
        step_latency_ns=step_ns,
        model="ideal",
    )
    dag = decompose(Collective(kind, tuple(range(n)), size), topo, opts)
    nsteps = steps * (n - 1)
    assert len(dag.flows) == channels * nsteps * n * chunks
    assert all(f.size == chunk and f.delay_ns == step_ns for f in dag.flows)
    pat = re.compile(r"ring/ch(\d+)/step(\d+)(?:/chunk(\d+))?$")
    by_id = {f.id: f for f in dag.flows}
    for f in dag.flows:
        ch, s, c = (int(x or 0) for x in pat.match(f.tag).groups())
        assert 0 <= ch < channels and 0 <= s < nsteps and 0 <= c < chunks
        if s == 0:
            assert f.deps == ()
            continue
        (d,) = f.deps  # exactly one: the same chunk, received from the predecessor one step earlier
        g = by_id[d]
        assert g.dst == f.src and pat.match(g.tag).groups() == (str(ch), str(s - 1), pat.match(f.tag).group(3))


def test_coarse_ring_is_one_flow_per_edge_and_channel() -> None:
    n, ch = 6, 4
    topo = star(n)
    dag = decompose(
        Collective("all_reduce", tuple(range(n)), 24 * MiB), topo, AlgoOptions(algorithm="ring", channels=ch)
    )
    assert len(dag.flows) == n * ch and all(not f.deps for f in dag.flows)
    assert {f.size for f in dag.flows} == {2 * (n - 1) * 24 * MiB // (n * ch)}
    assert len(Counter((f.src, f.dst) for f in dag.flows)) == n  # one ring: n edges
    for ch_keys in Counter((f.src, f.dst) for f in dag.flows).values():
        assert ch_keys == ch
    keys = {(f.src, f.dst): set() for f in dag.flows}
    for f in dag.flows:
        keys[(f.src, f.dst)].add(f.key)
    assert all(len(k) == ch for k in keys.values())  # a distinct ECMP key per channel


def test_channels_spread_over_ecmp_paths() -> None:
    """Two leaves joined by 4 spines: a ring's channels between the leaves take several spines."""
    topo = Topology(name="leafspine")
    leaves = [topo.add_node("switch", tier=1) for _ in range(2)]
    spines = [topo.add_node("switch", tier=2) for _ in range(4)]
    for leaf in leaves:
        for sp in spines:
            topo.add_link(leaf, sp, 4 * B, L)
    for i in range(4):
        topo.add_link(topo.add_node("host"), leaves[i // 2], B, L)
    topo.validate()
    dag = decompose(Collective("all_reduce", (0, 1, 2, 3), 64 * MiB), topo, AlgoOptions(channels=8))
    spine_of = {2 * lk.id: lk.b for lk in topo.links if lk.b in spines}
    used = set()
    for f in dag.flows:
        if f.src == topo.endpoints[1] and f.dst == topo.endpoints[2]:
            used |= {spine_of[c] for c in topo.route(f.src, f.dst, f.key) if c in spine_of}
    assert len(used) >= 2


def test_trivial_collectives_are_empty() -> None:
    topo = star(4)
    for coll in (
        Collective("all_reduce", (2,), MiB),
        Collective("all_reduce", (0, 1, 2), 0),
        Collective("all_to_all", (0, 3), 0, alltoall_api=True),  # ncclAlltoAll (2.28+) of count 0: discarded
        Collective("barrier", (1,), 0),
    ):
        dag = decompose(coll, topo, first_flow_id=42)
        assert dag.flows == [] and dag.next_id == 42
        assert dag.rank_last == {r: [] for r in coll.ranks}


def test_deterministic() -> None:
    topo = cluster(2, 4)
    coll = Collective("all_reduce", tuple(range(8)), 33 * MiB + 5)
    for algo in ("ring", "tree", "hierarchical"):
        opts = AlgoOptions(algorithm=algo, granularity="chunked")
        assert decompose(coll, topo, opts) == decompose(coll, topo, opts)


# ----- layouts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", range(1, 41))
def test_double_binary_tree(n: int) -> None:
    inner = []
    for which in (0, 1):
        parent = dbt_parents(n, which)
        assert parent.count(None) == 1
        g = nx.DiGraph([(v, p) for v, p in enumerate(parent) if p is not None])
        g.add_nodes_from(range(n))
        assert nx.is_tree(g.to_undirected()) if n > 1 else True
        kids = Counter(p for p in parent if p is not None)
        assert max(kids.values(), default=0) <= 2
        inner.append(set(kids))
        assert max(nx.shortest_path_length(g, v, parent.index(None)) for v in range(n)) <= n.bit_length()
    # no rank is inner in both trees but, for an odd n > 1, rank 0: tree 0's root, and in tree 1 (shifted) in rank
    # n-1's place, which has a child (trees.cc's 13-rank figure: 0 -> 11); NCCL's trees: test_nccl_dtree.py
    assert inner[0] & inner[1] == (set() if n % 2 == 0 or n == 1 else {0})
    if n % 2 == 0:
        assert inner[0] | inner[1] == set(range(n))  # each rank is inner in exactly one tree


def test_multi_host_rings_leave_each_host_from_every_gpu() -> None:
    hosts, m = 3, 4
    topo = cluster(hosts, m)
    blocks = host_blocks(topo, list(topo.endpoints))
    exits = set()
    for c in range(m):
        order = ring_order(blocks, c)
        assert sorted(order) == list(range(hosts * m))
        crossings = [
            (a, b) for a, b in zip(order, order[1:] + order[:1], strict=True) if a // m != b // m
        ]  # positions: host = pos // m
        assert len(crossings) == hosts  # each host is entered and left once
        exits |= {a for a, _ in crossings}
    assert exits == set(range(hosts * m))  # over m channels, every GPU's NIC sends
    parent = tree_parents(blocks, 0, 1)
    heads = [p for p in range(hosts * m) if parent[p] is None or parent[p] // m != p // m]
    assert len(heads) == hosts and all(h % m == 1 for h in heads)  # rotation 1: local rank 1 heads each host


# ----- options and metrics -------------------------------------------------------------------
def test_default_options() -> None:
    """The ideal model's defaults (its own algorithm and channel rules); under the default NCCL model every
    NCCL-modelled kind resolves to a protocol and at least one channel."""
    s, c = star(8), cluster(2, 4)
    big = 256 * MiB

    def resolve(kind: str, topo: Topology, base: AlgoOptions = IDEAL, nbytes: int = big) -> AlgoOptions:
        return default_options(Collective(kind, tuple(range(topo.num_ranks)), nbytes), topo, base)

    assert [resolve(k, s).algorithm for k in ("all_reduce", "all_gather", "broadcast", "all_to_all", "barrier")] == [
        "ring",
        "ring",
        "chain",
        "pairwise",
        "tree",
    ]
    assert resolve("all_reduce", s).channels == 2  # one NIC per rank: 2 channels
    assert resolve("all_reduce", c).channels == 8  # 4 GPUs (NICs) per host: 2 x 4
    assert resolve("all_reduce", c, nbytes=8 * 64 * 1024 * 3).channels == 3  # small: >= 64 KiB per rank and channel
    assert resolve("all_reduce", c, nbytes=1000).channels == 1
    assert resolve("all_to_all", c).channels == 1
    assert resolve("all_reduce", c, AlgoOptions(channels=5, model="ideal")).channels == 5
    hier = AlgoOptions(algorithm="hierarchical", model="ideal")
    assert resolve("all_reduce", s, hier).algorithm == "ring"  # no hosts
    assert resolve("all_reduce", c, hier).algorithm == "hierarchical"
    assert resolve("all_reduce", c, AlgoOptions(granularity="chunked", model="ideal")).granularity == "chunked"
    assert {resolve(k, t).protocol for k in ("all_reduce", "all_gather", "all_to_all") for t in (s, c)} == {"auto"}
    # The default model: NCCL's choice, a protocol and channels for every kind it models, large and small.
    for topo in (s, c):
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"):
            for nbytes in (1000, big):
                got = resolve(kind, topo, AlgoOptions(), nbytes)
                assert got.model == "nccl" and got.protocol in ("LL", "LL128", "Simple"), (topo.name, kind, nbytes)
                assert got.channels > 0 and got.algorithm != "auto", (topo.name, kind, nbytes)
    assert resolve("all_reduce", c, AlgoOptions(channels=5)).channels == 5  # explicit channels win there too
    with pytest.raises(InputError, match="field 'algorithm'.*tree.*all_gather"):
        resolve("all_gather", s, AlgoOptions(algorithm="tree"))
    with pytest.raises(InputError, match="rank 9"):
        decompose(Collective("all_reduce", (0, 9), MiB), star(4))
    with pytest.raises(InputError, match="step_latency_ns"):
        AlgoOptions(step_latency_ns=-1)


def test_collective_metrics() -> None:
    m = collective_metrics(Collective("all_reduce", tuple(range(8)), 10**9), 10**6)
    assert m["time_ns"] == 10**6 and m["algbw"] == pytest.approx(1e12) and m["busbw"] == pytest.approx(1.75e12)
    assert m["busbw_gbps"] == pytest.approx(1750.0)
    ag = collective_metrics(Collective("all_gather", tuple(range(4)), 4 * 10**6), 2 * 10**3)
    assert ag["algbw"] == pytest.approx(2e12) and ag["busbw"] == pytest.approx(1.5e12)
    bc = collective_metrics(Collective("broadcast", tuple(range(4)), 10**6), 10**3)
    assert bc["busbw"] == bc["algbw"] == pytest.approx(1e12)
    assert collective_metrics(Collective("all_reduce", (0, 1), 0), 0)["busbw"] == 0.0
    with pytest.raises(InputError, match="duration"):
        collective_metrics(Collective("all_reduce", (0, 1), 1), -1)
