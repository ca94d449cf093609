"""The standalone FCT of a flow: its completion time alone on an idle fabric, the denominator of slowdowns.

Alone means at the flow's own rate: the slower of its path's bottleneck and its own rate cap (`Flow.rate_bps`,
payload bits/s: NCCL's per-channel throughput limit, which both engines enforce), so a flow that ran uncontended
at its cap has slowdown 1. Neither form counts `Flow.delay_ns`: both engines start a flow's FCT (`start_ns`)
after its delay. Alone also means on the flow's own path: the one its ECMP key (`Flow.key`; an NCCL flow's is its
connection's) picks, which producers that keep completions, not flows, carry beside them (`Alone`, `flow_alone`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from phantora.netsim.base import Flow
from phantora.topology.model import Topology
from phantora.units import transmit_ns


def standalone_fct_ns(
    topo: Topology,
    src: int,
    dst: int,
    size: int,
    key: int,
    framing: tuple[int, int] | None = None,
    rate_bps: int = 0,
    via_nic: bool = False,
) -> int:
    """FCT of `size` bytes from `src` to `dst` on the ECMP path of `key` (through the NICs: `via_nic`), alone on
    an idle fabric, under the flow's rate cap `rate_bps` (payload bits/s; 0: none).

    Without `framing` (the fluid view of the flow engine, live runs and replays): the bytes at min(the path's
    bottleneck rate, the cap) plus the path's one-way latency. With `framing` = (payload bytes, header bytes) per
    packet (HPCC's definition, for packet runs): twice the propagation delay, one payload's serialisation per
    hop, and every byte with its headers at the bottleneck rate, or the payload at the cap if that takes longer
    (the NIC paces a capped flow's payload at its cap: ns3-scratch/model/rdma-nic.cc), in integer ns rounded down
    as the C++ fabric does (`PhantoraFabric::StandaloneNs`). 0 for a flow to itself or of no bytes.
    """
    if src == dst or size == 0:
        return 0
    path = topo.route(src, dst, key, via_nic)
    if not path:
        return 0
    if framing is None:
        return fluid_ns(size, topo.path_bottleneck_bps(path), topo.path_latency_ns(path), rate_bps)
    payload, header = framing
    prop = sum(topo.channel_latency(c) for c in path)
    tx_ps = sum(payload * 8 * 10**12 // topo.channel_bandwidth(c) for c in path)
    rate = min(topo.channel_bandwidth(c) for c in path)
    pkts = -(-size // payload)
    bulk = (size + pkts * header) * 8 * 10**9 // rate
    if rate_bps:
        bulk = max(bulk, size * 8 * 10**9 // rate_bps)
    return 2 * prop + tx_ps // 1000 + bulk


class Alone(NamedTuple):
    """What a flow's standalone FCT takes besides its completion: the ECMP key the engines hashed (`Flow.key`, else
    its id), its rate cap (`Flow.rate_bps`, payload bits/s; 0: none) and whether it goes through the NICs
    (`Flow.via_nic`)."""

    key: int
    rate_bps: int = 0
    via_nic: bool = False


def flow_alone(flows: Iterable[Flow]) -> dict[int, Alone]:
    """Flow id -> `Alone` of the flows whose key is not their id or that have a cap, for producers that keep
    completions (`alone_of` gives the others')."""
    out: dict[int, Alone] = {}
    for f in flows:
        key = f.id if f.key is None else f.key
        if f.rate_bps or key != f.id or f.via_nic:
            out[f.id] = Alone(key, f.rate_bps, f.via_nic)
    return out


def alone_of(alone: Mapping[int, Alone], flow_id: int) -> Alone:
    """Flow `flow_id`'s entry of `alone` (`flow_alone`), or its default: keyed by its id, no cap."""
    got = alone.get(flow_id)
    return Alone(flow_id) if got is None else got


def fluid_ns(size: int, bottleneck_bps: int, latency_ns: int, rate_bps: int = 0) -> int:
    """The fluid standalone FCT: `size` bytes at min(bottleneck, cap) (rounded up to whole ns, as the flow engine
    ends a transmission) plus the path's latency; 0 without a path (bottleneck 0)."""
    if not bottleneck_bps:
        return 0
    rate = min(bottleneck_bps, rate_bps) if rate_bps else bottleneck_bps
    return transmit_ns(size, rate) + latency_ns


class StandaloneFct:
    """`standalone_fct_ns` in its fluid form for many flows: each (src, dst, ECMP key)'s route is taken and
    summarised (bottleneck rate, latency) once, as a run's flows reuse a few connections' keys (a recorded
    Llama-3-8B step on rail128: 200,704 fabric flows, 2,048 distinct (src, dst, key))."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        # (src, dst, key, via_nic) -> (bottleneck bps, ns)
        self._paths: dict[tuple[int, int, int, bool], tuple[int, int]] = {}

    def __call__(self, src: int, dst: int, size: int, key: int, rate_bps: int = 0, via_nic: bool = False) -> int:
        if src == dst or size == 0:
            return 0
        got = self._paths.get((src, dst, key, via_nic))
        if got is None:
            path = self.topo.route(src, dst, key, via_nic)
            got = (self.topo.path_bottleneck_bps(path), self.topo.path_latency_ns(path)) if path else (0, 0)
            self._paths[(src, dst, key, via_nic)] = got
        return fluid_ns(size, got[0], got[1], rate_bps)
