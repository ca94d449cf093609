"""`EngineSpec`: the network engine of a run, whole and validated, as one frozen value.

Every entry point (run, replay, netsim, nccl-tests, jobs, sweep's runs) builds one from its command line
(`phantora.netsim.cli_config.engine_spec_from_flags`) and hands it down unchanged: the launcher puts it in the
bridge's `RunSpec`, which carries it over the wire as plain data (`to_dict`/`from_dict`, msgpack), and
`phantora.netsim.factory.make_engine(spec, topo)` is the one place that turns it into an engine. A `--set`
field is therefore parsed once, and can be followed from the flag to `PacketConfig` to the ns-3 attribute
(`packet_config.NS3_ATTRIBUTES`) through this object.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from phantora.errors import InputError
from phantora.netsim.packet_config import PacketConfig

NETWORKS = ("flow", "ns3")
DEFAULT_NETWORK = "flow"
# The co-simulation window W: the network may run ahead of the ranks by up to W (an error of up to W per
# dependent collective). 0 = exact, the default in both modes (docs/bridge.md, "Defaults").
DEFAULT_WINDOW_NS = 0
# "" = the whole engine; "packet" = the packet side only (a decomposition worker's); "hybrid": the fluid NVLink hybrid
# over it, driven by rounds (a decomposition worker that also runs its hosts' NVLink: `netsim.hybrid_worker`)
SIDES = ("", "packet", "hybrid")
FLOW_FIELDS = ("ecmp_hash", "lb")  # the PacketConfig fields the flow network honours too (docs/flow-engine.md)


@dataclass(frozen=True)
class EngineSpec:
    """The network engine: its mode, its packet config (the flow engine reads `FLOW_FIELDS` of it), the
    co-simulation window, a scenario file, and two build switches (`flow_goodput`, `side`)."""

    network: str = DEFAULT_NETWORK
    packet: PacketConfig = field(default_factory=PacketConfig)
    window_ns: int = DEFAULT_WINDOW_NS
    scenario: str | None = None  # a scenario TOML (docs/scenarios.md): link events and background traffic
    flow_goodput: bool = False  # flow: links carry payload only, at packet/(packet+header) of line rate (netsim)
    side: str = ""  # "packet": the packet side only, no fluid NVLink around it (what a decomposition worker hosts)

    def __post_init__(self) -> None:
        if self.network not in NETWORKS:
            raise InputError(f"unknown network mode {self.network!r} (known: {', '.join(NETWORKS)})", field="network")
        if not isinstance(self.packet, PacketConfig):
            raise InputError(f"expected a PacketConfig, got {type(self.packet).__name__}", field="packet")
        w = self.window_ns
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise InputError(f"window must be an integer >= 0 ns (0 = exact), got {w!r}", field="window_ns")
        if self.side not in SIDES:
            raise InputError(f"expected '', 'packet' or 'hybrid', got {self.side!r}", field="side")
        if self.side and self.network != "ns3":
            raise InputError(f"side={self.side} is a packet engine's part", field="side")

    @property
    def packet_used(self) -> PacketConfig | None:
        """The packet config the engine runs by (config.json records it): ns3's, or the flow engine's when it runs
        at the config's goodput (`flow_goodput`); else None (the flow engine reads only `FLOW_FIELDS` of it)."""
        return self.packet if self.network == "ns3" or self.flow_goodput else None

    @property
    def nic_latency_ns(self) -> int:
        """The NIC latency each network flow pays before its first packet (ns3's ``nic_latency``; 0 elsewhere)."""
        return self.packet.nic_latency if self.network == "ns3" else 0

    @property
    def nic_on_nvlink(self) -> bool:
        """Whether a flow inside one NVSwitch pays `nic_latency_ns` too: ns-3 carries it (nvlink=packet)."""
        return self.packet.nvlink != "fluid"

    @property
    def ecmp_hash(self) -> str | None:
        """The ECMP policy asked for (None: the topology's own)."""
        return self.packet.ecmp_hash

    def flow_options(self) -> dict[str, Any]:
        """`FlowSimulator`'s keyword options: ECMP policy, load balancing, payload efficiency."""
        p = self.packet
        out: dict[str, Any] = {"ecmp_hash": p.ecmp_hash, "lb": p.lb}
        if self.flow_goodput:
            out["payload_efficiency"] = p.payload_bytes / (p.payload_bytes + p.header_bytes)
        return out

    def replace(self, **changes: Any) -> EngineSpec:
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (msgpack: the packet config's rate maps keep integer keys)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["packet"] = {f.name: getattr(self.packet, f.name) for f in dataclasses.fields(self.packet)}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineSpec:
        """The inverse of `to_dict` (also of its JSON form); every field validated again (InputError naming it)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError(f"unknown engine spec field(s): {', '.join(unknown)}", field=unknown[0])
        packet = dict(d.get("packet") or {})
        names = {f.name for f in dataclasses.fields(PacketConfig)}
        extra = sorted(set(packet) - names)
        if extra:
            raise InputError(f"unknown PacketConfig field(s): {', '.join(extra)}", field=f"packet.{extra[0]}")
        for name in RATE_MAPS:  # JSON (config.json) makes the rate keys strings
            if isinstance(packet.get(name), dict):
                packet[name] = {_rate_key(k, name): v for k, v in packet[name].items()}
        return cls(**{**d, "packet": PacketConfig(**packet)})


RATE_MAPS = ("kmin_map", "kmax_map", "pmax_map")  # PacketConfig's maps keyed by a link rate (bit/s, int)


def _rate_key(key: Any, name: str) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        raise InputError(f"a rate in bit/s must key the map, got {key!r}", field=f"packet.{name}") from None
