"""Engines for every command, including the one the models layer cannot build: decomposition.

`make_engine` is `phantora.netsim.factory.make_engine`, except that an ns-3 config with ``workers=N`` gets
nvlink=fluid over a `phantora.netsim.decompose.DecomposedSimulator` whose workers are network server processes
(`bridge.workers.spawn_workers`, the spawner the bridge hands it).
"""

from __future__ import annotations

from typing import Any

from phantora.netsim import factory
from phantora.netsim.base import NetworkSimulator
from phantora.topology.model import Topology


def make_engine(network: str, topo: Topology, **options: Any) -> NetworkSimulator:
    """As `phantora.netsim.factory.make_engine`; ``workers=N`` (in the options or in ``set``) decomposes."""
    if network == "ns3" and options.get("side") is None:
        calls = options.pop("calls", None)
        config = factory.packet_config(options)
        if config.workers:
            from bridge.workers import spawn_workers
            from phantora.netsim.decompose import decomposed_engine

            return decomposed_engine(topo, config, spawn_workers)  # type: ignore[no-any-return]
        return factory.make_engine(network, topo, config=config, calls=calls)
    return factory.make_engine(network, topo, **options)
