"""The NIC a ring leaves an NCCL node by where the node's GPUs run SHM (P2P off on NVLink hosts with NICs).

NVIDIA/nccl v2.19.4-1 to v2.30.7-1, search.cc: on such a node (a socket, or a whole host: net_split.py) the ring
search enters each channel at a NIC's local GPU (`ncclTopoSearchRecNet`: the NICs in GPU order, channel g trying
NIC g first), goes on by GPU index (an NVSwitch is in the system: `ncclTopoSearchNextGpuSort`), and, crossNic 0
being tried first at each speed and a crossNic 2 ring of the same bandwidth not replacing it
(`ncclTopoCompareGraphs`), leaves the last GPU for the NIC it entered from (`ncclTopoSearchCheckNet`, v2.19: the
same asic and port). net.cc's setup asks `ncclTopoGetNetDev` with the ring graph: the channel's first GPU receives
on `inter[2c]`, its last sends on `inter[2c + 1]`, the same NIC; PXN does not relay it, since paths.cc sets
PATH_PXN only through a GPU joined by NVLink (`paths[GPU][g].type <= PATH_NVL`), which P2P off diverts through the
CPU. Communicator channel c runs found channel c mod found (`ncclTopoGetNetDev`: `channelId % graph->nChannels`;
connect.cc's and copyChannels' duplicates: `tree_channels.chain_of`), and no ring alternates (connect.cc exchanges
rings only of a crossNic 2 solution).

So each hop between nodes leaves by the NIC of the first GPU of the sender's node in that channel's ring (the last
GPU's bytes cross PCIe and the CPU to it, not simulated) and arrives at the next node's first GPU's own NIC.
"""

from __future__ import annotations

from collections.abc import Sequence

from phantora.collectives.nccl.platform import Platform


def shm_nodes(p: Platform) -> bool:
    """Whether the communicator's NCCL nodes are NVLink hosts, or their sockets, on SHM with NICs between them."""
    return p.node_bw > 0 and p.nnodes > 1


def exits(orders: Sequence[Sequence[int]], node: Sequence[object]) -> dict[tuple[int, int, int], int]:
    """(channel, sender, receiver) -> the position whose NIC the hop leaves by, for each hop of channel c's ring
    `orders[c]` between two NCCL nodes (`node[pos]`) whose sender is not its node's first GPU in the ring."""
    out: dict[tuple[int, int, int], int] = {}
    for c, order in enumerate(orders):
        n = len(order)
        first = order[0]
        for i in range(n):
            here, nxt = order[i], order[(i + 1) % n]
            if i == 0 or node[order[i - 1]] != node[here]:
                first = here
            if node[nxt] != node[here] and first != here:
                out[c, here, nxt] = first
    return out
