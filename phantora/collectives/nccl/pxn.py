"""PXN (PCI x NVLink): NCCL's relay of a send to another node through the local GPU on the receiver's rail.

On a rail-optimised fabric the GPU at local index j of every node reaches the network through rail j. A send from
local GPU i to a GPU on another node at local index j != i would cross rails (through a spine); NCCL instead moves
the data over NVLink to the local GPU j and sends it from GPU j's NIC, so the network hop stays on rail j
(`NCCL_PXN_DISABLE=0`, the default since NCCL 2.12). phantora relays through GPU j when it is a member of the
group (an expert-parallel all-to-all over whole nodes); the relay rank then also waits for the flows it relays.

A send/recv grouped on a larger communicator (sendrecv_perf's ring, pipeline sends on the world) relays the same
way through the communicator's rank on the sender's host at the receiver's local index: NCCL's p2p NIC choice
(`ncclTopoGetNetDev` without a graph, src/graph/search.cc, v2.29.7-1) takes the NIC local to the GPU of the
receiver's device number on the sender's node, and `ncclTopoGetIntermediateRank` makes that GPU's rank the proxy.
That rank takes no part in the transfer otherwise (its proxy thread posts the sends from its GPU's buffer), so the
relayed flows do not make it wait. A lone pair (a 2-rank communicator) has no such rank and crosses rails.

With P2P off on NVLink (NCCL_P2P_DISABLE=1, NCCL_P2P_LEVEL below NVL) nothing is relayed: paths.cc gives a NIC a
PATH_PXN path only through a GPU joined to the sender by NVLink (`peerNode->paths[GPU][g].type <= PATH_NVL`,
v2.19.4-1 to v2.30.7-1), and P2P off diverts every GPU pair through the CPU first (`addInterStep`), so each GPU
sends from its own NIC.
"""

from __future__ import annotations

from phantora.collectives.dag import DagBuilder
from phantora.collectives.launch_group import shared
from phantora.collectives.layout import host_blocks, rail_aligned
from phantora.collectives.nccl.nvlink_pci import p2p_off
from phantora.collectives.nccl.settings import settings_from_env, settings_of
from phantora.collectives.p2p import Relay
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.topology.model import Topology


def pxn_relay(topo: Topology, nodes: list[int], blocks: list[list[int]], opts: AlgoOptions) -> Relay | None:
    """The relay of each cross-node, cross-rail transfer of a group, or None where PXN does not apply."""
    if opts.model != "nccl" or len(blocks) < 2 or not rail_aligned(topo, nodes, blocks):
        return None
    st = settings_from_env() if opts.nccl_env is None else settings_of(opts.nccl_env)
    if not st.pxn or p2p_off(st):
        return None
    where = {pos: (h, i) for h, block in enumerate(blocks) for i, pos in enumerate(block)}

    def relay(src: int, dst: int) -> int | None:
        (hs, i), (hd, j) = where[src], where[dst]
        return blocks[hs][j] if hs != hd and i != j else None

    return relay


def comm_relay_rank(topo: Topology, coll: Collective, opts: AlgoOptions) -> int | None:
    """The communicator rank that relays a grouped send/recv across hosts and rails (NCCL's PXN for p2p), or None:
    a lone pair, one host, one rail, PXN off, or a communicator not laid out on rails (`rail_aligned`)."""
    if opts.model != "nccl" or coll.kind != "send_recv" or not coll.comm:
        return None
    st = settings_from_env() if opts.nccl_env is None else settings_of(opts.nccl_env)
    if not st.pxn or p2p_off(st):
        return None
    comm = coll.comm

    def layout() -> tuple[list[list[int]], dict[int, tuple[int, int]]] | None:  # hosts and rails, if rail-aligned
        nodes = [topo.node_of_rank(r) for r in comm]
        blocks = host_blocks(topo, nodes)
        if not rail_aligned(topo, nodes, blocks):
            return None
        return blocks, {pos: (h, i) for h, block in enumerate(blocks) for i, pos in enumerate(block)}

    laid = shared(coll.launch, topo, ("pxn", comm), layout)  # once for a launch's pairs
    if laid is None:
        return None
    blocks, where = laid
    (hs, i), (hd, j) = (where[comm.index(r)] for r in coll.ranks)
    return coll.comm[blocks[hs][j]] if hs != hd and i != j else None


def comm_relay(b: DagBuilder, topo: Topology, coll: Collective, opts: AlgoOptions) -> Relay | None:
    """`comm_relay_rank` as a relay of the transfer 0 -> 1, its rank added to `b` as a helper position."""
    rank = comm_relay_rank(topo, coll, opts)
    if rank is None:
        return None
    node = topo.node_of_rank(rank)
    via = b.add_helper(node, rank, topo.nodes[node].host)
    return lambda src, dst: via if (src, dst) == (0, 1) else None
