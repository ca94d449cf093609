"""One place that turns a network-mode name into a `NetworkSimulator`."""

from __future__ import annotations

from typing import Any

from phantora.errors import InputError
from phantora.netsim.base import NetworkSimulator
from phantora.topology.model import Topology

NETWORKS = ("flow", "ns3")


def make_engine(network: str, topo: Topology, **options: Any) -> NetworkSimulator:
    """`flow` -> FlowSimulator(topo, **options); `ns3` -> Ns3Simulator(topo, PacketConfig(**options)).

    For ns3, ``set`` (a list of ``FIELD=VALUE`` strings, as `--set` takes them) overrides the config, and
    ``calls`` (a path) records the run's call script for phantora-ns3-runner."""
    if network == "flow":
        from phantora.netsim.flow import FlowSimulator

        return FlowSimulator(topo, **options)
    if network == "ns3":
        from phantora.netsim.packet import Ns3Simulator
        from phantora.netsim.packet_config import PacketConfig

        overrides = options.pop("set", ())
        calls = options.pop("calls", None)
        config = options.pop("config", None) or PacketConfig(**options)
        if overrides:
            from phantora.netsim.packet_config import apply_overrides

            config = apply_overrides(config, overrides)
        if config.nvlink == "fluid":
            return fluid_nvlink(topo, config, calls)
        return with_reuse(Ns3Simulator(topo, config, calls=calls), config)
    raise InputError(f"unknown network mode {network!r} (known: {', '.join(NETWORKS)})", field="network")


def fluid_nvlink(topo: Topology, config: Any, calls: Any = None) -> NetworkSimulator:
    """ns-3 for the fabric, the flow engine for NVLink (phantora.netsim.hybrid), both on `topo`."""
    from phantora.netsim.flow import FlowSimulator
    from phantora.netsim.hybrid import FluidNvlinkSimulator
    from phantora.netsim.packet import Ns3Simulator

    ns3 = Ns3Simulator(topo, config, calls=calls)
    packet = with_reuse(ns3, config)
    fluid = FlowSimulator(topo, payload_efficiency=nvlink_efficiency(config), ecmp_hash=ns3.topology.ecmp_hash)
    return FluidNvlinkSimulator(packet, fluid, payload_bytes=config.payload_bytes, header_bytes=config.header_bytes)


def with_reuse(engine: Any, config: Any) -> Any:
    """`engine` itself, or with ``reuse=on`` wrapped in a `ProfileReuseSimulator` (phantora.netsim.reuse). Under
    nvlink=fluid it wraps the packet side only, so the fluid NVLink side stays as it is."""
    if config.reuse != "on":
        return engine
    from phantora.netsim.reuse import ProfileReuseSimulator

    return ProfileReuseSimulator(engine)


def nvlink_efficiency(config: Any) -> float:
    """Payload share of an NVLink port's line rate in the packet model, for its fluid stand-in: every data
    packet carries a header (+ INT when on), and the port also carries the ACKs of the data it receives,
    one header-sized packet per `ack_interval` packets (NVLink collectives send as much as they receive)."""
    from phantora.netsim.cc_registry import wants_int

    int_on = config.int_mode == "on" or (config.int_mode == "auto" and wants_int(config.cc))
    header = config.header_bytes + (config.int_header_bytes if int_on else 0)
    return config.payload_bytes / (config.payload_bytes + header + header / config.ack_interval)
