"""P2P off on NVLink hosts with NICs where NCCL keeps every pair inside a host on SHM, across hosts (net_split.py).

NVIDIA/nccl v2.30.7-1: with `NCCL_NET_DISABLE_INTRA=1`, or NICs no faster than the CPU link (paths.cc
`ncclTopoCheckNet`: `min(x16, NIC) > min(x16, inter-CPU)` fails, e.g. 100G NICs, 12.5 GB/s, against Sapphire Rapids'
22), no pair of one host runs NET: each host is one NCCL node, SHM between its GPUs (through the receiver's CPU), NET
between hosts. search.cc: each ring channel enters the host's first GPU from its NIC, goes on to each GPU's previous (an
NVSwitch is in the system: `ncclTopoSearchNextGpuSort`, nccl/shm_order.py: 0, 7, ..., 1), and leaves the last GPU for
the NIC it entered from (crossNic 0). On the DGX-like layout (GPUs two per PCIe switch, Gen5 x16 = 48 GB/s, 6/5 on
Intel's PCIe links of a PHB path) switch 1's uplink carries hops 3->2 and 2->1 up, 2 x 6/5: 48 / 2.4 = 20 GB/s; the CPU
link carries one hop each way (22). On A100 (AMD, no 6/5): 24 / 2 = 12, under AMD's 16. A channel is at most the NIC's
rate (`ncclTopoSearchRecNet`: `net->net.bw < bw`), and `ncclTopoCompute` lowers the speed only while the next is above
.49 of the best found.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.channels import ring_graph
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import rail_optimized

N = 8
GIB = 1 << 30
INTEL = 6 / 5
H100_RING = 16 * 240 / 80.0 / (2 * INTEL)  # Gen5 x16 48 GB/s over switch 0's uplink: 20
A100_RING = 16 * 120 / 80.0 / 2  # Gen4 x16 24 GB/s, AMD: 12
# NVLS, which P2P off leaves on (tests/test_nccl_nvls_p2p_off.py), off: these tests check the ring over the hosts
INTRA_OFF = {"NCCL_P2P_DISABLE": "1", "NCCL_NET_DISABLE_INTRA": "1", "NCCL_NVLS_ENABLE": "0"}
P2P_OFF = {"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}


def _opts(env: dict[str, str]) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env(env))


def _end_us(topo: object, flows: list) -> float:
    sim = FlowSimulator(topo)  # type: ignore[arg-type]
    sim.submit(flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000


def _ring_us(choice: dict, n: int, busbw: float) -> float:
    return float(choice["model_lat_us"]) + GIB * 2 * (n - 1) / n / (1000 * busbw)


@pytest.mark.parametrize(
    ("kw", "env", "ring", "nic"),
    [
        ({}, INTRA_OFF, H100_RING, 50.0),
        ({"nic_rate": "100Gbps", "gpu": "a100"}, P2P_OFF, A100_RING, 12.5),
    ],
)
def test_each_host_is_one_node_at_its_shm_ring(kw: dict, env: dict[str, str], ring: float, nic: float) -> None:
    """2 hosts: 2 NCCL nodes of 8, no NVSwitch, the node ring's rate; one channel of min(ring, NIC) (12 is on both
    speed lists and under 12.5)."""
    topo = rail_optimized(2, N, 2, **kw)
    p = platform_of(topo, tuple(range(2 * N)), settings_from_env(env))
    assert (p.nnodes, p.ppn, p.intra, p.nvswitch, p.pci) == (2, N, "pci", False, None)
    assert (p.node_bw, p.nic_bw) == (pytest.approx(ring), nic)
    g = ring_graph(p)
    assert (g.nchannels, g.bw_intra) == (1, pytest.approx(min(ring, nic)))


def test_all_reduce_crosses_hosts_once_each_way_at_the_node_ring() -> None:
    """1 GiB over 16 H100s with NCCL_NET_DISABLE_INTRA=1: 14 SHM hops (NVLink routes, NCCL's rate) and 2 NET hops. Both
    channels run the one ring found, 0 7 ... 1 then 8 15 ... 9 (crossNic 0: no alternating rings, connect.cc), whose
    hops 1 -> 8 and 9 -> 0 leave by the NIC their host was entered by (GPU 0's, GPU 8's: nccl/ring_nics.py), each
    sending 2 (n - 1) / n of the buffer through rail 0's NICs (none through the other 7 rails), no hop keyed through the
    NICs inside a host; the bus bandwidth is the node ring's 20 GB/s."""
    topo = rail_optimized(2, N, 2)
    n = 2 * N
    dag = decompose(Collective("all_reduce", tuple(range(n)), GIB, "fp32"), topo, _opts(INTRA_OFF))
    choice = dag.choice or {}
    assert (choice["algorithm"], choice["protocol"]) == ("Ring", "Simple")
    assert choice["transport"] == {"NET": 2, "SHM": 14} and choice["path"] == "NET"
    assert not any(f.via_nic for f in dag.flows)
    host = {g: topo.nodes[g].host for g in range(n)}
    sent: dict[tuple[int, int], int] = {}
    for f in dag.flows:
        if host[f.src] != host[f.dst]:
            sent[f.src, f.dst] = sent.get((f.src, f.dst), 0) + f.size
    assert sorted(sent) == [(0, N), (N, 0)]
    for got in sent.values():
        assert got == pytest.approx(2 * (n - 1) / n * GIB, rel=1e-6)
    assert _end_us(topo, dag.flows) == pytest.approx(_ring_us(choice, n, H100_RING), rel=0.005)


def test_nic_bound_channels_step_down_as_nccls_search() -> None:
    """H100 on 100G NICs (12.5 GB/s, no faster than SPR's 22: SHM kept): a channel is at most 12.5. sm90's inter
    speeds: 12 gives 1 channel (the node ring's 20 holds one), 6 gives 3 (18), 3 gives 6 (18, not more), and 2.4 is
    below .49 of 6: 3 channels of 6, an 18 GB/s ring, at 1 GiB."""
    topo = rail_optimized(2, N, 2, nic_rate="100Gbps")
    p = platform_of(topo, tuple(range(2 * N)), settings_from_env(P2P_OFF))
    g = ring_graph(p)
    assert (g.nchannels, g.bw_intra) == (3, 6.0)
    dag = decompose(Collective("all_reduce", tuple(range(2 * N)), GIB, "fp32"), topo, _opts(P2P_OFF))
    assert _end_us(topo, dag.flows) == pytest.approx(_ring_us(dag.choice or {}, 2 * N, 18.0), rel=0.005)


def test_a_slow_cpu_link_bounds_the_node_ring() -> None:
    """Skylake's 10 GB/s between the sockets, crossed once each way by a channel: the node ring carries 10."""
    p = platform_of(rail_optimized(2, N, 2, cpu_model="skl"), tuple(range(2 * N)), settings_from_env(INTRA_OFF))
    assert p.node_bw == pytest.approx(10.0)
