"""`EarliestEnds`: the earliest each submitted flow can complete, a bound no engine beats.

A flow is released at the latest bound of its deps (or its submission time) plus its delay, then needs its size
at its route's bottleneck line rate plus the route's propagation latency: the flow engine shares links and ns-3
adds headers and queueing, so neither is faster. The coordinator lets the network run up to the bound of the
flows it waits for without stepping (`bridge.stepping.advance_watching`). From the same routes it counts the
bytes the flows carry between endpoints and, of those, through a switch (the idle-fabric check).
"""

from __future__ import annotations

from collections.abc import Iterable

from phantora.netsim.base import Flow
from phantora.topology.model import Topology


class EarliestEnds:
    """Lower bounds of the in-flight flows' completions (`bound`), and the bytes they carry."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.bounds: dict[int, int] = {}  # in-flight flow -> earliest possible completion (ns)
        # (src, dst, key) -> (bottleneck bit/s, latency ns, whether the route crosses a switch)
        self._paths: dict[tuple[int, int, int, bool], tuple[int, int, bool]] = {}
        self.network_bytes = 0  # bytes of the flows between two endpoints
        self.fabric_bytes = 0  # ... of those whose route crosses a switch (not NVLink alone)

    def add(self, flows: Iterable[Flow], t_start: int) -> None:
        """Bound each of `flows`, submitted at `t_start` (deps earlier in the list or still in flight)."""
        lb = self.bounds
        for f in flows:
            release = max([t_start, *(lb.get(d, t_start) for d in f.deps)]) + f.delay_ns
            if f.size == 0 or f.src == f.dst:
                lb[f.id] = release
                continue
            bottleneck, latency, fabric = self._path(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic)
            lb[f.id] = release + f.size * 8 * 10**9 // bottleneck + latency
            self.network_bytes += f.size
            if fabric:
                self.fabric_bytes += f.size

    def done(self, flow_id: int) -> None:
        """Forget a completed flow."""
        self.bounds.pop(flow_id, None)

    def earliest(self, flow_ids: Iterable[int], default: int) -> int:
        """The earliest bound among `flow_ids` (all in flight), `default` if there are none."""
        return min((self.bounds[f] for f in flow_ids), default=default)

    def _path(self, src: int, dst: int, key: int, via_nic: bool) -> tuple[int, int, bool]:
        path = self._paths.get((src, dst, key, via_nic))
        if path is None:
            topo = self.topology
            route = topo.route(src, dst, key, via_nic)
            crosses = any(topo.nodes[topo.channel_ends(ch)[1]].kind == "switch" for ch in route)
            path = self._paths[(src, dst, key, via_nic)] = (
                topo.path_bottleneck_bps(route),
                topo.path_latency_ns(route),
                crosses,
            )
        return path
