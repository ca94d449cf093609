"""One DAG's flows on an idle topology through both engines: the flow network at the packets' goodput (what headers
leave of the links, `flow_goodput`) and ns-3 (packet mode), each checked to deliver every flow and all its bytes."""

from __future__ import annotations

from phantora.netsim.base import Flow
from phantora.topology import Topology


def flow_and_ns3_end_ns(topo: Topology, flows: list[Flow]) -> dict[str, int]:
    """The last completion (ns) of `flows` submitted at 0, by engine ("flow", "ns3"); asserts that each engine
    completes every flow once and delivers the flows' bytes."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine

    times = {}
    for name, spec in (("flow", EngineSpec(network="flow", flow_goodput=True)), ("ns3", EngineSpec(network="ns3"))):
        sim = make_engine(spec, topo)
        try:
            sim.submit(flows, at=0)
            done = sim.drain()
        finally:
            sim.close()
        assert len(done) == len(flows), name
        assert sum(c.size for c in done) == sum(f.size for f in flows), name
        times[name] = max(c.end_ns for c in done)
    return times


def start_end_ns(network: str, topo: Topology, flows: list[Flow], cc: str = "dcqcn") -> dict[int, tuple[int, int]]:
    """Flow id -> (start, end) ns of `flows` submitted at 0 on `network` ("flow" or "ns3" with `cc`); asserts that
    every flow completes once."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.packet_config import PacketConfig

    sim = make_engine(EngineSpec(network=network, packet=PacketConfig(cc=cc)), topo)
    try:
        sim.submit(flows, at=0)
        done = {c.flow_id: (c.start_ns, c.end_ns) for c in sim.drain()}
    finally:
        sim.close()
    assert len(done) == len(flows)
    return done
