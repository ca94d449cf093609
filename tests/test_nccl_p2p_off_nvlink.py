"""NCCL_P2P_DISABLE=1 (or NCCL_P2P_LEVEL=LOC) on NVLink hosts: NCCL's ring over the PCIe and CPU links.

NVIDIA/nccl v2.30.7-1 paths.cc: `ncclTopoCheckP2p` finds the NVL path above the LOC level, so no pair runs P2P;
`ncclTopoComputePaths` diverts each pair through the receiver's CPU (SHM). search.cc then searches the ring over the
PCIe links, a PATH_PHB hop through an Intel CPU taking 6/5 off its PCIe links (INTEL_P2P_OVERHEAD). phantora lays
the host out as a DGX (phantora/collectives/nccl/nvlink_pci.py): two sockets, GPUs two per PCIe switch, x16 at the
GPU's generation (NCCL: width x speed / 80: Gen4 24, Gen5 48 GB/s), and the DGX's CPUs by GPU unless the topology
names a `cpu_model` (dgx_cpus.py, from NVIDIA's DGX data sheets): A100 2x AMD EPYC 7742 (AMD_BW 16 between the
sockets), H100 / H200 2x Xeon 8480C (Sapphire Rapids, SRP_QPI_BW 22), B200 2x Xeon 8570 (Emerald Rapids, ERP_QPI_BW
40); a named vendor whose DGX CPU differs takes its default (Intel: Skylake, SKL_QPI_BW 10).

The ring 0..7: GPUs 0,1 | 2,3 on socket 0's switches, 4,5 | 6,7 on socket 1's. Hop 0->1 climbs switch 0 to CPU 0 and
comes back down (PHB), hop 1->2 climbs switch 0 and comes down switch 1 (PHB), hop 3->4 crosses the CPU link (SYS).
So switch 0's uplink carries hops 0->1 and 1->2, 2 x 6/5 = 2.4 GB/s per GB/s of ring on Intel (2 on AMD), and each
direction of the CPU link one hop.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import choose
from phantora.collectives.nccl.channels import ring_graph
from phantora.collectives.nccl.pci_paths import ring_capacity
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host, rail_optimized

N = 8
GEN4, GEN5 = 16 * 120 / 80.0, 16 * 240 / 80.0  # ncclTopoAddPci: width x speed / 80
SKL, SPR, ERP, AMD = 10.0, 22.0, 40.0, 16.0  # topo.h SKL_QPI_BW, SRP_QPI_BW, ERP_QPI_BW, AMD_BW
INTEL = 6 / 5
UPLINK_HOPS = 2  # ring hops climbing one switch's uplink
LAT_US = 8.4 + 2 * (N - 1) * 5.7  # tuning.cc: ring Simple base + NCCL_HW_PCI hops (all-reduce: 2 (n - 1))


def _opts(**env: str) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env(env))


@pytest.mark.parametrize(
    ("gpu", "cpu", "cpu_model", "cap", "graph"),
    [
        # SPR: uplink 48 / 2.4 = 20 < 22: cap 20; hopper's 40, 30, 24 do not fit, 20 fits once; 15, 12, 11 once, then
        # 6 / 20 < .49
        ("h100", None, None, min(GEN5 / (UPLINK_HOPS * INTEL), SPR), (1, 20.0)),
        ("h200", None, None, min(GEN5 / (UPLINK_HOPS * INTEL), SPR), (1, 20.0)),
        # ERP: 20 < 40; blackwell's 45 .. 24 do not fit, 20, 19, 18 once each
        ("b200", None, None, min(GEN5 / (UPLINK_HOPS * INTEL), ERP), (1, 20.0)),
        # AMD Rome: no 6/5, uplink 24 / 2 = 12 < 16: 12 once; 10, 9, 7, 6 (2 x 6 only equals it), then 5 / 12 < .49
        ("a100", None, None, min(GEN4 / UPLINK_HOPS, AMD), (1, 12.0)),
        ("a100", "amd", None, min(GEN4 / UPLINK_HOPS, AMD), (1, 12.0)),
        # Intel named on an A100 host: Skylake; uplink 24 / 2.4 = 10 = CPU link: ampere's 10 fits once; 9, 7, 6, 5
        # (2 x 5 only equals it), then 4 / 10 < .49
        ("a100", "intel", None, min(GEN4 / (UPLINK_HOPS * INTEL), SKL), (1, 10.0)),
        # overridden: Skylake's 10 under H100s: 6 is the first to fit (1 channel), 3 / 6 > .49 and 3 x 3 = 9 beats it
        ("h100", None, "skl", min(GEN5 / (UPLINK_HOPS * INTEL), SKL), (3, 3.0)),
        # overridden to AMD: uplink 48 / 2 = 24, the CPU link 16 binds; 15 fits once, 12 / 15 > .49 once; then 11, 6
        ("h100", None, "zen", min(GEN5 / UPLINK_HOPS, AMD), (1, 15.0)),
    ],
)
def test_the_ring_search_runs_over_the_pcie_and_cpu_links(
    gpu: str, cpu: str | None, cpu_model: str | None, cap: float, graph: tuple[int, float]
) -> None:
    for env in ({"NCCL_P2P_DISABLE": "1"}, {"NCCL_P2P_LEVEL": "LOC"}):
        topo = dgx_host(N, gpu=gpu, cpu=cpu, cpu_model=cpu_model)
        p = platform_of(topo, tuple(range(N)), settings_from_env(env))
        assert p.pci is not None and (p.intra, p.nvswitch) == ("pci", False)
        assert ring_capacity(p.pci)[0] == pytest.approx(cap)
        g = ring_graph(p)
        assert (g.nchannels, g.bw_intra) == graph


@pytest.mark.parametrize(
    ("gpu", "busbw"),
    [("h100", min(GEN5 / (UPLINK_HOPS * INTEL), SPR)), ("a100", min(GEN4 / UPLINK_HOPS, AMD))],
)
def test_all_reduce_1gib_at_nccls_pcie_ring(gpu: str, busbw: float) -> None:
    """8 GPUs of a DGX, NCCL_P2P_DISABLE=1 (and NCCL_NVLS_ENABLE=0: on H100 NVLS stays on with P2P off,
    tests/test_nccl_nvls_p2p_off.py): Ring / Simple on 2 x 1 channels (connectRings doubles), every hop SHM, the
    farthest path SYS; 1 GiB runs at the one channel's bus bandwidth through the flow engine (H100: the switch
    uplinks' 20 under SPR's 22; A100: the uplinks' 12 under AMD's 16), though its flows travel the NVLink routes."""
    topo = dgx_host(N, gpu=gpu)
    size = 1 << 30
    opts = _opts(NCCL_P2P_DISABLE="1", NCCL_NVLS_ENABLE="0")
    dag = decompose(Collective("all_reduce", tuple(range(N)), size, "fp32"), topo, opts)
    choice = dag.choice or {}
    assert (choice["algorithm"], choice["protocol"], choice["channels"]) == ("Ring", "Simple", 2)
    assert choice["transport"] == {"SHM": N} and choice["path"] == "SYS"
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    t_ns = max(c.end_ns for c in sim.drain())
    assert t_ns / 1000 == pytest.approx(LAT_US + size / (1000 * busbw * N / (2 * (N - 1))), rel=0.005)


@pytest.mark.parametrize("env", [{}, {"NCCL_P2P_LEVEL": "NVL"}, {"NCCL_P2P_DISABLE": "0"}])
def test_p2p_on_keeps_nvlink(env: dict[str, str]) -> None:
    p = platform_of(dgx_host(N, gpu="h100"), tuple(range(N)), settings_from_env(env))
    assert (p.intra, p.nvswitch, p.pci) == ("nvlink", True, None)


def test_one_host_of_a_rail_fabric_and_across_hosts() -> None:
    """With NCCL_NET_DISABLE_INTRA=1 (no NET between GPUs of one host: test_nccl_net_intra.py has the default), a
    communicator inside one DGX host of a rail fabric gets the PCIe ring, its host's GPUs counted from 0; one across
    hosts runs each host as one NCCL node on SHM (tests/test_nccl_shm_hosts.py)."""
    topo = rail_optimized(2, N, 2)
    st = settings_from_env({"NCCL_P2P_DISABLE": "1", "NCCL_NET_DISABLE_INTRA": "1"})
    second = platform_of(topo, tuple(range(N, 2 * N)), st).pci
    assert second is not None and second.sockets == (0,) * 4 + (1,) * 4
    coll = Collective("all_reduce", tuple(range(2 * N)), 1 << 20, "fp32")
    got = choose(coll, topo, _opts(NCCL_P2P_DISABLE="1", NCCL_NET_DISABLE_INTRA="1", NCCL_NVLS_ENABLE="0"))
    assert got is not None and dict(got.transport or ()) == {"NET": 2, "SHM": 2 * N - 2}
