"""Send/recv and all-to-all inside NCCL nodes of NVLink fabric hosts with P2P off (node_p2p.py).

With NCCL_P2P_DISABLE=1 a fabric host's NCCL nodes are its sockets (NET between them, net_split.py) or, with
NCCL_NET_DISABLE_INTRA=1, the host. A pair inside a node runs SHM (shm.cc, the buffer on the receiver's side):
up the sender's x16 and its PCIe switch's uplink to the CPU, across the CPU link between sockets, down the
receiver's (paths.cc addInterStep). On the DGX-like layout (two GPUs a switch, Gen5 x16 and uplinks 48 GB/s,
Sapphire Rapids' 22 between the sockets) the pairs of one call share those links max-min fairly, as pci_p2p.py
rates one host's (before: a share of the GPU's x16, 48 / 3 = 16 each in an 8-GPU all-to-all). A pair between NCCL
nodes runs NET through the GPUs' own NICs under their switches, by GPU Direct RDMA (paths.cc ncclTopoCheckGdr: PIX,
GDR reads on from sm80): its bytes share the sender's x16 up and the receiver's x16 down with the SHM pairs.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import choose
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.report import nccl_tests as nt
from phantora.topology import rail_optimized

N = 8
GEN5 = 16 * 240 / 80.0  # 48 GB/s
GEN4 = 16 * 120 / 80.0  # 24 GB/s
SPR = 22.0
P2P_OFF = {"NCCL_P2P_DISABLE": "1"}


def _opts(env: dict[str, str]) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env(env))


@pytest.mark.parametrize(("gpu", "x16"), [("h100", GEN5), ("a100", GEN4)])
def test_all_to_all_pairs_share_their_gpus_x16(gpu: str, x16: float) -> None:
    """8 GPUs of one host (H100 on 400G, A100 on 200G: the sockets are NCCL nodes): each GPU's x16 carries its 3
    SHM blocks to its socket peers and its 4 NET blocks to the other socket's NICs, 7 pairs each way: x16 / 7 each
    (6.86 and 3.43 GB/s; a switch's uplink, 6 SHM pairs, would allow x16 / 6), and the flows of the SHM pairs end
    at their block over it (before the NET pairs were counted: x16 / 6)."""
    topo = rail_optimized(1, N, 2, gpu=gpu, nic_rate="400Gbps" if gpu == "h100" else "200Gbps")
    size = 1 << 28
    coll = Collective("all_to_all", tuple(range(N)), size, "fp32")
    got = choose(coll, topo, _opts(P2P_OFF))
    assert got is not None and dict(got.transport) == {"NET": 32, "SHM": 24}
    rates = {(a, b): r for a, b, r in got.pair_bw}
    assert sorted(rates) == sorted((a, b) for a in range(N) for b in range(N) if a != b)
    assert list(rates.values()) == [pytest.approx(x16 / 7)] * len(rates)
    dag = decompose(coll, topo, _opts(P2P_OFF))
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    ends: dict[tuple[int, int], int] = {}
    for c in sim.drain():
        if c.src // 4 == c.dst // 4:
            ends[c.src, c.dst] = max(ends.get((c.src, c.dst), 0), c.end_ns)
    block_us = size / N / (1000 * x16 / 7)
    assert max(ends.values()) / 1000 == pytest.approx(got.lat_us + block_us, rel=0.01)
    caps: dict[tuple[int, int], float] = {}
    for f in dag.flows:  # a NET pair's flows (one a channel) too are capped at its x16 share in all
        if f.size and f.src // 4 != f.dst // 4:
            caps[f.src, f.dst] = caps.get((f.src, f.dst), 0.0) + f.rate_bps / 8e9
    assert len(caps) == 2 * 4 * 4 and list(caps.values()) == [pytest.approx(x16 / 7)] * len(caps)


def test_shm_hosts_all_to_all_shares_the_cpu_link() -> None:
    """16 H100s on 2 hosts with NCCL_NET_DISABLE_INTRA=1 (each host one NCCL node): a host's 4 x 4 cross-socket
    pairs share each direction of the CPU link, 22 / 16 each; a GPU's x16 then carries its 4 of them and its 11
    other blocks (3 same-socket SHM, 8 NET to the other host): (48 - 4 x 22 / 16) / 11 each (before the NET pairs
    were counted, switch 0's uplink bound the same-socket ones at (48 - 8 x 22 / 16) / 6)."""
    topo = rail_optimized(2, N, 2)
    got = choose(
        Collective("all_to_all", tuple(range(2 * N)), 1 << 28, "fp32"),
        topo,
        _opts({**P2P_OFF, "NCCL_NET_DISABLE_INTRA": "1"}),
    )
    assert got is not None
    rates = {(a, b): r for a, b, r in got.pair_bw}
    assert len(rates) == 2 * N * (2 * N - 1)
    cross = SPR / 16
    for (a, b), r in rates.items():
        socket_apart = a // N == b // N and a % N // 4 != b % N // 4
        assert r == pytest.approx(cross if socket_apart else (GEN5 - 4 * cross) / 11)


def test_sendrecv_perfs_socket_pairs_share_the_uplinks() -> None:
    """nccl-tests' sendrecv on one host's 8 H100s, one NCCL group: 0 -> 1 and 1 -> 2 both climb switch 0's uplink,
    24 GB/s each (rated alone before: 48); 3 -> 4 and 7 -> 0 go NET."""
    topo = rail_optimized(1, N, 2)
    size = 1 << 28
    it = nt.build_iteration(
        nt.find_test("sendrecv_perf"), tuple(range(N)), size, "fp32", 0, topo, _opts(P2P_OFF), 0, "sr"
    )
    assert it.choice is not None and it.choice["peer_bw_gbs"] == pytest.approx(GEN5 / 2)


def test_a_group_whose_pairs_start_apart_shares_the_uplink_from_the_later_start() -> None:
    """A grouped send/recv 0 -> 1 of 96 MB with 1 -> 2 of the same group starting 1 ms later (8 H100s of one host,
    P2P off): 0 -> 1 runs alone at 48 GB/s for 1 ms (48 MB), then both climb switch 0's uplink at 24 until 0 -> 1
    ends at 3 ms: 96 MB / 3 ms = 32 GB/s (rated all at once: 24)."""
    topo = rail_optimized(1, N, 2)
    size = 96_000_000
    comm = tuple(range(N))
    base = Collective("send_recv", (0, 1), size, "fp32", None, comm, ((0, 1), (1, 2)))
    late = Collective("send_recv", (0, 1), size, "fp32", None, comm, ((0, 1), (1, 2)), ((1, 2, 1_000_000, size),))
    together = choose(base, topo, _opts(P2P_OFF))
    apart = choose(late, topo, _opts(P2P_OFF))
    assert together is not None and together.peer_bw == pytest.approx(GEN5 / 2)
    assert apart is not None and apart.peer_bw == pytest.approx(size / 3e6)
