"""NVLS and NVLS-Tree stay on with P2P off (NCCL_P2P_DISABLE=1, NCCL_P2P_LEVEL=LOC) on NVSwitch hosts.

NVIDIA/nccl v2.19.4-1 to v2.30.7-1: transport/nvls.cc `ncclNvlsInit` reads NCCL_NVLS_ENABLE, the (trimmed) system's
GPU count and the GPU's multicast support, no P2P setting; search.cc's NVLS pattern (`ncclTopoSearchTryNvls`)
follows the NVSwitch <-> GPU paths, which P2P off leaves on NVLink (paths.cc diverts GPU -> GPU paths only,
`addInterStep`); init.cc turns NVLS off only where that graph has no channel; tuning.cc disables NVLS across nodes
(no CollNet) and NVLS-Tree on one node, and takes each algorithm's latency from its own graph's links (`intraHw[a]`:
NVLink for NVLS). The multicast group is the NCCL node's ranks (`comm->localRanks` of `nodeRanks`). So one H100 host
runs NVLS with P2P off as with P2P on, and NCCL's nodes over sockets or hosts (net_split.py) run NVLS-Tree.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import choose
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host, rail_optimized
from phantora.topology.model import Topology

N = 8
GIB = 1 << 30
H100_NVLINK = 18 * 20.6  # 18 NVLink4 links at NCCL's sm90 per-link 20.6 GB/s
NVLS_EFF = 0.85  # tuning.cc nvlsEfficiency, sm90
P2P_OFF = {"NCCL_P2P_DISABLE": "1"}


def _opts(env: dict[str, str]) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env(env))


def _end_us(topo: object, flows: list) -> float:
    sim = FlowSimulator(topo)  # type: ignore[arg-type]
    sim.submit(flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000


@pytest.mark.parametrize("env", [P2P_OFF, {"NCCL_P2P_LEVEL": "LOC"}])
def test_one_host_runs_nvls_as_with_p2p_on(env: dict[str, str]) -> None:
    """8 H100s of a DGX: the PCIe view for the ring (no NVSwitch, 48 GB/s), NVLS on the NVLink; 1 GiB all-reduce on
    NVLS at its kernel's 370.8 x 0.85 x 8 / 9 = 280.16 GB/s, the same flows and time as with P2P on."""
    topo = dgx_host(N, gpu="h100")
    p = platform_of(topo, tuple(range(N)), settings_from_env(env))
    assert (p.intra, p.nvswitch, p.nvls_fabric) == ("pci", False, True)
    assert p.nvls_bw == pytest.approx(H100_NVLINK)
    coll = Collective("all_reduce", tuple(range(N)), GIB, "fp32")
    got = choose(coll, topo, _opts(env))
    assert got is not None and (got.algorithm, got.protocol) == ("nvls", "Simple")
    assert got.algbw == pytest.approx(H100_NVLINK * NVLS_EFF * N / (N + 1), rel=1e-6)
    off, on = decompose(coll, topo, _opts(env)), decompose(coll, topo, AlgoOptions())
    assert sorted((f.src, f.dst, f.size) for f in off.flows) == sorted((f.src, f.dst, f.size) for f in on.flows)
    assert _end_us(topo, off.flows) == pytest.approx(_end_us(topo, on.flows), rel=1e-9)


@pytest.mark.parametrize(
    ("gpu", "env"),
    [("h100", {**P2P_OFF, "NCCL_NVLS_ENABLE": "0"}), ("a100", P2P_OFF)],
)
def test_without_nvls_the_pcie_ring_runs(gpu: str, env: dict[str, str]) -> None:
    """NCCL_NVLS_ENABLE=0, or an A100 (no NVLS before sm90): the ring over the PCIe and CPU links, every hop SHM."""
    topo = dgx_host(N, gpu=gpu)
    got = choose(Collective("all_reduce", tuple(range(N)), GIB, "fp32"), topo, _opts(env))
    assert got is not None and got.algorithm == "ring"
    assert dict(got.transport or ()) == {"SHM": N}


@pytest.mark.parametrize(
    ("env", "block"),
    [(P2P_OFF, 4), ({**P2P_OFF, "NCCL_NET_DISABLE_INTRA": "1"}, N)],
)
def test_nccl_nodes_of_a_fabric_run_nvls_tree(env: dict[str, str], block: int) -> None:
    """2 rail-fabric hosts, 1 GiB all-reduce: NVLS-Tree over NCCL's nodes (the sockets, or with
    NCCL_NET_DISABLE_INTRA=1 the hosts): NVLS inside each node (flows between GPUs of one node, on the NVSwitch) and
    the trees between nodes through the NICs (every flow between nodes keyed through them or across hosts)."""
    topo = rail_optimized(2, N, 2)
    ranks = tuple(range(2 * N))
    p = platform_of(topo, ranks, settings_from_env(env))
    assert (p.nnodes, p.ppn, p.nvls_fabric) == (2 * N // block, block, True)
    dag = decompose(Collective("all_reduce", ranks, GIB, "fp32"), topo, _opts(env))
    assert (dag.choice or {})["algorithm"] == "NVLSTree"
    flows = [f for f in dag.flows if f.size and f.src != f.dst]
    inside = [f for f in flows if f.src // block == f.dst // block]
    apart = [f for f in flows if f.src // block != f.dst // block]
    assert inside and apart
    assert not any(f.via_nic for f in inside)
    assert all(f.via_nic or f.src // N != f.dst // N for f in apart)


def test_hosts_without_nics_are_refused_in_one_line() -> None:
    """Two hosts of 4 GPUs on one NVLink domain (an NVSwitch of no host, as a multi-node NVLink rack) whose GPUs have
    no NIC: with P2P off NCCL joins the hosts by NET (its RDMA NICs, else its socket transport over the hosts' IP
    interfaces), which the topology gives these GPUs no link for: a one-line error naming the variable."""
    topo = Topology("nvl-no-nics", gpu_model="h100")
    switch = topo.add_node("nvswitch")
    for h in range(2):
        for _ in range(4):
            topo.add_link(topo.add_node("gpu", host=h), switch, 3_600_000_000_000, 100)
    coll = Collective("all_reduce", tuple(range(8)), 1 << 20, "fp32")
    assert choose(coll, topo.validate(), AlgoOptions()) is not None  # P2P on: NVLink across the hosts
    with pytest.raises(InputError) as err:
        choose(coll, topo, _opts(P2P_OFF))
    assert err.value.field == "NCCL_P2P_DISABLE" and "no network link" in str(err.value)
    assert "\n" not in str(err.value)
