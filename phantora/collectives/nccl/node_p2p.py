"""Send/recv and all-to-all on NCCL nodes of NVLink hosts with P2P off (net_split.py): each pair's share of the
hosts' PCIe and CPU links, as `pci_p2p.py` gives them on one host.

With NCCL_P2P_DISABLE=1 (or NCCL_P2P_LEVEL=LOC) on a fabric host, NCCL's nodes are its sockets (NET between them)
or, where no pair goes NET, the whole host. A pair inside a node runs SHM (shm.cc, its buffer on the receiver's
side): the bytes climb the sender's x16 link and its PCIe switch's uplink to the CPU, cross the inter-CPU link when
the sockets differ, and come down the receiver's (`pci_paths.hop_links` on `nvlink_pci.host_pci`'s DGX-like
layout). A pair between nodes runs NET through each GPU's own NIC (p2p: `ncclTopoGetNetDev` without a graph; no PXN
with P2P off, pxn.py), which sits under the GPU's PCIe switch, so GPU Direct RDMA reads and writes the GPU's memory
(paths.cc `ncclTopoCheckGdr`: PIX is within NCCL_NET_GDR_LEVEL's PXB, and GDR reads are on from sm80,
v2.19.4-1 to v2.30.7-1): its bytes cross the sender's x16 up and the receiver's x16 down, beside the SHM pairs'.
All the pairs of one call (an all-to-all's, or a grouped send/recv's pairs in flight) share those links by max-min
fairness (`pci_p2p.max_min`, every host's links at once); the network carries the NET pairs past their NICs.
"""

from __future__ import annotations

from collections.abc import Sequence

from phantora.collectives.nccl import net_split
from phantora.collectives.nccl.nvlink_pci import host_pci
from phantora.collectives.nccl.pci_p2p import max_min
from phantora.collectives.nccl.pci_paths import Link, PciHost, hop_links, switch
from phantora.collectives.nccl.pci_paths import link_bw as pci_link_bw
from phantora.collectives.nccl.platform import DEFAULT_GPU
from phantora.collectives.nccl.settings import NcclSettings
from phantora.errors import InputError
from phantora.topology.model import Topology


def gpu_name(topo: Topology) -> str:
    """The hosts' GPU model as `platform_of` reads it (H100 where the topology names none it knows)."""
    from phantora.perfmodel.gpus import get_gpu  # as platform_of: kept off the import path of the CLI

    try:
        return get_gpu(topo.gpu_model or DEFAULT_GPU).name
    except InputError:
        return get_gpu(DEFAULT_GPU).name


def node_of(topo: Topology, nodes: Sequence[int], st: NcclSettings, gpu: str, link_bw: float) -> list[object]:
    """Each position's NCCL node: its (host, socket or GPU) where pairs of one host go NET (`net_split.domains`),
    else its host."""
    parts = net_split.domains(topo, nodes, st, gpu, link_bw)
    return list(parts) if parts is not None else [topo.nodes[n].host for n in nodes]


def node_pair_rates(
    topo: Topology,
    nodes: Sequence[int],
    pairs: Sequence[tuple[int, int]],
    st: NcclSettings,
    gpu: str,
    link_bw: float,
) -> dict[tuple[int, int], float]:
    """GB/s of each of `pairs` (positions in `nodes`, the communicator's GPUs) while all of them are in flight, over
    the PCIe and CPU links of their hosts: a SHM pair (inside one NCCL node) on its path through the CPUs, a NET
    pair (between nodes) on its GPUs' x16 links to their switches (its NICs' rate is the network's)."""
    node = node_of(topo, nodes, st, gpu, link_bw)
    hosts: dict[object, PciHost] = {}
    at: dict[int, int] = {}

    def host(k: int) -> tuple[object, PciHost]:
        h = topo.nodes[nodes[k]].host
        if h not in hosts:
            local = [x for x, n in enumerate(nodes) if topo.nodes[n].host == h]
            at.update({x: i for i, x in enumerate(local)})
            hosts[h] = host_pci(topo, [nodes[x] for x in local], gpu, link_bw, st)
        return h, hosts[h]

    loads: dict[tuple[int, int], dict[tuple[object, Link], float]] = {}
    for i, j in pairs:
        if i == j:
            continue
        (hi, pi), (hj, pj) = host(i), host(j)
        if node[i] == node[j]:
            links, _ = hop_links(pi, at[i], at[j])
            loads[i, j] = {(hi, link): 1.0 for link in links}
        else:
            up = (("gpu", at[i]), ("sw", switch(pi, at[i])))
            down = (("sw", switch(pj, at[j])), ("gpu", at[j]))
            loads[i, j] = {(hi, up): 1.0, (hj, down): 1.0}
    return max_min(loads, lambda key: pci_link_bw(hosts[key[0]], key[1]))
