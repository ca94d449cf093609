"""PXN (PCI x NVLink): NCCL's relay of a send to another node through the local GPU on the receiver's rail.

On a rail-optimised fabric the GPU at local index j of every node reaches the network through rail j. A send from
local GPU i to a GPU on another node at local index j != i would cross rails (through a spine); NCCL instead moves
the data over NVLink to the local GPU j and sends it from GPU j's NIC, so the network hop stays on rail j
(`NCCL_PXN_DISABLE=0`, the default since NCCL 2.12). phantora relays through GPU j when it is a member of the
group (an expert-parallel all-to-all over whole nodes); the relay rank then also waits for the flows it relays.
"""

from __future__ import annotations

from phantora.collectives.layout import rail_aligned
from phantora.collectives.nccl.settings import settings_from_env, settings_of
from phantora.collectives.p2p import Relay
from phantora.collectives.spec import AlgoOptions
from phantora.topology.model import Topology


def pxn_relay(topo: Topology, nodes: list[int], blocks: list[list[int]], opts: AlgoOptions) -> Relay | None:
    """The relay of each cross-node, cross-rail transfer of a group, or None where PXN does not apply."""
    if opts.model != "nccl" or len(blocks) < 2 or not rail_aligned(topo, nodes, blocks):
        return None
    st = settings_from_env() if opts.nccl_env is None else settings_of(opts.nccl_env)
    if not st.pxn:
        return None
    where = {pos: (h, i) for h, block in enumerate(blocks) for i, pos in enumerate(block)}

    def relay(src: int, dst: int) -> int | None:
        (hs, i), (hd, j) = where[src], where[dst]
        return blocks[hs][j] if hs != hd and i != j else None

    return relay
