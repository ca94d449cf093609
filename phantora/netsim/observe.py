"""What an engine observes in the fabric beyond flow completions: the optional, declared part of its interface.

`NetworkSimulator.channels()` returns a `ChannelObserver` (per-channel traffic) or None, and
`NetworkSimulator.fabric()` a `FabricObserver` (PFC frames, queue samples, drops, CNPs, ECN marks, and
per-channel packet counters) or None. The flow engine observes channels only; the ns-3 engine both;
a remote engine neither (its network server writes them). Consumers ask these two methods, never
`hasattr`. The records below are what the observers return.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from phantora.netsim.effective import EffectiveSettings
    from phantora.topology.model import Topology


_GETTERS: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def fields_getter(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    """A record's fields as a tuple, for a class below (flat: two fields or more, each a number or a bool): what
    `dataclasses.astuple` gives, without its deep copy (about 5x faster as a sort key)."""
    get = _GETTERS.get(cls)
    if get is None:
        get = _GETTERS[cls] = attrgetter(*(f.name for f in fields(cls)))
    return get


@dataclass(frozen=True, slots=True)
class ChannelUsage:
    """Traffic one directed channel carried, for reports."""

    channel: int
    link: int
    src: int
    dst: int
    bandwidth_bps: int
    bytes: int
    busy_ns: int
    utilisation: float  # bytes * 8 / (bandwidth * elapsed)


@dataclass(frozen=True, slots=True)
class PfcEvent:
    """A PFC frame as seen by the port it pauses or resumes."""

    time_ns: int
    node: int
    node_type: int  # 0 endpoint, 1 switch, 2 NVSwitch
    port: int  # 0-based
    prio: int
    pause: bool
    from_node: int  # the switch that sent it


@dataclass(frozen=True, slots=True)
class QueueSample:
    """Bytes in a switch egress queue (node, port, class) at a sampling instant."""

    time_ns: int
    node: int
    port: int
    prio: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Drop:
    """A packet dropped at a switch ingress port."""

    time_ns: int
    node: int
    port: int
    prio: int
    flow_id: int
    seq: int


@dataclass(frozen=True, slots=True)
class Trim:
    """A loss-tolerant data packet cut to its header at a switch egress (DLCP): its payload is lost for good."""

    time_ns: int
    node: int  # the switch
    port: int  # its egress port, 0-based
    prio: int
    flow_id: int
    seq: int
    payload: int  # bytes cut off


@dataclass(frozen=True, slots=True)
class CnpEvent:
    """A CNP (an ACK or NACK echoing a CE mark) received by a sending NIC, DCQCN's reaction point."""

    time_ns: int
    node: int  # the sender that received it
    flow_id: int
    from_node: int  # the receiver that sent it
    seq: int  # the acknowledged sequence it carried


@dataclass(frozen=True, slots=True)
class EcnMark:
    """A data packet CE-marked at a switch egress port."""

    time_ns: int
    node: int  # the switch
    port: int  # its egress port, 0-based
    prio: int
    channel: int  # the directed channel of that port (PacketChannelUsage.channel)
    flow_id: int


@dataclass(frozen=True, slots=True)
class FabricRecords:
    """A stretch of a packet engine's fabric records, each list in time order."""

    pfc: Sequence[PfcEvent]
    queues: Sequence[QueueSample]
    drops: Sequence[Drop]
    cnps: Sequence[CnpEvent]
    marks: Sequence[EcnMark]


@dataclass(frozen=True, slots=True)
class FlowTransport:
    """A flow's transport counters: retransmissions at its sender, reordering at its receiver."""

    flow_id: int
    retx_packets: int
    retx_bytes: int  # payload bytes sent again
    ooo_packets: int  # data packets that arrived with a hole before them
    reorder_max_bytes: int  # the furthest a packet arrived ahead of the first missing byte


@dataclass(frozen=True, slots=True)
class PacketChannelUsage:
    """Traffic of one directed channel (all packets: data, ACK, PFC) up to now."""

    channel: int
    src: int
    dst: int
    bandwidth_bps: int
    bytes: int
    packets: int
    paused_ns: int  # class-ns the sending port spent paused by PFC
    ecn_marks: int
    max_queue_bytes: int
    utilisation: float  # bytes * 8 / (bandwidth * elapsed)


class ChannelObserver(Protocol):
    """Per-channel traffic of an engine, for links.csv and utilisation reports."""

    def channel_usage(self, elapsed_ns: int | None = None) -> Sequence[ChannelUsage] | Sequence[PacketChannelUsage]:
        """One record per used directed channel, utilisation over `elapsed_ns` (default: now())."""
        ...


class FabricObserver(ChannelObserver, Protocol):
    """A packet-level engine's view of the fabric: what pfc.csv, queues.csv, drops.csv, cnps.csv and
    ecn_marks.csv hold, and per-channel packet counters (`channel_usage` gives `PacketChannelUsage`)."""

    def channel_usage(self, elapsed_ns: int | None = None) -> Sequence[PacketChannelUsage]: ...

    def pfc_events(self) -> Sequence[PfcEvent]: ...

    def queue_samples(self) -> Sequence[QueueSample]: ...

    def drops(self) -> Sequence[Drop]: ...

    def trims(self) -> Sequence[Trim]: ...

    def cnp_events(self) -> Sequence[CnpEvent]: ...

    def ecn_mark_events(self) -> Sequence[EcnMark]: ...

    def flow_transport(self) -> Mapping[int, FlowTransport]:
        """Flow id -> its transport counters, for every flow completed so far."""
        ...

    def effective(self) -> EffectiveSettings:
        """What the fabric runs by, as ns-3 reports it: every attribute read back from its objects and what the
        fabric-scaled defaults resolved to (`phantora.netsim.effective`; engine.json in a run directory)."""
        ...


def switch_link_load(topology: Topology, bytes_of: Mapping[int, int]) -> dict[str, int]:
    """How evenly traffic spread over the fabric: bytes on the busiest and the least busy directed
    switch-to-switch channel among those that carried traffic, and how many such channels carried none (a
    topology with no switch links, or no traffic on them, gives {})."""
    fabric = topology.switch_channels
    loads = [bytes_of[c] for c in fabric if bytes_of.get(c, 0) > 0]
    if not loads:
        return {}
    return {
        "switch_link_bytes_max": max(loads),
        "switch_link_bytes_min": min(loads),
        "switch_links_idle": len(fabric) - len(loads),
    }
