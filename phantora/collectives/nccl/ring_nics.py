"""NCCL's ring through NCCL nodes of SHM GPUs with NICs (P2P off on NVLink hosts: net_split.py): its order inside
a node and the NIC each channel enters and leaves a node by.

NVIDIA/nccl v2.19.4-1 to v2.30.7-1, search.cc. Such a node is a socket or a whole host (net_split.py) of an NVLink
host, so its system has an NVSwitch; its NICs are listed by their GPUs' index (`ncclTopoSelectNets`, each GPU's own
NIC: `ncclTopoGetLocalNet`). Channel 0 starts from the first NIC (`ncclTopoSearchRecNet`: channel c tries NIC
(c + i) mod NICs), at its first local GPU: GPU 0 (`ncclTopoGetLocal` lists GPUs by index; no PCI-order pass with an
NVSwitch). `ncclTopoSearchNextGpuSort` then offers, with an NVSwitch, only the GPU's ring neighbours, moving the
next and then the previous to the front, so the previous (index - 1) is tried first: the ring runs 0, n-1, ..., 1
(`shm_order.node_order`; NCCL's logs on NVSwitch hosts print "0 7 6 5 4 3 2 1 8 15 ..."), and on the DGX-like layout its
last GPU, 1, shares GPU 0's PCIe switch and NIC path. crossNic 0 is tried first at each speed and a crossNic 2 ring
of the same bandwidth does not replace it (`ncclTopoCompareGraphs`), so the last GPU goes back to the NIC the
channel entered by (`ncclTopoSearchRecGpu`, step == backToNet: the same asic and port).

A later channel of the first pass (sameChannels 1) only replays channel 0's GPUs (FORCED_ORDER_REPLAY) from its own
NIC: NIC (c + i) mod NICs, the first whose path to GPU 0 is within the search's typeInter (PIX first: the NICs on
GPU 0's switch) and which has bandwidth left (`net->net.bw < bw` skips it), `entry_nics`. net.cc's setup asks
`ncclTopoGetNetDev` with the ring graph: a channel's first GPU receives on `inter[2c]`, its last sends on
`inter[2c + 1]`, the same NIC; PXN does not relay it (paths.cc sets PATH_PXN only through a GPU joined by NVLink,
which P2P off diverts through the CPU). Communicator channel c runs found channel c mod found (`ncclTopoGetNetDev`:
`channelId % graph->nChannels`; connect.cc's and copyChannels' duplicates: `tree_channels.chain_of`), and no ring
alternates (connect.cc exchanges rings only of a crossNic 2 solution).

So each hop between nodes leaves by its channel's NIC in the sender's node (the last GPU's bytes cross PCIe to it,
not simulated) and arrives at the same NIC of the next node (its bytes then cross PCIe to the node's first GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.shm_order import node_order

NEAR_NICS = 2  # the NICs on GPU 0's PCIe switch in the DGX-like layout (nvlink_pci.GPUS_PER_SWITCH, one per GPU)


def shm_nodes(p: Platform) -> bool:
    """Whether the communicator's NCCL nodes are NVLink hosts, or their sockets, on SHM with NICs between them."""
    return p.node_bw > 0 and p.nnodes > 1


def entry_nics(found: int, nics: int, per_nic: int, near: int = NEAR_NICS) -> tuple[int, ...]:
    """The NIC (by its GPU's index) each of `found` channels enters and leaves a node by: channel c takes the first
    of NICs c, c + 1, ... (mod `nics`) on GPU 0's switch (index < `near`) with one of its `per_nic` channels
    left, else the first with one left (a wider typeInter), else NIC c mod `nics`."""
    left = [per_nic] * nics
    out: list[int] = []
    for c in range(found):
        turn = [(c + i) % nics for i in range(nics)]
        pick = next((j for j in turn if j < near and left[j] > 0), None)
        if pick is None:
            pick = next((j for j in turn if left[j] > 0), turn[0])
        left[pick] -= 1
        out.append(pick)
    return tuple(out)


def by_index(blocks: Sequence[Sequence[int]], node_of: Sequence[int]) -> list[list[int]]:
    """Each NCCL node's positions by its GPUs' index on the host (NCCL's GPU order: by PCI bus id)."""
    return [sorted(b, key=lambda pos: node_of[pos]) for b in blocks]


Order = Callable[[int], Sequence[int]]  # a node's size -> the ring through it, by GPU index


def ring(nodes: Sequence[Sequence[int]], order: Order = node_order) -> list[int]:
    """The ring over NCCL nodes (each its positions by GPU index), each node in `order` (SHM nodes: `node_order`;
    NVSwitch hosts with P2P on: the channel's, nvswitch_rings.py), nodes in turn."""
    return [b[k] for b in nodes for k in order(len(b))]


def hops(nodes: Sequence[Sequence[int]], nic: int, order: Order = node_order) -> dict[tuple[int, int], tuple[int, int]]:
    """(sender, receiver) -> (the position whose NIC the hop leaves by, the one whose NIC it arrives at) for each
    hop of `ring(nodes, order)` between two nodes, the channel on NIC `nic` (a GPU index; a node's last NIC past its
    GPUs)."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for k, here in enumerate(nodes):
        there = nodes[(k + 1) % len(nodes)]
        if len(nodes) < 2:
            break
        last, first = here[order(len(here))[-1]], there[order(len(there))[0]]
        out[last, first] = (here[min(nic, len(here) - 1)], there[min(nic, len(there) - 1)])
    return out
