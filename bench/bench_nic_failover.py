"""NIC failover in both engines (issue 36, docs/scenarios.md): two GPUs with two NICs each on two switch planes
(100G, 1 us links); the NIC a 4 MB flow leaves by fails at t1 = 100 us, routes re-converge d = 20 us later and the
flow moves to the other NIC. Prints the flow's end in the flow engine (exact: t1 + d + (S - sent + lost) / R + 2
hops) and in ns-3 (default packet config), and what ns-3 lost, resent and moved.

    .venv/bin/python bench/bench_nic_failover.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.netsim.base import Flow
from phantora.netsim.faults import FaultyFlowSimulator
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.packet_faults import FaultyNs3Simulator
from phantora.netsim.scenario import parse_scenario
from phantora.topology.model import Topology

EFF = 1000 / 1048  # payload share of the line in packet mode
SIZE, T1, D = 4_000_000, 100_000, 20_000


def two_planes() -> Topology:
    topo = Topology(name="planes")
    gpus = [topo.add_node("gpu", f"gpu{i}") for i in range(2)]
    for p in range(2):
        plane = topo.add_node("switch", f"plane{p}")
        for g in gpus:
            topo.add_link(g, plane, 100 * 10**9, 1000)
    topo.validate()
    return topo


def main() -> int:
    topo = two_planes()
    flow = Flow(0, topo.endpoints[0], topo.endpoints[1], SIZE)
    first = topo.route(flow.src, flow.dst, flow.id)[0]
    used = topo.nodes[topo.channel_ends(first)[1]].name
    body = f'reconvergence = "{D}ns"\n[[events]]\nkind = "nic_down"\nat = "{T1}ns"\nrank = 0\nnic = "{used}"\n'
    sc = parse_scenario(body, "failover.toml")
    fluid = FaultyFlowSimulator(topo, sc, payload_efficiency=EFF)
    fluid.submit([flow], at=0)
    (cf,) = fluid.drain()
    with FaultyNs3Simulator(topo, sc, PacketConfig()) as sim:
        sim.submit([flow], at=0)
        (cp,) = sim.drain()
        st = sim.stats()
    print(f"flow engine end  {cf.end_ns / 1e3:.2f} us")
    print(f"ns-3 end         {cp.end_ns / 1e3:.2f} us ({(cp.end_ns - cf.end_ns) / cf.end_ns * 100:+.1f}%)")
    print(
        f"ns-3: lost {st['lost_bytes']:,} B, resent {st['retx_bytes']:,} B, moved {st['rerouted_bytes']:,} B, "
        f"{st['nic_failovers']} failover(s), {st['nacks']} NACK(s), {st['timeouts']} timeout(s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
