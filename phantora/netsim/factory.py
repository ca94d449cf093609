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
        return Ns3Simulator(topo, config, calls=calls)
    raise InputError(f"unknown network mode {network!r} (known: {', '.join(NETWORKS)})", field="network")
