"""What the packet engine ran by, as ns-3 reports it (`PhantoraNetwork::EffectiveParams`, issue 35).

Python hands ns-3 a `PacketConfig` as attribute texts (`PacketConfig.to_params`, one row of `NS3_ATTRIBUTES` per
field); a field left at None ("scale with the fabric") goes as the attribute's 0, and the C++ model resolves it on
the fabric it is installed on (a switch's buffer from its fastest port, ECN thresholds and headroom per port).
Python does not compute those defaults again: after `Finalize` the engine reads every attribute back from its
objects and reports what the defaults came to, and `EffectiveSettings` holds that report. `report()` maps it back
onto the config, field by field (`engine.json` in a run directory, `phantora.results.write.write_engine_json`), so
a `--set` field can be followed to the value ns-3 ran with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from phantora.netsim.packet_config import ENGINE_FIELDS, NS3_ATTRIBUTES, PacketConfig


@dataclass(frozen=True)
class PortSettings:
    """One switch port as resolved at install: line rate, ECN marking and PFC headroom."""

    rate_bps: int
    kmin_bytes: int
    kmax_bytes: int
    pmax: float
    headroom_bytes: int


@dataclass(frozen=True)
class SwitchSettings:
    """One packet switch as resolved at install: its shared buffer and its ports."""

    buffer_bytes: int
    ports: tuple[PortSettings, ...]

    @property
    def fastest_port_bps(self) -> int:
        return max((p.rate_bps for p in self.ports), default=0)

    def shared_pool_bytes(self, reserve_bytes: int) -> int:
        """The shared pool at an empty buffer: the buffer less every port's PFC headroom and reserve (negative when
        they take more than the buffer; `SwitchMmu::Threshold` then admits nothing past a reserve)."""
        return self.buffer_bytes - sum(p.headroom_bytes for p in self.ports) - reserve_bytes * len(self.ports)


@dataclass(frozen=True)
class EffectiveSettings:
    """The engine's report: every attribute as ns-3 holds it ("switch.BufferSize" -> "2000000"), the packet
    switches by node id, and the `PacketConfig` the engine was built from (its ECMP policy resolved)."""

    config: PacketConfig
    attributes: Mapping[str, str]
    switches: Mapping[int, SwitchSettings]

    @classmethod
    def parse(cls, config: PacketConfig, pairs: Iterable[tuple[str, str]]) -> EffectiveSettings:
        """`EffectiveParams()`'s (key, text) pairs: "scope.Attribute" and "switch/N/BufferBytes",
        "switch/N/P/{RateBps,Kmin,Kmax,Pmax,HeadroomBytes}"."""
        attributes: dict[str, str] = {}
        buffers: dict[int, int] = {}
        ports: dict[int, dict[int, dict[str, str]]] = {}
        for key, text in pairs:
            if not key.startswith("switch/"):
                attributes[key] = text
                continue
            parts = key.split("/")
            node = int(parts[1])
            if len(parts) == 3:
                buffers[node] = int(text)
            else:
                ports.setdefault(node, {}).setdefault(int(parts[2]), {})[parts[3]] = text
        switches = {}
        for node, buffer in buffers.items():
            rows = ports.get(node, {})
            switches[node] = SwitchSettings(
                buffer,
                tuple(
                    PortSettings(
                        int(r["RateBps"]), int(r["Kmin"]), int(r["Kmax"]), float(r["Pmax"]), int(r["HeadroomBytes"])
                    )
                    for _, r in sorted(rows.items())
                ),
            )
        return cls(config, attributes, switches)

    def to_pairs(self) -> list[tuple[str, str]]:
        """The inverse of `parse` (what crosses a process boundary: plain strings)."""
        out = list(self.attributes.items())
        for node, sw in sorted(self.switches.items()):
            out.append((f"switch/{node}/BufferBytes", str(sw.buffer_bytes)))
            for i, p in enumerate(sw.ports):
                at = f"switch/{node}/{i}/"
                out += [(at + "RateBps", str(p.rate_bps)), (at + "Kmin", str(p.kmin_bytes))]
                out += [(at + "Kmax", str(p.kmax_bytes)), (at + "Pmax", repr(p.pmax))]
                out.append((at + "HeadroomBytes", str(p.headroom_bytes)))
        return out

    def unshared_switches(self) -> dict[int, int]:
        """{node id: shared pool bytes} of the switches whose PFC threshold at an empty buffer (the shared pool
        >> `dt_shift`) is below one packet: with PFC on, every ingress queue past its reserve pauses its upstream
        port (a pause and a resume every few packets), whatever the load. Empty without PFC (or under CBFC)."""
        c = self.config
        if not c.pfc or c.cbfc:
            return {}
        packet = c.payload_bytes + c.header_bytes
        out = {}
        for node, sw in sorted(self.switches.items()):
            pool = sw.shared_pool_bytes(c.reserve_bytes)
            if max(pool, 0) >> c.dt_shift < packet:
                out[node] = pool
        return out

    def egress_bound_bytes(self, node: int) -> int:
        """The most one egress class queue of switch `node` can hold, from `SwitchMmu`'s rules (switch-mmu.cc).

        1. Every byte queued at an egress class was admitted at an ingress (port, class) of that class (`Receive`
           adds it there, `Dequeue` removes it: an ingress's `ingress` + `hdrm` is what it has queued), so the
           queue is at most the sum over the feeding ingresses of what each holds: its reserve (`ingress` up to
           `reserve_bytes`), its headroom (`Admit` keeps `hdrm` within its port's headroom) and its shared use s.
           Any port may feed (a reroute after a link change can send a packet back out of the port it came in by),
           so all N ports count.
        2. A packet of w bytes goes to the shared part only if s after it is at most the threshold before it,
           (P - S) >> dt_shift, P the pool (buffer less every port's headroom and reserve) and S the shared use of
           the whole switch before it, which includes s before it (at least s after it less w). So an ingress's
           s after any add satisfies s <= (P - S_others - s + w) / a, a = 2 ** dt_shift, that is
           s <= (P - S_others + w) / (a + 1); between adds s only falls.
        3. Order the ingresses by their last add: when ingress k last added, the ones before it held at least what
           they hold now (they have only drained since), so now s_k <= (P - F_{k-1} + w) / (a + 1), F_k the sum of
           the first k. F_k <= F_{k-1} + (P - F_{k-1} + w) // (a + 1), which rises with F_{k-1}, so F_N is at most
           G_N of that recursion from G_0 = 0: closed form (P + w)(1 - (a / (a + 1)) ** N), which ingresses that
           fill one after another, each to its threshold, approach (the symmetric equilibrium N P / (a + N) is
           below it). Shared use never passes P (each add takes at most (P - S) / a), so the shared term is
           min(P, G_N); w is the largest packet (payload, header and INT space).
        The bound is N x reserve + the ports' headroom + min(P, G_N) (P at most 0 leaves only reserve and headroom).
        Class 0 (control, trimmed headers) is outside the buffer's accounting and not bounded here.
        """
        c, sw = self.config, self.switches[node]
        pool = max(sw.shared_pool_bytes(c.reserve_bytes), 0)
        packet = c.payload_bytes + c.header_bytes + c.int_header_bytes
        shared = 0
        for _ in sw.ports:
            shared += max(pool - shared + packet, 0) // ((1 << c.dt_shift) + 1)
        return c.reserve_bytes * len(sw.ports) + sum(p.headroom_bytes for p in sw.ports) + min(pool, shared)

    def unmarkable_ports(self) -> dict[int, list[int]]:
        """{node id: port indexes} of the switch ports whose ECN kmin is at or above `egress_bound_bytes`: a queue
        marks only past kmin, so they never mark. Empty with ECN off, with no CC (`none`: nothing reacts to a
        mark) or under CBFC (credits, not the buffer, bound a queue); a switch of `unshared_switches` is left to
        that warning (every queue of it pauses past its reserve)."""
        c = self.config
        if not c.ecn or c.cc == "none" or c.cbfc:
            return {}
        out = {}
        unshared = self.unshared_switches()
        for node, sw in sorted(self.switches.items()):
            if node in unshared:
                continue
            bound = self.egress_bound_bytes(node)
            ports = [i for i, p in enumerate(sw.ports) if p.kmin_bytes >= bound]
            if ports:
                out[node] = ports
        return out

    def unmarkable_note(self, names: Mapping[int, str] | None = None) -> str | None:
        """One line naming the switches of `unmarkable_ports` (by `names`, else node id), or None."""
        bad = self.unmarkable_ports()
        if not bad:
            return None
        node, ports = next(iter(bad.items()))
        sw = self.switches[node]
        port = sw.ports[ports[0]]
        name = (names or {}).get(node, f"switch {node}")
        more = f" (and {len(bad) - 1} other switch{'es' if len(bad) > 2 else ''})" if len(bad) > 1 else ""
        return (
            f"ECN never marks at {len(ports)} of {name}'s {len(sw.ports)} ports{more}: their kmin "
            f"({port.kmin_bytes:,} B at {port.rate_bps / 1e9:g} Gb/s) is at or above the most one egress queue of "
            f"buffer_bytes={sw.buffer_bytes:,} can hold ({self.egress_bound_bytes(node):,} B: the reserve and PFC "
            f"headroom of every ingress and their shares of the pool under the dynamic threshold), so PFC pauses "
            f"before a packet is marked and cc={self.config.cc} never sees a mark there (raise buffer_bytes, or "
            f"lower kmin_map / kmax_map)"
        )

    def unshared_note(self, names: Mapping[int, str] | None = None) -> str | None:
        """One line naming the switches of `unshared_switches` (by `names`, else node id), or None."""
        bad = self.unshared_switches()
        if not bad:
            return None
        node = next(iter(bad))
        sw = self.switches[node]
        name = (names or {}).get(node, f"switch {node}")
        headroom = sum(p.headroom_bytes for p in sw.ports)
        reserve = self.config.reserve_bytes * len(sw.ports)
        more = f" (and {len(bad) - 1} other switch{'es' if len(bad) > 2 else ''})" if len(bad) > 1 else ""
        return (
            f"buffer_bytes={sw.buffer_bytes:,} leaves {name}{more} no shared buffer: its {len(sw.ports)} ports' PFC "
            f"headroom ({headroom:,} B) and reserve ({reserve:,} B) take {headroom + reserve:,} B, so every ingress "
            f"queue past its {self.config.reserve_bytes:,} B reserve pauses its upstream port, at any load (raise "
            f"buffer_bytes well above {headroom + reserve:,} B, or lower headroom_factor / headroom_bytes)"
        )

    def resolved(self) -> dict[str, Any]:
        """What the fabric-scaled defaults came to, by link rate (JSON keys): each switch's buffer by its fastest
        port's rate, and the ports' ECN kmin / kmax / pmax and PFC headroom by their rate (headroom also
        depends on the link's delay, so it is a sorted list of the distinct values); the switches without a shared
        buffer (`unshared_switches`: node id -> pool bytes)."""
        buffers: dict[int, set[int]] = {}
        kmin: dict[int, set[int]] = {}
        kmax: dict[int, set[int]] = {}
        pmax: dict[int, set[float]] = {}
        headroom: dict[int, set[int]] = {}
        for sw in self.switches.values():
            buffers.setdefault(sw.fastest_port_bps, set()).add(sw.buffer_bytes)
            for p in sw.ports:
                kmin.setdefault(p.rate_bps, set()).add(p.kmin_bytes)
                kmax.setdefault(p.rate_bps, set()).add(p.kmax_bytes)
                pmax.setdefault(p.rate_bps, set()).add(p.pmax)
                headroom.setdefault(p.rate_bps, set()).add(p.headroom_bytes)

        def one(table: Mapping[int, set[Any]]) -> dict[str, Any]:
            return {str(r): (min(v) if len(v) == 1 else sorted(v)) for r, v in sorted(table.items())}

        return {
            "switches": len(self.switches),
            "switch_buffer_bytes_by_fastest_port": one(buffers),
            "ecn_kmin_bytes": one(kmin),
            "ecn_kmax_bytes": one(kmax),
            "ecn_pmax": one(pmax),
            "headroom_bytes": {str(r): sorted(v) for r, v in sorted(headroom.items())},
            "switches_without_shared_buffer": {str(n): pool for n, pool in self.unshared_switches().items()},
        }

    def report(self) -> dict[str, Any]:
        """engine.json's "ns3": every PacketConfig field with the value the engine was given and the ns-3
        attribute(s) it became, as ns-3 holds them ("fields"; `cc_attrs` -> the CC's "cc.X"); the fields that
        shape the engine instead of setting an attribute ("engine_fields"); every attribute read back, those
        phantora does not set included ("attributes"); what the fabric-scaled defaults resolved to ("resolved")."""
        c = self.config
        fields: dict[str, Any] = {}
        for name, (paths, _kind) in NS3_ATTRIBUTES.items():
            fields[name] = {"value": _plain(getattr(c, name)), "attributes": {p: self.attributes.get(p) for p in paths}}
        cc_paths = sorted(k for k in self.attributes if k.startswith("cc."))
        fields["cc_attrs"] = {"value": dict(c.cc_attrs), "attributes": {p: self.attributes[p] for p in cc_paths}}
        return {
            "fields": fields,
            "engine_fields": {name: _plain(getattr(c, name)) for name in ENGINE_FIELDS},
            "attributes": dict(sorted(self.attributes.items())),
            "resolved": self.resolved(),
        }


def _plain(value: Any) -> Any:
    """A field's value as JSON (rate maps keyed by text)."""
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)  # type: ignore[arg-type]
    return value
