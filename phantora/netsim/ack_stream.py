"""The ACK stream of the packet model, for the flow network at the packets' goodput.

ns-3's receiver returns a header-sized ACK (`header_bytes`, + INT when on) every `ack_interval` in-order data
packets, on the reverse of the data's path. A link that carries data one way only carries those ACKs where its
data is not: `flow_goodput` (payload / (payload + header)) is then exact. A link that carries data both ways
(a NIC that sends and receives: a send/recv ring, an all-to-all, a ring collective) carries, in each direction,
its own data and the ACKs of the data coming the other way: payload / (payload + header + header / ack_interval)
when both directions are equally busy (`nvlink_efficiency` in factory.py charges the same on NVLink).

`with_ack_stream` gives a copy of a topology whose links carrying a batch of flows both ways are slowed by that
ACK share, so a flow engine built on it at goodput charges the ACKs where ns-3's packets do. It is a static
charge for one batch: the lighter direction's bytes over the heavier's (r) scale the ACK term, which is exact when
both directions send through the same interval and charges too much where they do not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from phantora.netsim.base import Flow
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.model import Topology


def channel_bytes(topo: Topology, flows: Iterable[Flow]) -> dict[int, int]:
    """Bytes each directed channel carries for `flows`, each on its ECMP route (`key`, else its id)."""
    load: dict[int, int] = {}
    for f in flows:
        if f.src == f.dst or f.size <= 0:
            continue
        for ch in topo.route(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic):
            load[ch] = load.get(ch, 0) + f.size
    return load


def ack_slowdown(config: PacketConfig, reverse_share: float) -> float:
    """A link's payload rate with the ACKs of `reverse_share` x its own bytes coming the other way, over its payload
    rate without them: (payload + header) / (payload + header + r x header / ack_interval)."""
    if not 0.0 <= reverse_share <= 1.0:
        raise ValueError(f"reverse_share must be in [0, 1], got {reverse_share}")
    wire = config.payload_bytes + config.header_bytes
    return wire / (wire + reverse_share * config.header_bytes / config.ack_interval)


def with_ack_stream(topo: Topology, flows: Iterable[Flow], config: PacketConfig) -> Topology:
    """A copy of `topo` (same nodes, link and channel ids, routes) whose links carrying `flows` both ways run at
    `ack_slowdown` of their rate (r: the lighter direction's bytes over the heavier's); the others unchanged."""
    load = channel_bytes(topo, flows)
    links = []
    for link in topo.links:
        fwd, rev = load.get(2 * link.id, 0), load.get(2 * link.id + 1, 0)
        if fwd and rev:
            share = min(fwd, rev) / max(fwd, rev)
            link = replace(link, bandwidth_bps=max(1, round(link.bandwidth_bps * ack_slowdown(config, share))))
        links.append(link)
    copy = Topology(topo.name, list(topo.nodes), links, topo.gpu_model, dict(topo.meta), topo.ecmp_hash)
    order = topo.rank_order
    if order is None:
        return copy
    eps = copy.endpoints
    return copy.with_rank_order([eps.index(node) for node in order])
