"""Link-disjoint pieces of a fabric, for decomposition into parallel ns-3 workers (phantora.netsim.decompose).

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

Summary = tuple[int, int, int]  # (piece, propagation ns, bottleneck bps) of a fabric flow's route

NO_PIECE = -1
INF_BPS = 1 << 62


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
    path = topo.route(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic)
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


class PieceRoutes:
    """`route_in_piece` summarised per endpoint pair: (piece, propagation ns, bottleneck bps) of a fabric flow.

    When every equal-cost route from src to dst stays in src's piece and all of them have the same
    propagation and bottleneck (one leaf per rail: one route), the summary is the pair's, whatever the flow's
    ECMP key; it is then computed once per pair. Otherwise each flow is routed (`route_in_piece`), which also
    names a flow that leaves its piece."""

    def __init__(self, topo: Topology, pieces: list[int]) -> None:
        self.topo = topo
        self.pieces = pieces
        self._pair: dict[tuple[int, int], Summary | None] = {}

    def of(self, f: Flow) -> Summary:
        """The summary of fabric flow `f`'s route; InputError as `route_in_piece` if it leaves its piece."""
        pair = (f.src, f.dst)
        if pair in self._pair:
            s = self._pair[pair]
        else:
            s = self._pair[pair] = self._summarise(f.src, f.dst)
        if s is not None:
            return s
        piece, path = route_in_piece(self.topo, self.pieces, f)
        return piece, self.topo.path_latency_ns(path), self.topo.path_bottleneck_bps(path)

    def summary(self, src: int, dst: int) -> Summary | None:
        """The pair's summary when every flow of it has one (`of` computed it), else None (routed per flow)."""
        return self._pair.get((src, dst))

    def _summarise(self, src: int, dst: int) -> Summary | None:
        """The pair's summary if every candidate route agrees on it and stays in src's piece, else None."""
        topo, pieces = self.topo, self.pieces
        if topo.shared_nvswitch(src, dst) is not None:
            return None
        home = pieces[src]
        # (least, greatest) propagation and bottleneck over the candidate routes from each node to dst
        memo: dict[int, tuple[int, int, int, int]] = {dst: (0, 0, INF_BPS, INF_BPS)}

        def walk(node: int) -> tuple[int, int, int, int] | None:
            got = memo.get(node)
            if got is not None:
                return got
            lo_l = lo_b = INF_BPS
            hi_l = hi_b = -1
            for v, ch in topo.next_hops(node, dst):
                if pieces[v] != home:
                    return None
                rest = walk(v)
                if rest is None:
                    return None
                lat, bw = topo.channel_latency(ch), topo.channel_bandwidth(ch)
                lo_l, hi_l = min(lo_l, lat + rest[0]), max(hi_l, lat + rest[1])
                lo_b, hi_b = min(lo_b, min(bw, rest[2])), max(hi_b, min(bw, rest[3]))
            if hi_l < 0:
                return None
            memo[node] = (lo_l, hi_l, lo_b, hi_b)
            return memo[node]

        got = walk(src)  # None also when there is no route: `route_in_piece` then names it
        if got is None or got[0] != got[1] or got[2] != got[3]:
            return None
        return home, got[0], got[2]
