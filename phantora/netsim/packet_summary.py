"""The packet engine's counters and per-channel usage from its raw C++ records.

Shared by the in-process engine (`packet.Ns3Simulator`) and netsim's standalone runner (`runner_engine`), so
both report a run alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from phantora.netsim.observe import Drop, PacketChannelUsage, Trim, switch_link_load

if TYPE_CHECKING:
    from phantora.netsim.packet_config import PacketConfig
    from phantora.topology.model import Topology

# A ChannelRecord's fields, in order: channel, src, dst, bps, txBytes, txPackets, pausedNs, ecnMarks, maxQueueBytes
ChannelRow = tuple[int, int, int, int, int, int, int, int, int]


def packet_stats(
    raw: Iterable[tuple[str, float]],
    drops: Iterable[Drop],
    trims: Iterable[Trim],
    config: PacketConfig,
    topology: Topology,
    channels: Iterable[ChannelRow],
) -> dict[str, object]:
    """`Ns3Simulator.stats()`: the fabric's counters (`raw`, integral ones as int), drops and DLCP trims by traffic
    class, the engine's settings and how evenly load balancing spread the channels' bytes."""
    out: dict[str, object] = {}
    for key, value in raw:
        out[key] = int(value) if value.is_integer() else value
    by_class: dict[str, int] = {}
    for d in drops:
        by_class[f"drops_class{d.prio}"] = by_class.get(f"drops_class{d.prio}", 0) + 1
    for t in trims:
        by_class[f"trimmed_bytes_class{t.prio}"] = by_class.get(f"trimmed_bytes_class{t.prio}", 0) + t.payload
    out.update(sorted(by_class.items()))  # drops and DLCP trims by traffic class (traced ones)
    out["engine"] = "ns3"
    out["cc"] = config.cc
    out["ecmp_hash"] = topology.ecmp_hash
    out["lb"] = config.lb
    out["rx"] = config.rx
    out.update(switch_link_load(topology, tx_bytes(channels)))
    out["approximations"] = config.approximations()
    out["decompose"] = config.decompose_settings()
    return out


def tx_bytes(channels: Iterable[ChannelRow]) -> Mapping[int, int]:
    """Channel id -> bytes it transmitted."""
    return {row[0]: row[4] for row in channels}


def channel_usage(channels: Iterable[ChannelRow], elapsed_ns: int) -> list[PacketChannelUsage]:
    """Per-channel bytes, pauses, marks and utilisation over `elapsed_ns`, used channels only."""
    rows = []
    for channel, src, dst, bw, nbytes, packets, paused, marks, max_queue in channels:
        if not packets:
            continue
        util = nbytes * 8e9 / (bw * elapsed_ns) if elapsed_ns > 0 else 0.0
        rows.append(PacketChannelUsage(channel, src, dst, bw, nbytes, packets, paused, marks, max_queue, util))
    return rows
