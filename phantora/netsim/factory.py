"""One place that turns a network-mode name into a `NetworkSimulator`."""

from __future__ import annotations

from typing import Any

from phantora.errors import InputError
from phantora.netsim.base import NetworkSimulator
from phantora.topology.model import Topology

NETWORKS = ("flow", "ns3")


def make_engine(network: str, topo: Topology, **options: Any) -> NetworkSimulator:
    """`flow` -> FlowSimulator(topo, **options); `ns3` -> Ns3Simulator(topo, PacketConfig(**options)).
    ``scenario`` (a `phantora.netsim.scenario.Scenario`) gives the flow engine under it (`netsim.faults`).

    For ns3, ``set`` (a list of ``FIELD=VALUE`` strings, as `--set` takes them) overrides the config,
    ``calls`` (a path) records the run's call script for phantora-ns3-runner, and ``side="packet"`` builds the
    packet side only (no fluid NVLink around it: what a decomposition worker hosts). Decomposition
    (``workers=N``) starts processes, so the bridge builds it (`bridge.engines.make_engine`)."""
    scenario = options.pop("scenario", None)  # a phantora.netsim.scenario.Scenario or its file (docs/scenarios.md)
    if isinstance(scenario, str):
        from phantora.netsim.scenario import read_scenario

        scenario = read_scenario(scenario)
    if scenario is not None:
        if network != "flow":
            raise InputError(
                "a scenario runs on the flow network only for now (packet mode has no link events yet)",
                field="scenario",
            )
        from phantora.netsim.faults import scenario_engine

        return scenario_engine(topo, scenario, **options)
    if network == "flow":
        from phantora.netsim.flow import FlowSimulator

        return FlowSimulator(topo, **options)
    if network == "ns3":
        from phantora.netsim.packet import Ns3Simulator

        side = options.pop("side", None)
        calls = options.pop("calls", None)
        config = packet_config(options)
        if side == "packet":
            return packet_side(Ns3Simulator(topo, config, calls=calls), config)
        if config.workers:
            raise InputError(
                f"workers={config.workers} (decomposition) starts worker processes: build it with "
                "bridge.engines.make_engine (phantora replay and run do)",
                field="workers",
            )
        if config.nvlink == "fluid":
            return fluid_nvlink(topo, config, calls)
        return packet_side(Ns3Simulator(topo, config, calls=calls), config)
    raise InputError(f"unknown network mode {network!r} (known: {', '.join(NETWORKS)})", field="network")


def packet_config(options: dict[str, Any]) -> Any:
    """The PacketConfig of `make_engine`'s ns3 options: ``config`` or the fields, then the ``set`` overrides."""
    from phantora.netsim.packet_config import PacketConfig, apply_overrides

    overrides = options.pop("set", ())
    config = options.pop("config", None) or PacketConfig(**options)
    return apply_overrides(config, overrides) if overrides else config


def packet_side(ns3: Any, config: Any) -> Any:
    """The packet side over one ns-3 engine: with ``nic_latency`` > 0 a `NicLatencySimulator`, with ``reuse=on``
    a `ProfileReuseSimulator` (they do not combine), else the engine itself."""
    if config.nic_latency:
        from phantora.netsim.nic_latency import NicLatencySimulator

        return NicLatencySimulator(ns3, config.nic_latency)
    return with_reuse(ns3, config)


def fluid_nvlink(topo: Topology, config: Any, calls: Any = None, packet: Any = None) -> NetworkSimulator:
    """ns-3 for the fabric, the flow engine for NVLink (phantora.netsim.hybrid), both on `topo`. `packet`: a
    packet side built elsewhere (a decomposed one), else one ns-3 engine."""
    from phantora.netsim.flow import FlowSimulator
    from phantora.netsim.hybrid import FluidNvlinkSimulator
    from phantora.netsim.packet import Ns3Simulator

    if packet is None:
        packet = packet_side(Ns3Simulator(topo, config, calls=calls), config)
    fluid = FlowSimulator(topo, payload_efficiency=nvlink_efficiency(config), ecmp_hash=packet.topology.ecmp_hash)
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
