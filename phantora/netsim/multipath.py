"""A flow's equal-cost multipath route: the share of its bytes on each channel, hop by hop.

Switches spray (`lb=spray|spray_rr`) by picking uniformly among the equal-cost next hops at every hop, so in
expectation a flow's bytes split evenly at each switch: a channel leaving node u carries ``share(u) / b(u)``
of the flow, where ``b(u)`` is the number of u's equal-cost next hops. On a symmetric Clos this is an even
split over all equal-cost paths. The channels at one hop count from the source form a *layer*: every byte
crosses exactly one channel of each layer (the flow engine's `lb=adaptive` pools a layer's capacity).
"""

from __future__ import annotations

from dataclasses import dataclass

from phantora.topology.model import Topology


@dataclass(frozen=True, slots=True)
class MultiRoute:
    """Channels with their byte share (summing to 1 per layer), the layers, and the longest path latency."""

    channels: tuple[int, ...]  # every channel any equal-cost path uses, layer by layer
    share: tuple[float, ...]  # fraction of the flow's bytes on each channel (per-hop even split)
    layers: tuple[tuple[int, ...], ...]  # channels (sorted) at hop 0, 1, ...: each byte crosses one of each
    latency_ns: int  # the longest equal-cost path's propagation latency (the last byte may take it)


def multipath(topo: Topology, src: int, dst: int, via_nic: bool = False) -> MultiRoute:
    """The per-hop even split of a flow src -> dst over the topology's equal-cost next hops.

    Traffic between two endpoints of one NVSwitch keeps its single route (as `Topology.route` gives it), unless
    `via_nic` (`Flow.via_nic`): then it spreads over the fabric's paths from src's NIC."""
    if not via_nic and topo.shared_nvswitch(src, dst) is not None:
        path = topo.route(src, dst)
        return MultiRoute(tuple(path), (1.0,) * len(path), tuple((c,) for c in path), topo.path_latency_ns(path))
    topo.route(src, dst, 0, via_nic)  # raises a clear InputError when dst is unreachable
    frontier: dict[int, tuple[float, int]] = {src: (1.0, 0)}  # node -> (share of the flow, latency so far)
    channels: list[int] = []
    share: list[float] = []
    layers: list[tuple[int, ...]] = []
    while dst not in frontier:
        nxt: dict[int, tuple[float, int]] = {}
        layer: list[int] = []
        for u in sorted(frontier):
            part, lat = frontier[u]
            hops = topo.next_hops(u, dst)
            each = part / len(hops)
            for v, ch in hops:
                channels.append(ch)
                share.append(each)
                layer.append(ch)
                old = nxt.get(v)
                arrive = lat + topo.channel_latency(ch)
                nxt[v] = (each, arrive) if old is None else (old[0] + each, max(old[1], arrive))
        layers.append(tuple(sorted(layer)))
        frontier = nxt
    return MultiRoute(tuple(channels), tuple(share), tuple(layers), frontier[dst][1])
