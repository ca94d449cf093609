"""Link-disjoint pieces of a fabric, for decomposition into parallel ns-3 workers (bridge.decompose).

A piece is a connected component of the fabric graph without NVSwitches (under nvlink=fluid their
traffic is fluid) and without the top switch tier (the spines of a leaf-spine or rail-optimised
fabric), when the fabric has more than one switch tier. On a rail-optimised fabric each rail (its leaf,
its NICs, their links) is one piece. We chose the static rule over the components of the links the
flows use because a piece is then known before any flow arrives, and a flow that would join two pieces
(cross-rail traffic through a spine) is refused at submit with its name, ends and the switch, instead of
silently merging two workers' work.
"""

from __future__ import annotations

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.topology.model import Topology

NO_PIECE = -1


def fabric_pieces(topo: Topology) -> list[int]:
    """Node id -> piece id (0, 1, ... in order of each piece's lowest node), NO_PIECE for NVSwitches and
    top-tier switches."""
    tiers = {n.tier for n in topo.nodes if n.kind == "switch"}
    top = max(tiers) if len(tiers) > 1 else None
    kept = [n.kind != "nvswitch" and not (n.kind == "switch" and n.tier == top) for n in topo.nodes]
    parent = list(range(len(topo.nodes)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for link in topo.links:
        if kept[link.a] and kept[link.b]:
            ra, rb = find(link.a), find(link.b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    ids: dict[int, int] = {}
    out = []
    for n in range(len(topo.nodes)):
        out.append(ids.setdefault(find(n), len(ids)) if kept[n] else NO_PIECE)
    return out


def piece_of(topo: Topology, pieces: list[int], f: Flow) -> int:
    """The piece a fabric flow's route stays in; InputError naming the flow, its ends and the switch where it
    leaves its source's piece."""
    return route_in_piece(topo, pieces, f)[0]


def route_in_piece(topo: Topology, pieces: list[int], f: Flow) -> tuple[int, list[int]]:
    """`piece_of` and the flow's route (its channels)."""
    home = pieces[f.src]
    path = topo.route(f.src, f.dst, f.id if f.key is None else f.key)
    for ch in path:
        node = topo.channel_ends(ch)[1]
        if pieces[node] != home:
            nodes = topo.nodes
            raise InputError(
                f"flow {f.id} ({nodes[f.src].name} -> {nodes[f.dst].name}) crosses pieces at "
                f"{nodes[node].name}: decomposition (workers=N) needs link-disjoint traffic, e.g. same-rail flows "
                "on a rail-optimised fabric; run it with workers=0",
                field="workers",
            )
    return home, path
