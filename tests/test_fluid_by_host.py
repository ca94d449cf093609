"""The hybrid's fluid NVLink side solves max-min by host (its components), never carried: NVLink flows of two hosts
share no channel. A ring inside each of leafspine1024's 128 hosts (1,024 flows, the flow engine's carrying
threshold) ends at the closed-form time, one host's late flow halves a rate there alone, and the flow engine on its
own (which carries here) gives every completion to the ns."""

from __future__ import annotations

from phantora.netsim.base import Completion, Flow
from phantora.netsim.flow import CARRY_FLOWS, FlowSimulator
from phantora.netsim.hybrid import FluidNvlinkSimulator
from phantora.topology.loader import load_topology

SIZE = 900_000  # bytes: 2,000 ns alone on a 3.6 Tb/s NVLink port (450 bytes/ns)
HOPS_NS = 50  # GPU -> NVSwitch -> GPU, 25 ns a hop
HOSTS, GPUS = 128, 8


def rings() -> list[Flow]:
    """GPU i -> i + 1 (mod 8) in every host: each flow alone on its two NVLink channels."""
    firsts = [h * GPUS for h in range(HOSTS)]
    return [Flow(g + i, g + i, g + (i + 1) % GPUS, SIZE) for g in firsts for i in range(GPUS)]


def run(sim: FluidNvlinkSimulator | FlowSimulator) -> list[tuple[int, int, int]]:
    sim.submit(rings(), 0)
    done: list[Completion] = sim.advance(1_000)
    sim.submit([Flow(HOSTS * GPUS, 0, 1, SIZE)], 1_000)  # host 0's GPU 0 -> 1 again: it shares ring flow 0's path
    done += sim.drain()
    return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)


def test_fluid_side_solves_by_host_and_ends_at_closed_forms() -> None:
    topo = load_topology("leafspine1024")
    assert HOSTS * GPUS >= CARRY_FLOWS
    fluid = FlowSimulator(topo)
    sim = FluidNvlinkSimulator(FlowSimulator(topo), fluid, payload_bytes=4096, header_bytes=48)
    got = run(sim)
    # flow 0 alone for 1,000 ns (450,000 B), then 225 B/ns beside the late flow: both have 450,000 B left at 3,000
    # ns, flow 0 none; the late flow's rest alone by 4,000 ns. Every other flow alone: 2,000 ns.
    want = [(i, 0, (3_000 if i == 0 else 2_000) + HOPS_NS) for i in range(HOSTS * GPUS)]
    want.append((HOSTS * GPUS, 1_000, 4_000 + HOPS_NS))
    assert got == want
    assert fluid.stats()["carried_resolves"] == 0
    alone = FlowSimulator(topo)
    assert run(alone) == want
    assert alone.stats()["carried_resolves"]  # (the flow engine alone carries this traffic)
