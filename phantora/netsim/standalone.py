"""The standalone FCT of a flow: its completion time alone on an idle fabric, the denominator of slowdowns."""

from __future__ import annotations

from phantora.topology.model import Topology
from phantora.units import transmit_ns


def standalone_fct_ns(
    topo: Topology, src: int, dst: int, size: int, key: int, framing: tuple[int, int] | None = None
) -> int:
    """FCT of `size` bytes from `src` to `dst` on the ECMP path of `key`, alone on an idle fabric.

    Without `framing` (the fluid view of the flow engine, live runs and replays): the bytes at the path's
    bottleneck rate plus the path's one-way latency. With `framing` = (payload bytes, header bytes) per
    packet (HPCC's definition, for packet runs): twice the propagation delay, one payload's serialisation
    per hop, and every byte with its headers at the bottleneck rate, in integer ns rounded down as the
    C++ fabric does. 0 for a flow to itself or of no bytes.
    """
    if src == dst or size == 0:
        return 0
    path = topo.route(src, dst, key)
    if not path:
        return 0
    if framing is None:
        return transmit_ns(size, topo.path_bottleneck_bps(path)) + topo.path_latency_ns(path)
    payload, header = framing
    prop = sum(topo.channel_latency(c) for c in path)
    tx_ps = sum(payload * 8 * 10**12 // topo.channel_bandwidth(c) for c in path)
    rate = min(topo.channel_bandwidth(c) for c in path)
    pkts = -(-size // payload)
    return 2 * prop + tx_ps // 1000 + (size + pkts * header) * 8 * 10**9 // rate


class StandaloneFct:
    """`standalone_fct_ns` in its fluid form for many flows: each (src, dst, ECMP key)'s route is taken and
    summarised (bottleneck rate, latency) once, as a run's flows reuse a few connections' keys (a recorded
    Llama-3-8B step on rail128: 200,704 fabric flows, 2,048 distinct (src, dst, key))."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._paths: dict[tuple[int, int, int], tuple[int, int]] = {}  # (src, dst, key) -> (bottleneck bps, ns)

    def __call__(self, src: int, dst: int, size: int, key: int) -> int:
        if src == dst or size == 0:
            return 0
        got = self._paths.get((src, dst, key))
        if got is None:
            path = self.topo.route(src, dst, key)
            got = (self.topo.path_bottleneck_bps(path), self.topo.path_latency_ns(path)) if path else (0, 0)
            self._paths[(src, dst, key)] = got
        bps, lat = got
        return transmit_ns(size, bps) + lat if bps else 0
