"""Send/recv and all-to-all between GPUs of one NCCL node of an NVLink host with P2P off (net_split.py): the SHM
pairs' shares of the host's PCIe and CPU links, as `pci_p2p.py` gives them on one host.

With NCCL_P2P_DISABLE=1 (or NCCL_P2P_LEVEL=LOC) on a fabric host, NCCL's nodes are its sockets (NET between them)
or, where no pair goes NET, the whole host. A pair inside a node runs SHM (shm.cc, its buffer on the receiver's
side): the bytes climb the sender's x16 link and its PCIe switch's uplink to the CPU, cross the inter-CPU link when
the sockets differ, and come down the receiver's (`pci_paths.hop_links` on `nvlink_pci.host_pci`'s DGX-like
layout). The SHM pairs of one call (an all-to-all's, or a grouped send/recv's pairs in flight) share those links
by max-min fairness (`pci_p2p.pair_rates`), each host's apart. The NET pairs' use of the GPU's x16 link on their
way to the NIC is not counted here (their flows cross the network engine's NIC links).
"""

from __future__ import annotations

from collections.abc import Sequence

from phantora.collectives.nccl import net_split
from phantora.collectives.nccl.nvlink_pci import host_pci
from phantora.collectives.nccl.pci_p2p import pair_rates
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


def shm_pair_rates(
    topo: Topology,
    nodes: Sequence[int],
    pairs: Sequence[tuple[int, int]],
    st: NcclSettings,
    gpu: str,
    link_bw: float,
) -> dict[tuple[int, int], float]:
    """GB/s of each SHM pair among `pairs` (positions in `nodes`, the communicator's GPUs) while all of them are in
    flight: the pairs inside one NCCL node, each host's sharing its links; the NET pairs are left out."""
    node = node_of(topo, nodes, st, gpu, link_bw)
    by_host: dict[object, list[tuple[int, int]]] = {}
    for i, j in pairs:
        if i != j and node[i] == node[j]:
            by_host.setdefault(topo.nodes[nodes[i]].host, []).append((i, j))
    out: dict[tuple[int, int], float] = {}
    for host, shm in by_host.items():
        local = [k for k, n in enumerate(nodes) if topo.nodes[n].host == host]
        at = {k: x for x, k in enumerate(local)}
        h = host_pci(topo, [nodes[k] for k in local], gpu, link_bw, st)
        got = pair_rates(h, [(at[i], at[j]) for i, j in shm])
        out.update({(i, j): got[at[i], at[j]] for i, j in shm})
    return out
