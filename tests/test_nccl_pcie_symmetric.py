"""Symmetric windows (`-R 2`) on PCIe hosts against NCCL's rule, restated from its code (init.cc, transport.cc
`ncclTransportCheckP2pType`, v2.27.3-1 .. v2.28.9-1), not read back from the code under test:

- 2.27.x - 2.28.3: `symmetricSupport = isAllDirectP2p && nNodes == 1`, every pair of GPUs on P2P at NCCL's level
  (PXB by default: under one PCIe switch); a pair on SHM (through a CPU) and NCCL runs its legacy algorithms;
- 2.28.7 - 2.28.9: `isAllCudaP2p`, CUDA's peer capability, not in a topology: refused;
- 2.29+: the symmetric kernels need a direct NVLink between every pair (`isAllDirectNvlink`): legacy.
With support, NCCL's picker (the same constants as on NVLink; no multicast without NVLS) picks the kernel, and
its bytes cross the PCIe switch: an all-gather's `AllGather_ST` stores a rank's part S/n to each of the n - 1
peers, so each GPU's x16 link (32 GB/s each way on an A100 PCIe) carries (n - 1) S / n out and in.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology import pcie_host

MiB = 1 << 20
SWITCH = pcie_host(4, sockets=1, pcie_switch=True, gpu="a100-pcie")  # PIX between every pair
RANKS = (0, 1, 2, 3)
PCIE_BPS = 32e9  # the A100 PCIe card's Gen4 x16 link, each way
PCI_SIMPLE_HOP_US = 5.7  # tuning.cc hwLat[NCCL_HW_PCI][NCCL_ALGO_RING][NCCL_PROTO_SIMPLE]


def dag_of(kind: str, nbytes: int, topo=SWITCH, ranks=RANKS, **env: str):
    env = {"PHANTORA_NCCL_REGISTER": "2", **env}
    coll = Collective(kind, ranks, nbytes, "fp32", alltoall_api=kind == "all_to_all")  # ncclAlltoAll
    return decompose(coll, topo, AlgoOptions(nccl_env=nccl_env(env)))


@pytest.mark.parametrize("version", ["2.27", "2.28.3"])
def test_one_switch_runs_the_symmetric_kernels_unicast(version: str) -> None:
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        c = dag_of(kind, 64 * MiB, PHANTORA_NCCL_VERSION=version).choice or {}
        assert c["algorithm"] == "sym" and not c["kernel"].endswith("MC"), (kind, c)


def test_a_symmetric_all_gather_is_bound_by_each_gpus_pcie_link() -> None:
    """64 MiB gathered on 4 GPUs: 3 x 16 MiB out of each GPU's link at 32 GB/s, far slower than the picker's
    estimate (its NVLink-era constants): the link binds."""
    dag = dag_of("all_gather", 64 * MiB, PHANTORA_NCCL_VERSION="2.28.3")
    c = dag.choice or {}
    assert c["kernel"] == "AllGather_ST"
    assert all(f.size == 16 * MiB for f in dag.flows) and len(dag.flows) == 12
    sim = FlowSimulator(SWITCH)
    sim.submit(dag.flows, at=0)
    end_us = max(x.end_ns for x in sim.drain()) / 1000
    assert end_us == pytest.approx(3 * 16 * MiB / PCIE_BPS * 1e6, rel=0.01)
    assert c["model_time_us"] < end_us / 5


@pytest.mark.parametrize(
    ("topo", "env"),
    [
        (pcie_host(4, sockets=1, pcie_switch=False, gpu="a100-pcie"), {}),  # PHB: beyond PXB, SHM
        (pcie_host(4, sockets=2, pcie_switch=True, gpu="a100-pcie"), {}),  # a SYS pair
        (SWITCH, {"NCCL_P2P_DISABLE": "1"}),
        (SWITCH, {"PHANTORA_NCCL_VERSION": "2.29.2"}),  # isAllDirectNvlink
        (SWITCH, {"PHANTORA_NCCL_VERSION": "2.30"}),
    ],
)
def test_nccl_runs_its_legacy_algorithms_where_a_pair_is_not_p2p(topo, env: dict[str, str]) -> None:
    env = {"PHANTORA_NCCL_VERSION": "2.28.3", **env}
    assert (dag_of("all_gather", 64 * MiB, topo, **env).choice or {})["algorithm"] != "sym"


def test_p2p_level_sys_gives_two_sockets_symmetric_support() -> None:
    two = pcie_host(4, sockets=2, pcie_switch=True, gpu="a100-pcie")
    c = dag_of("all_gather", 64 * MiB, two, PHANTORA_NCCL_VERSION="2.28.3", NCCL_P2P_LEVEL="SYS").choice or {}
    assert c["algorithm"] == "sym"


def test_2_28_7_on_pcie_is_refused_naming_the_version() -> None:
    with pytest.raises(InputError, match="isAllCudaP2p") as got:
        dag_of("all_gather", 64 * MiB, PHANTORA_NCCL_VERSION="2.28.7")
    assert got.value.field == "PHANTORA_NCCL_VERSION"


def test_copy_engines_on_one_pcie_switch_under_2_28_3() -> None:
    """NCCL_CTA_POLICY=2 (2.28.3, symmetric support by NCCL's P2P level): the copy engines over P2P, two syncs at
    NCCL's PCI hop; from 2.28.7 the support rests on CUDA's capability: refused."""
    c = dag_of("all_to_all", 64 * MiB, PHANTORA_NCCL_VERSION="2.28.3", NCCL_CTA_POLICY="2").choice or {}
    assert (c["algorithm"], c["ce_syncs"]) == ("ce", 2)
    assert c["model_lat_us"] == pytest.approx(2 * PCI_SIMPLE_HOP_US)
    with pytest.raises(InputError, match="isAllCudaP2p"):
        dag_of("all_to_all", 64 * MiB, PHANTORA_NCCL_VERSION="2.30", NCCL_CTA_POLICY="2")


@pytest.mark.slow
@pytest.mark.ns3
def test_packet_mode_carries_the_symmetric_kernels_bytes_over_pcie(ns3_lib) -> None:
    """The 2.28.3 symmetric all-gather of 16 MiB on one PCIe switch through ns-3: exactly the mesh's 12 x 4 MiB,
    ending no sooner than the flow network at the packets' goodput (a fluid bound) and within 5% of it
    (2026-12-01: 437.90 against 418.89 µs, each GPU's link taking 3 peers' packets at once)."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.report import nccl_tests as nt

    test = nt.find_test("all_gather_perf")
    nbytes = nt.counts(test, 16 * MiB, 4, 4)[2]
    env = nccl_env({"PHANTORA_NCCL_REGISTER": "2", "PHANTORA_NCCL_VERSION": "2.28.3"})
    it = nt.build_iteration(test, RANKS, nbytes, "fp32", 0, SWITCH, AlgoOptions(nccl_env=env), 0, "t")
    assert it.choice is not None and it.choice["algorithm"] == "sym"
    wire = sum(f.size for f in it.flows)
    assert wire == 12 * 4 * MiB
    ns3 = make_engine(EngineSpec(network="ns3"), SWITCH)
    t_ns3 = nt.run_iteration(ns3, it)
    assert int(str(ns3.stats()["payload_bytes_delivered"])) == wire
    t_flow = nt.run_iteration(make_engine(EngineSpec(network="flow", flow_goodput=True), SWITCH), it)
    assert t_flow <= t_ns3 <= 1.05 * t_flow
