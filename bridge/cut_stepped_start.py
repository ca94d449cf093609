"""Start stepped partition workers: local processes (`bridge.cut_stepped_pool`) or Ray actors'
(`bridge.cut_stepped_ray`), as the packet configuration asks."""

from __future__ import annotations

from bridge.cut_stepped_pool import SteppedPool
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.model import Topology


def spawn_stepped(topology: Topology, config: PacketConfig, assignment: list[list[int]]) -> SteppedPool:
    """Start `config.partition` stepped partition workers (the assignment is one logical worker: ignored): local
    processes, or with `config.ray` processes that Ray actors start."""
    if config.ray:
        from bridge.cut_stepped_ray import RaySteppedPool  # (Ray is imported only when asked for)

        return RaySteppedPool(topology, config)
    return SteppedPool(topology, config)
