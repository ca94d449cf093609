"""Collective DAGs timed by the flow-level engine, against closed forms.

Star: n hosts on one non-blocking switch, every link B bits/s and L ns, so a host-to-host path is
two links: 2L of latency, and a host's up- and downlink are the only shared resources. The engine
rounds each transmission up to a whole ns and a flow completes one path latency after its last
byte leaves, so every closed form below is exact up to a few ns per step.

These closed forms are those of the ideal decomposition (`model="ideal"`: line rate, no protocol bytes, no NCCL
latency or rate caps), which `run` uses; the NCCL model, the default, has its own closed-form tests in
tests/test_nccl_model.py.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, collective_metrics, decompose
from phantora.topology.model import Topology
from tests import stars

flow = pytest.importorskip("phantora.netsim.flow", reason="the flow-level engine phantora/netsim/flow.py is missing")

B = 100 * 10**9  # bits/s
BYTES_PER_NS = B / 8e9
L = 1000  # ns per link
MiB = 1 << 20


def star(n: int) -> Topology:
    return stars.star(n, B, L, tier=1, switch_first=True)


def cluster(hosts: int, m: int, nic_bps: int, nvl_bps: int, nvl_lat: int = 100) -> Topology:
    topo = Topology(name=f"cluster{hosts}x{m}")
    sw = topo.add_node("switch", tier=1)
    for h in range(hosts):
        nv = topo.add_node("nvswitch", host=h)
        for _ in range(m):
            g = topo.add_node("gpu", host=h)
            topo.add_link(g, nv, nvl_bps, nvl_lat)
            topo.add_link(g, sw, nic_bps, L)
    return topo.validate()


def run(coll: Collective, topo: Topology, **opts: object) -> tuple[int, dict[int, int]]:
    """Makespan of the collective from t=0 under the ideal model, and each rank's done time from `rank_last`."""
    dag = decompose(coll, topo, AlgoOptions(**{"model": "ideal", **opts}))
    sim = flow.FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    end = {c.flow_id: c.end_ns for c in sim.drain()}
    done = {r: max((end[f] for f in last), default=0) for r, last in dag.rank_last.items()}
    return max(end.values()), done


def close(got: float, want: float, rel: float = 0.01) -> bool:
    return abs(got - want) <= rel * want


# ----- ring -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("size", [2 * MiB, 96 * MiB])
@pytest.mark.parametrize("channels", [1, 4])
def test_ring_all_reduce_coarse(n: int, size: int, channels: int) -> None:
    """One flow per edge, all at once: each link carries 2(n-1)/n S at B, plus one path latency,
    plus the summed step latency (2(n-1) d) as the flows' delay."""
    d = 3000
    t, done = run(
        Collective("all_reduce", tuple(range(n)), size), star(n), algorithm="ring", channels=channels, step_latency_ns=d
    )
    want = 2 * (n - 1) / n * size / BYTES_PER_NS + 2 * L + 2 * (n - 1) * d
    assert close(t, want), (t, want)
    assert set(done.values()) == {t}  # symmetric: every rank is done at the end


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize(("size", "chunk"), [(MiB, 2 * MiB), (48 * MiB, 2 * MiB), (10_000_003, MiB)])
@pytest.mark.parametrize("channels", [1, 2])
def test_ring_all_reduce_chunked(n: int, size: int, chunk: int, channels: int) -> None:
    """Chunked steps run in lockstep: in each of the 2(n-1) steps every host's up- and downlink carry
    S/n bytes (all chunks of all channels at once), then one path latency, then the step delay d."""
    d = 2000
    t, _ = run(
        Collective("all_reduce", tuple(range(n)), size),
        star(n),
        algorithm="ring",
        granularity="chunked",
        channels=channels,
        chunk_bytes=chunk,
        step_latency_ns=d,
    )
    want = 2 * (n - 1) * (size / n / BYTES_PER_NS + 2 * L + d)
    assert close(t, want), (t, want)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("gran", ["coarse", "chunked"])
def test_ring_gather_scatter(kind: str, gran: str) -> None:
    n, size = 6, 60 * MiB
    t, _ = run(Collective(kind, tuple(range(n)), size), star(n), granularity=gran, channels=2)
    per_link = (n - 1) / n * size / BYTES_PER_NS
    want = per_link + 2 * L if gran == "coarse" else per_link + (n - 1) * 2 * L
    assert close(t, want), (t, want)


@pytest.mark.parametrize("n", [5, 16, 1024])
def test_barrier_costs_latency_only(n: int) -> None:
    """A one-byte all-reduce up and down a binary tree (NCCL's choice for a tiny all-reduce across hosts;
    on a star each GPU is its own host): NCCL's tree 0 (trees.cc) is k = bitlen(n - 1) deep, rank 1 the deepest
    (1, 2, 4, ..., 2^(k-1), root 0), so 2k hops of one byte (rounded up to 1 ns) and 2L, and 2(n-1) flows, so a
    barrier of 1024 ranks stays cheap to build."""
    t, _ = run(Collective("barrier", tuple(range(n)), 0), star(n))
    assert t == 2 * (n - 1).bit_length() * (2 * L + 1)
    assert len(decompose(Collective("barrier", tuple(range(n)), 0), star(n)).flows) == 2 * (n - 1)


# ----- chain, direct, tree, all-to-all -----------------------------------------------------------
@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
@pytest.mark.parametrize(("n", "channels", "k"), [(2, 1, 4), (5, 1, 8), (6, 2, 3)])
def test_chain_chunked_pipeline(kind: str, n: int, channels: int, k: int) -> None:
    """A pipeline of n-1 hops and k chunks per channel: k + n - 2 slots, each moving one chunk of
    every channel over one hop (disjoint links per hop on a star) plus 2L plus the delay d."""
    c, d = 512 * 1024, 1500
    size = channels * k * c
    t, _ = run(
        Collective(kind, tuple(range(n)), size, root=n // 2),
        star(n),
        algorithm="chain",
        granularity="chunked",
        channels=channels,
        chunk_bytes=c,
        step_latency_ns=d,
    )
    want = (k + n - 2) * (channels * c / BYTES_PER_NS + 2 * L + d)
    assert close(t, want), (t, want)


def test_chain_coarse_and_direct_broadcast() -> None:
    n, size = 7, 40 * MiB
    topo = star(n)
    t_chain, _ = run(Collective("broadcast", tuple(range(n)), size), topo, algorithm="chain")
    assert close(t_chain, size / BYTES_PER_NS + 2 * L)  # every hop at once: S at B
    t_direct, _ = run(Collective("broadcast", tuple(range(n)), size), topo, algorithm="direct")
    assert close(t_direct, (n - 1) * size / BYTES_PER_NS + 2 * L)  # the root's uplink carries (n-1) S


@pytest.mark.parametrize("n", [4, 8, 16])
def test_tree_all_reduce_coarse(n: int) -> None:
    """Double binary tree, all edges at once: a rank inner in one tree (2 children) and a leaf in the
    other sends up + 2 down + up = 4 half-buffers = 2 S; every link carries at most that, and flows on
    the busiest links all run at B/4 (per channel), so the time is 2 S / B + 2L."""
    size = 32 * MiB
    t, _ = run(Collective("all_reduce", tuple(range(n)), size), star(n), algorithm="tree", channels=2)
    assert close(t, 2 * size / BYTES_PER_NS + 2 * L), t


@pytest.mark.parametrize("n", [4, 8])
def test_tree_all_reduce_chunked_bounds(n: int) -> None:
    """Chunked tree: never faster than the busiest NIC allows (2 S / B); pipelining over 64 chunks
    per tree keeps the pipeline fill under 10 % of the run (store-and-forward would take ~log2(n) times longer)."""
    size = 64 * MiB
    t, _ = run(
        Collective("all_reduce", tuple(range(n)), size),
        star(n),
        algorithm="tree",
        granularity="chunked",
        channels=2,
        chunk_bytes=512 * 1024,
    )
    floor = 2 * size / BYTES_PER_NS
    assert floor <= t <= 1.10 * floor, (t, floor)


@pytest.mark.parametrize("n", [3, 6])
def test_all_to_all(n: int) -> None:
    size, d = n * 4 * MiB, 2500
    topo = star(n)
    coll = Collective("all_to_all", tuple(range(n)), size)
    t_pair, _ = run(coll, topo, algorithm="pairwise", step_latency_ns=d)
    # n-1 rounds; in each, a host sends one block up and receives one down, at B.
    assert close(t_pair, (n - 1) * (size / n / BYTES_PER_NS + 2 * L + d)), t_pair
    t_direct, _ = run(coll, topo, algorithm="direct", step_latency_ns=d)
    # all at once: n-1 flows share each uplink and each downlink.
    assert close(t_direct, (n - 1) / n * size / BYTES_PER_NS + 2 * L + d), t_direct


# ----- busbw ---------------------------------------------------------------------------------
BUSBW_CASES = [
    ("all_reduce", "ring", "coarse"),
    ("all_reduce", "ring", "chunked"),
    ("all_gather", "ring", "chunked"),
    ("reduce_scatter", "ring", "coarse"),
    ("broadcast", "chain", "coarse"),
    ("broadcast", "chain", "chunked"),
    ("reduce", "chain", "chunked"),
    ("all_to_all", "pairwise", "coarse"),
    ("all_to_all", "direct", "coarse"),
    ("send_recv", "auto", "coarse"),
]


@pytest.mark.parametrize(("kind", "algo", "gran"), BUSBW_CASES)
def test_busbw_is_link_rate(kind: str, algo: str, gran: str) -> None:
    """nccl-tests' busbw is defined so that a bandwidth-optimal algorithm reports the bottleneck link rate."""
    n, size = 4, 256 * MiB
    ranks = (0, 3) if kind == "send_recv" else tuple(range(n))
    coll = Collective(kind, ranks, size)
    t, _ = run(coll, star(n), algorithm=algo, granularity=gran, chunk_bytes=MiB)
    assert close(collective_metrics(coll, t)["busbw"], B / 8, rel=0.03)


def test_multi_host_ring_uses_every_nic() -> None:
    """NCCL-like rotated rings: with 2m channels each GPU's NIC carries 2 of them, so a flat ring
    all-reduce reaches busbw = m x NIC rate when NVLink is fast enough ((m-1) B_nic < B_nvl)."""
    hosts, m = 3, 4
    nic, nvl = B, 8 * B
    topo = cluster(hosts, m, nic, nvl)
    coll = Collective("all_reduce", tuple(range(hosts * m)), 192 * MiB)
    for gran in ("coarse", "chunked"):
        t, _ = run(coll, topo, granularity=gran)
        assert close(collective_metrics(coll, t)["busbw"], m * nic / 8, rel=0.03), gran


def test_hierarchical_all_reduce_coarse() -> None:
    """Three sequential phases: NVLink reduce-scatter ((m-1)/m S), NIC all-reduce of S/m between
    hosts (2(H-1)/H S/m), NVLink all-gather ((m-1)/m S), each with its own path latency."""
    hosts, m, nvl_lat = 4, 4, 100
    nic, nvl = B, 6 * B
    topo = cluster(hosts, m, nic, nvl, nvl_lat)
    size = 96 * MiB
    t, _ = run(Collective("all_reduce", tuple(range(hosts * m)), size), topo, algorithm="hierarchical")
    nvl_bpns = nvl / 8e9
    want = (
        2 * (m - 1) / m * size / nvl_bpns
        + 2 * (hosts - 1) / hosts * size / m / BYTES_PER_NS
        + 2 * (2 * nvl_lat)
        + 2 * L
    )
    assert close(t, want), (t, want)
