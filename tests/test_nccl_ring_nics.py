"""The NIC NCCL's ring leaves an NCCL node of SHM GPUs by (P2P off on NVLink hosts with NICs: nccl/ring_nics.py).

NVIDIA/nccl search.cc (v2.19.4-1 to v2.30.7-1): the ring search over such a node enters each channel at the first
GPU from its NIC, goes on to each GPU's previous (0, n-1, ..., 1: nccl/shm_order.py), and leaves the last GPU for
the NIC it entered from (crossNic 0); net.cc's
`ncclTopoGetNetDev` gives the last GPU that NIC (`graph->inter[2c + 1]`). PXN relays nothing with P2P off (paths.cc:
only through a GPU joined by NVLink). So on `rail_optimized(2, 8, 2)` with NCCL_P2P_DISABLE=1 (one NCCL node per
socket) the ring's hop 1 -> 4 leaves by GPU 0's NIC, and with NCCL_NET_DISABLE_INTRA=1 too (one node per host) the
hop 1 -> 8 does.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.platform import nccl_view, platform_of
from phantora.collectives.nccl.ring_nics import entry_nics, hops, ring
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.collectives.nccl.shm_order import node_order
from phantora.netsim.flow import FlowSimulator
from phantora.topology import rail_optimized
from phantora.topology.model import Topology

N = 8
GIB = 1 << 30
# NVLS, which P2P off leaves on (tests/test_nccl_nvls_p2p_off.py), off: these tests check the ring
P2P_OFF = {"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}
INTRA_OFF = {"NCCL_P2P_DISABLE": "1", "NCCL_NET_DISABLE_INTRA": "1", "NCCL_NVLS_ENABLE": "0"}
NODE_RING = 16 * 240 / 80.0 / (2 * 6 / 5)  # Gen5 x16 over switch 0's uplink, hops 0->1 and 1->2 at 6/5: 20 GB/s


def _opts(env: dict[str, str]) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env(env))


def _nic_bytes(topo: Topology, flows: list) -> dict[int, int]:
    """Bytes each GPU's NIC sends onto its rail leaf (the first link of each network route)."""
    out: dict[int, int] = {}
    for f in flows:
        if not f.size or f.src == f.dst:
            continue
        route = topo.route(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic)
        first = topo.nodes[topo.channel_ends(route[0])[1]]
        if first.kind == "switch":
            out[f.src] = out.get(f.src, 0) + f.size
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_a_nodes_ring_runs_from_gpu_0_to_each_gpus_previous(n: int) -> None:
    """search.cc `ncclTopoSearchNextGpuSort`, with an NVSwitch in the system: the ring neighbours next = i + 1 and
    prev = i - 1 (mod n) are moved to the front in that order, so prev ends first and is tried first; the search
    enters at GPU 0 (`ncclTopoSearchRecNet`: the first NIC's first local GPU). From GPU i the only unused neighbour
    after the first step is i - 1, so the ring is 0, n-1, ..., 1: GPU (n - k) mod n at step k."""
    assert node_order(n) == [(n - k) % n for k in range(n)]


def test_each_node_in_turn_and_its_hops_by_the_channels_nic() -> None:
    """Two nodes of 4 (GPU indices 0-3, 4-7): the ring 0 3 2 1 4 7 6 5 (NCCL's logs: "0 7 6 5 4 3 2 1 8 15 ..." on
    8-GPU nodes); its hops between nodes 1 -> 4 and 5 -> 0 leave by the channel's NIC j of the sender's node and
    arrive at NIC j of the receiver's (net.cc: `inter[2c]` in, `inter[2c + 1]` out, the same NIC at crossNic 0)."""
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ring(nodes) == [0, 3, 2, 1, 4, 7, 6, 5]
    assert hops(nodes, 0) == {(1, 4): (0, 4), (5, 0): (4, 0)}
    assert hops(nodes, 1) == {(1, 4): (1, 5), (5, 0): (5, 1)}
    assert hops([[0, 1, 2, 3]], 0) == {}


@pytest.mark.parametrize(
    ("found", "per_nic", "want"),
    [
        (1, 1, (0,)),
        (2, 1, (0, 1)),  # channel 1 replays from NIC 1, GPU 0's switch-mate's: PIX to GPU 0
        (3, 2, (0, 1, 0)),  # NICs 2, 3 are a PHB path from GPU 0: channel 2 wraps round to NIC 0
        (4, 2, (0, 1, 0, 1)),  # channel 3: NIC 3 (PHB), then NIC 0 (full), then NIC 1
        (3, 1, (0, 1, 2)),  # NICs 0 and 1 full: a wider typeInter takes the next NIC in turn
    ],
)
def test_each_found_channel_replays_gpu_0_from_the_next_nic_near_it(found: int, per_nic: int, want: tuple) -> None:
    """search.cc `ncclTopoSearchRecNet`, first pass (sameChannels 1): channel c tries NIC (c + i) mod 4 (a socket's
    NICs by GPU index), replaying channel 0's GPUs from GPU 0 (FORCED_ORDER_REPLAY); `ncclTopoFollowPath` refuses a
    path above typeInter (PIX first: NICs 0 and 1 share GPU 0's switch), and a NIC with less than a channel's
    bandwidth left is skipped (`net->net.bw < bw`: `per_nic` channels a NIC)."""
    assert entry_nics(found, 4, per_nic) == want


def test_a_split_view_has_its_bases_nccl_nodes() -> None:
    """The topology decompose builds on (one host per socket: net_split.split_view) gives NCCL's nodes of the host
    it was made from, not its sockets split again (before: 8 nodes of 2 GPUs, node ring 40 GB/s)."""
    topo = rail_optimized(2, N, 2)
    st = settings_from_env(P2P_OFF)
    ranks = tuple(range(2 * N))
    view = nccl_view(topo, ranks, st)
    assert view is not topo and nccl_view(view, ranks, st) is view
    p = platform_of(view, ranks, st)
    assert p == platform_of(topo, ranks, st)
    assert (p.nnodes, p.ppn, p.node_bw) == (4, 4, pytest.approx(NODE_RING))


@pytest.mark.parametrize(
    ("env", "hops", "busy"),
    [
        # sockets: 3 -> 4, 7 -> 8, 11 -> 12, 15 -> 0 leave by GPUs 0, 4, 8 and 12
        (P2P_OFF, [(0, 4), (4, N), (N, N + 4), (N + 4, 0)], {0, 4, N, N + 4}),
        # hosts: 7 -> 8 and 15 -> 0 leave by GPUs 0 and 8, both on rail 0
        (INTRA_OFF, [(0, N), (N, 0)], {0, N}),
    ],
)
def test_ring_leaves_each_node_by_its_entry_nic(env: dict[str, str], hops: list, busy: set[int]) -> None:
    """1 GiB all-reduce over 16 H100s: both channels run the one ring found (0 3 2 1 4 7 6 5 ..., no alternating), each
    NET hop sends 2 (n - 1) / n of the buffer from the NIC of its node's first GPU; no other NIC sends a byte; the bus
    bandwidth stays the node ring's 20 GB/s."""
    topo = rail_optimized(2, N, 2)
    n = 2 * N
    dag = decompose(Collective("all_reduce", tuple(range(n)), GIB, "fp32"), topo, _opts(env))
    choice = dag.choice or {}
    assert (choice["algorithm"], choice["channels"], choice["path"]) == ("Ring", 2, "NET")
    sent = _nic_bytes(topo, dag.flows)
    assert set(sent) == busy
    for got in sent.values():
        assert got == pytest.approx(2 * (n - 1) / n * GIB, rel=1e-6)
    pairs = {(f.src, f.dst) for f in dag.flows if f.size and (f.via_nic or f.src // N != f.dst // N)}
    assert sorted(pairs) == sorted(hops)
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    t_us = max(c.end_ns for c in sim.drain()) / 1000
    assert t_us == pytest.approx(float(choice["model_lat_us"]) + GIB * 2 * (n - 1) / n / (1000 * NODE_RING), rel=0.005)


def test_a_broadcast_chain_leaves_by_the_rings_entry_nics() -> None:
    """A ring broadcast from rank 2 runs the ring 0 3 2 1 4 ... opened at 2: its hops between sockets 1 -> 4,
    5 -> 8, 9 -> 12 and 13 -> 0 leave by GPUs 0, 4, 8 and 12 (the ring's entry NICs, not the chain's first GPU)."""
    topo = rail_optimized(2, N, 2)
    coll = Collective("broadcast", tuple(range(2 * N)), 64 << 20, "fp32", root=2)
    dag = decompose(coll, topo, AlgoOptions(nccl_env=nccl_env(P2P_OFF), algorithm="chain"))
    pairs = {(f.src, f.dst) for f in dag.flows if f.size and (f.via_nic or f.src // N != f.dst // N)}
    assert pairs == {(0, 4), (4, N), (N, N + 4), (N + 4, 0)}


@pytest.mark.parametrize("kind", ["all_to_all", "send_recv"])
def test_no_pxn_relay_with_p2p_off(kind: str) -> None:
    """Two whole hosts on SHM (NCCL_NET_DISABLE_INTRA=1), rail-aligned: with P2P on NVLink an all-to-all's
    cross-rail sends go by the GPU on the receiver's rail (PXN, 16 rail pairs); with P2P off each GPU sends from its
    own NIC: 8 x 8 x 2 = 128 host-crossing pairs, and a grouped send 3 -> 12 goes 3 -> 12, not through 4."""
    topo = rail_optimized(2, N, 2)
    ranks = tuple(range(2 * N))
    coll = (
        Collective("all_to_all", ranks, 1 << 24, "fp32")
        if kind == "all_to_all"
        else Collective("send_recv", (3, N + 4), 1 << 24, "fp32", comm=ranks)
    )
    want = {"all_to_all": (16, 2 * N * N), "send_recv": ({(4, N + 4)}, {(3, N + 4)})}[kind]
    for env, expect in (({"NCCL_P2P_LEVEL": "PXB"}, want[0]), (INTRA_OFF, want[1])):
        dag = decompose(coll, topo, _opts(env))
        pairs = {(f.src, f.dst) for f in dag.flows if f.size and f.src // N != f.dst // N}
        assert (len(pairs) if kind == "all_to_all" else pairs) == expect


def test_a_reduce_chain_leaves_by_the_rings_entry_nics() -> None:
    """A ring reduce to rank 2 runs the ring 0 3 2 1 4 ... from 1 on, toward 2 (reduce.h: each rank sends to
    ring->next): its hops between sockets 1 -> 4, 5 -> 8, 9 -> 12 and 13 -> 0 are ring hops, so they leave by GPUs 0, 4,
    8 and 12, the ring's entry NICs (before, the chain ran against the ring, 4 -> 3 ..., from each sender's own NIC)."""
    topo = rail_optimized(2, N, 2)
    coll = Collective("reduce", tuple(range(2 * N)), 64 << 20, "fp32", root=2)
    dag = decompose(coll, topo, AlgoOptions(nccl_env=nccl_env(P2P_OFF), algorithm="chain"))
    pairs = {(f.src, f.dst) for f in dag.flows if f.size and (f.via_nic or f.src // N != f.dst // N)}
    assert pairs == {(0, 4), (4, N), (N, N + 4), (N + 4, 0)}
    assert sum(f.size for f in dag.flows if f.via_nic) == 2 * (64 << 20)  # the hops 1 -> 4 and 9 -> 12


@pytest.mark.parametrize(
    ("env", "n"),
    [(P2P_OFF, 4), (INTRA_OFF, N)],  # a node a socket (4 GPUs), a node a host (8)
)
def test_the_shm_hops_run_each_node_from_its_first_gpu_backwards(env: dict[str, str], n: int) -> None:
    """1 GiB all-reduce over 16 H100s, P2P off: inside each NCCL node of n GPUs (first GPU f) the SHM hops are
    f -> f+n-1 -> ... -> f+1 (`shm_order.node_order`: search.cc `ncclTopoSearchNextGpuSort` tries the previous GPU
    first), and the hop to the next node leaves from f's NIC, the one the channel entered by; before, the hops ran
    f -> f+1 -> ... -> f+n-1."""
    topo = rail_optimized(2, N, 2)
    dag = decompose(Collective("all_reduce", tuple(range(2 * N)), GIB, "fp32"), topo, _opts(env))
    inside = {(f.src, f.dst) for f in dag.flows if f.size and f.src // n == f.dst // n}
    want = {(f + k, f + k - 1) for f in range(0, 2 * N, n) for k in range(2, n)} | {
        (f, f + n - 1) for f in range(0, 2 * N, n)
    }
    assert inside == want
    across = {(f.src, f.dst) for f in dag.flows if f.size and f.src // n != f.dst // n}
    assert across == {(f, (f + n) % (2 * N)) for f in range(0, 2 * N, n)}
