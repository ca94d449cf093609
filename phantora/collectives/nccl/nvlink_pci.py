"""NCCL's view of an NVLink host with P2P off (NCCL_P2P_DISABLE=1, NCCL_P2P_LEVEL=LOC): its PCIe tree.

NVIDIA/nccl v2.30.7-1 paths.cc: `ncclTopoCheckP2p` allows P2P up to the user's level; PATH_NVL is above PATH_LOC,
so no pair of GPUs runs P2P, and `ncclTopoComputePaths` diverts every GPU pair through the receiver's CPU
(`addInterStep`), where the SHM transport carries it. The ring search then runs over the PCIe and CPU links only.

phantora's NVLink topologies (`dgx_host`, the DGX hosts of the fabrics) have no PCIe tree, and their nodes and routes
stay as they are. Instead NCCL's platform gets a `PciHost` of a DGX-like layout: two sockets (one if the host has an
odd number of GPUs), GPUs two per PCIe switch in order, each GPU's x16 link at its PCIe generation (A100 Gen4, H100
/ H200 / B200 Gen5: `gpus.GpuSpec.host_bw`), the CPU model the topology's meta names (`cpu_model`, the generators'
parameter), else the DGX's of the GPU (`dgx_cpus.py`: A100 AMD Rome, H100 / H200 Sapphire Rapids, B200 Emerald
Rapids), else the hosts' vendor's default. NCCL's choice, its rating and the achieved rate come from that ring; the
flows still travel the topology's NVLink routes, paced at it: an approximation of the path, NCCL's rate. Send/recv
and all-to-all take their pairs' rates from the same host (`pci_p2p.py`).
"""

from __future__ import annotations

from phantora.collectives.nccl.cpu_vendor import vendor_named
from phantora.collectives.nccl.dgx_cpus import dgx_cpu_model
from phantora.collectives.nccl.pci_paths import CPU_MODELS, NVL, UNSET, PciHost, inter_cpu_bw
from phantora.collectives.nccl.settings import NcclSettings
from phantora.topology.model import Topology

GPUS_PER_SWITCH = 2  # a DGX's PCIe switches each hold two GPUs (and their NICs)
SOCKETS = 2


def p2p_off(st: NcclSettings | None) -> bool:
    """Whether the user's NCCL_P2P_DISABLE / NCCL_P2P_LEVEL put NVLink paths (PATH_NVL) above the P2P level."""
    return st is not None and st.p2p_level != UNSET and st.p2p_level < NVL


def host_pci(topo: Topology, nodes: list[int], gpu: str, link_bw: float, st: NcclSettings) -> PciHost:
    """The DGX-like PCIe host of a group of `gpu`s of one NVLink host, as NCCL sees it with P2P off."""
    host = topo.nodes[nodes[0]].host
    local = [n.id for n in topo.nodes if n.kind == "gpu" and n.host == host] if host is not None else list(nodes)
    sockets = SOCKETS if len(local) % SOCKETS == 0 else 1
    per_socket = len(local) // sockets
    index = [local.index(n) for n in nodes]
    model = dgx_cpu_model(gpu, topo.meta.get("cpu_model"), named_vendor(topo))
    return PciHost(
        sockets=tuple(k // per_socket for k in index),
        switched=True,
        cpu=CPU_MODELS[model][0],
        inter_cpu_bw=inter_cpu_bw(model),
        link_bw=link_bw,
        comm_gpus=len(nodes),
        p2p_level=st.p2p_level,
        shm=st.shm,
        switch_of=tuple(k // per_socket * per_socket + k % per_socket // GPUS_PER_SWITCH for k in index),
    )


def named_vendor(topo: Topology) -> str | None:
    """The hosts' CPU vendor the topology's meta "cpu" names (`cpu_vendor.vendor_named`: intel, amd or arm), None if
    it has none."""
    return vendor_named(topo.meta.get("cpu"))
