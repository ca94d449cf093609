"""The idle-fabric check of a packet-level run: did any traffic reach a switch?

The packet model's NVSwitch is a crossbar without PFC, ECN or congestion control (docs/packet-model.md), so a
run whose flows all stay inside the hosts (ranks that fit on one host) leaves the CC, the switch buffers and
PFC nothing to act on. When no flow crosses a switch, or under `IDLE_SHARE` of the bytes do, the run's summary
and results.json (`network.idle_fabric`) say so and name the settings that then had no effect.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phantora.netsim.base import Completion, Flow
    from phantora.netsim.packet_config import PacketConfig
    from phantora.topology.model import Topology

IDLE_SHARE = 0.01  # under this share of the bytes through a switch, the fabric is called (almost) idle

# --set fields that act only in the switches' fabric (buffers, PFC, ECN, CC inputs, load balancing, trimming)
FABRIC_ONLY_FIELDS = frozenset(
    {
        "pfc", "pfc_bytes", "buffer_bytes", "reserve_bytes", "resume_offset_bytes", "dt_shift", "headroom_factor",
        "headroom_bytes", "ecn", "kmin_map", "kmax_map", "pmax_map", "global_t", "cc_base_rtt_ns", "cc_bdp_bytes",
        "lb", "flowlet_gap_ns", "trim_bytes", "dlcp", "dlcp_bound",
        "thresholds_follow_rate",
    }
)  # fmt: skip


def _size(n: int) -> str:
    """Bytes for a message: 0 B, 512 B, 12.3 KB, 4.5 MB, 1.2 GB (decimal units)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def no_effect_settings(cc: str | None, sets: Sequence[str]) -> list[str]:
    """The given `--cc` and `--set FIELD=VALUE` options that act only where traffic crosses a switch."""
    out = [f"--cc {cc}"] if cc and cc != "none" else []
    for item in sets:
        name = item.split("=", 1)[0].strip()
        if name in FABRIC_ONLY_FIELDS or name.startswith("cc."):
            out.append(f"--set {item}")
    return out


def given_settings(packet: PacketConfig) -> tuple[str | None, list[str]]:
    """(cc, ["FIELD=VALUE", ...]): what of `packet` differs from the defaults among the fabric-only fields and the
    CC attributes, as `--set` would name it (`no_effect_settings`'s input, from an `EngineSpec`'s config)."""
    from phantora.netsim.packet_config import PacketConfig

    default = PacketConfig()
    sets = []
    for f in dataclasses.fields(packet):
        value = getattr(packet, f.name)
        if f.name in FABRIC_ONLY_FIELDS and value != getattr(default, f.name):
            sets.append(f"{f.name}={_setting_text(value)}")
    sets += [f"cc.{k}={v}" for k, v in packet.cc_attrs.items()]
    return packet.cc, sets


def _setting_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return " ".join(f"{k} {v}" for k, v in value.items())  # "rate value" pairs, as --set takes a map
    return str(value)


def idle_fabric(
    traffic: Mapping[str, int], cc: str | None, sets: Sequence[str], host_gpus: int | None = None, topology: str = ""
) -> dict[str, Any] | None:
    """results.json's `network.idle_fabric` for a packet-level run whose `traffic` ({"network": bytes between
    endpoints, "fabric": of those, through a switch}) left the fabric (almost) idle; None if it did not, or
    the counts are missing. `host_gpus` (the GPUs of a host) and the `topology` name go in the hint."""
    if "network" not in traffic or "fabric" not in traffic:
        return None
    total, fabric = int(traffic["network"]), int(traffic["fabric"])
    if total and fabric >= IDLE_SHARE * total:
        return None
    share = fabric / total if total else 0.0
    if not total:
        what = "no flow ran between two GPUs"
    elif not fabric:
        what = f"no flow crossed a switch; all {_size(total)} stayed inside the hosts, on NVLink"
    else:
        what = f"only {100 * share:.2f}% of the bytes ({_size(fabric)} of {_size(total)}) crossed a switch"
    settings = no_effect_settings(cc, sets)
    named = ", ".join(settings) if settings else "the congestion control, switch buffers and PFC"
    effect = "had no effect" if not fabric else "had next to no effect"
    on = f" on {topology}" if topology else ""
    per_host = f" ({host_gpus}{on})" if host_gpus else ""
    text = (
        f"the fabric was idle ({what}), so {named} {effect}. To study the network, use more ranks than one "
        f"host has GPUs{per_host}, or place them across the hosts (--placement spread, or a list of GPUs)"
    )
    return {"fabric_bytes": fabric, "network_bytes": total, "fabric_share": share, "no_effect": settings, "text": text}


def traffic_of(topology: Topology, completions: Iterable[Completion | Flow]) -> dict[str, int]:
    """{"network": bytes of the flows between two endpoints, "fabric": of those, whose route crosses a switch},
    counted from a run's completions or flows (replay, netsim, several jobs: what the coordinator counts for
    `run`).
    Whether a route crosses a switch does not depend on its ECMP choice, so each pair is routed once."""
    crosses: dict[tuple[int, int], bool] = {}
    network = fabric = 0
    for c in completions:
        if not c.size or c.src == c.dst:
            continue
        pair = (c.src, c.dst)
        through = crosses.get(pair)
        if through is None:
            route = topology.route(c.src, c.dst, 0)
            through = crosses[pair] = any(topology.nodes[topology.channel_ends(ch)[1]].kind == "switch" for ch in route)
        network += c.size
        fabric += c.size if through else 0
    return {"network": network, "fabric": fabric}


def idle_fabric_on(
    topology: Topology, traffic: Mapping[str, int], cc: str | None, sets: Sequence[str]
) -> dict[str, Any] | None:
    """`idle_fabric` with the hint's GPUs per host and name taken from `topology`."""
    hosts = Counter(n.host for n in topology.nodes if n.kind == "gpu" and n.host is not None)
    return idle_fabric(traffic, cc, sets, max(hosts.values()) if hosts else None, topology.name)
