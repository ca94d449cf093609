"""nic_down (issue 36): the endpoint's flows fail over to another NIC where it has one, else they stall and the run
says so; which NIC is named by index or by its switch. Closed forms on the flow engine; in packet mode the NIC moves
its queue pairs to the port routing picks at re-convergence: both engines make the same choice and count the same
stalls."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.faults import FaultyFlowSimulator
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.packet_faults import FaultyNs3Simulator, check_packet_scenario
from phantora.netsim.scenario import parse_scenario
from phantora.results.scenario import format_scenario, scenario_results
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

G = 10**9
LAT = 1000
RATE = 100 * G


def two_planes() -> Topology:
    """Two GPUs, each with two NICs: NIC 0 to plane0, NIC 1 to plane1 (100G, 1 us links)."""
    topo = Topology(name="planes")
    g = [topo.add_node("gpu", f"gpu{i}") for i in range(2)]
    sw = [topo.add_node("switch", f"plane{i}") for i in range(2)]
    for p in sw:
        for x in g:
            topo.add_link(x, p, RATE, LAT)
    topo.validate()
    return topo


def plane_of(topo: Topology, flow: Flow) -> str:
    path = topo.route(flow.src, flow.dst, flow.id)
    return topo.nodes[topo.channel_ends(path[0])[1]].name


def tx(size: Fraction | int) -> Fraction:
    return Fraction(size) * 8 * G / RATE


@pytest.mark.parametrize("by", ["index", "switch"])
def test_a_nic_down_fails_over_to_the_other_nic(by: str) -> None:
    """The NIC a 4 MB flow leaves by fails at t1; after the re-convergence delay d the flow finishes through the
    other NIC at line rate: t1 + d + (S - sent + lost) / R + 2 hops, exactly; the NIC it does not use changes
    nothing."""
    topo = two_planes()
    size, t1, d = 4_000_000, 100_000, 20_000
    flow = Flow(0, topo.endpoints[0], topo.endpoints[1], size)
    used = plane_of(topo, flow)
    nic = str(int(used[-1])) if by == "index" else f'"{used}"'
    body = f'reconvergence = "{d}ns"\n[[events]]\nkind = "nic_down"\nat = "{t1}ns"\nrank = 0\nnic = {nic}\n'
    sim = FaultyFlowSimulator(topo, parse_scenario(body, "sc.toml"))
    sim.submit([flow], at=0)
    (c,) = sim.drain()
    sent = t1 / tx(1)
    lost = min(sent, Fraction(RATE, 8 * G) * LAT)  # the bytes on the dead wire
    assert c.end_ns == t1 + d + math.ceil(tx(size - sent + lost)) + 2 * LAT
    st = sim.stats()
    assert st["rerouted_flows"] == 1 and st["no_route_flows"] == 0 and st["lost_bytes"] == round(lost)
    other = 1 - int(used[-1])
    idle = FaultyFlowSimulator(topo, parse_scenario(body.replace(f"nic = {nic}", f"nic = {other}"), "sc.toml"))
    idle.submit([flow], at=0)
    assert idle.drain()[0].end_ns == math.ceil(tx(size)) + 2 * LAT


def test_a_one_nic_endpoint_stalls_and_the_run_says_so() -> None:
    """On a one-NIC GPU the flow waits for the NIC to come back (down D from 0: it ends D later) and the
    scenario's results count it and say why."""
    topo = leaf_spine(2, 1, 1, nic_rate="100Gbps", latency="1us", nvswitch=False)
    sc = parse_scenario(
        'reconvergence = "5us"\n[[events]]\nkind = "nic_down"\nat = "0ns"\nrank = 0\nduration = "300us"\n', "sc.toml"
    )
    sim = FaultyFlowSimulator(topo, sc)
    size = 1_000_000
    sim.submit([Flow(0, topo.endpoints[0], topo.endpoints[1], size)], at=0)
    done = sim.drain()
    assert done[0].end_ns == 300_000 + math.ceil(tx(size)) + 4 * LAT
    res = scenario_results(sc, topo, sim, ml_done=done)
    assert res["no_route_flows"] == 1
    assert "1 flows stalled with no route left" in format_scenario(res)


def test_no_route_flows_counts_each_flow_once_and_those_that_start_with_no_route() -> None:
    """GPU 0's only NIC is down from 0 for 300 us; an unrelated uplink flaps (two more re-convergences). Flow A, on
    the wire at the failure, has no route at three re-convergences and counts once; flow B starts at 100 us, after
    routing re-converged with no route for it, stalls at once and counts too: no_route_flows 2, one stall each; the
    reroute rows say how many flows each re-convergence left with no route."""
    topo = leaf_spine(2, 1, 2, nic_rate="100Gbps", latency="1us", nvswitch=False)
    sc = parse_scenario(
        'reconvergence = "5us"\n[[events]]\nkind = "nic_down"\nat = "0ns"\nrank = 0\nduration = "300us"\n'
        '[[events]]\nkind = "link_down"\nat = "50us"\nlink = ["leaf1", "spine1"]\nduration = "10us"\n',
        "sc.toml",
    )
    g = topo.endpoints
    sim = FaultyFlowSimulator(topo, sc)
    sim.submit([Flow(0, g[0], g[1], 1_000_000)], at=0)
    sim.advance(100_000)
    sim.submit([Flow(1, g[0], g[1], 1_000_000)], at=100_000)
    assert len(sim.drain()) == 2
    st = sim.stats()
    assert (st["no_route_flows"], st["stalls"]) == (2, 2)
    assert [e.stalled for e in sim.applied if e.op == "reroute"] == [1, 1, 1, 0]


@pytest.mark.parametrize(
    ("nic", "text"), [("2", "has 2 NIC(s) (nic = 0 .. 1), got 2"), ('"spine9"', "no NIC to a switch named 'spine9'")]
)
def test_a_nic_that_does_not_exist_is_refused(nic: str, text: str) -> None:
    sc = parse_scenario(f'[[events]]\nkind = "nic_down"\nat = "0ns"\nrank = 1\nnic = {nic}\n', "sc.toml")
    with pytest.raises(InputError) as err:
        FaultyFlowSimulator(two_planes(), sc)
    assert text in str(err.value) and "sc.toml:1" in str(err.value) and "events[0].nic" in str(err.value)


EFF = 1000 / 1048  # payload share of the line in packet mode (1000 B payload, 48 B headers)


@pytest.mark.ns3
def test_packet_mode_fails_over_to_the_same_nic_as_the_flow_engine(ns3_lib) -> None:
    """The NIC a 4 MB flow leaves by fails at t1 (re-convergence d): after the event both engines route it (and
    every key) by the other NIC, both count one flow stalled by the failure, one moved and none left without a route;
    ns-3 moved its queue pair (one failover) and the flow ends within 2% of the flow engine's (which is exact)."""
    topo = two_planes()
    size, t1, d = 4_000_000, 100_000, 20_000
    flow = Flow(0, topo.endpoints[0], topo.endpoints[1], size)
    used = plane_of(topo, flow)
    body = f'reconvergence = "{d}ns"\n[[events]]\nkind = "nic_down"\nat = "{t1}ns"\nrank = 0\nnic = "{used}"\n'
    sc = parse_scenario(body, "sc.toml")
    check_packet_scenario(sc, topo)  # a several-NIC endpoint runs in ns-3
    fluid = FaultyFlowSimulator(topo, sc, payload_efficiency=EFF)
    fluid.submit([flow], at=0)
    (cf,) = fluid.drain()
    a, b = topo.endpoints
    with FaultyNs3Simulator(topo, sc, PacketConfig()) as sim:
        sim.submit([flow], at=0)
        (cp,) = sim.drain()
        packet_routes = [tuple(sim.route(a, b, k)) for k in range(8)]
        st = sim.stats()
        rows = [(e.op, e.stalled, e.moved) for e in sim.applied_so_far()]
    fluid_routes = [tuple(fluid.topology.route(a, b, k)) for k in range(8)]
    assert packet_routes == fluid_routes
    assert {topo.nodes[topo.channel_ends(r[0])[1]].name for r in packet_routes} == {"plane0", "plane1"} - {used}
    assert rows == [(e.op, e.stalled, e.moved) for e in fluid.applied] == [("down", 1, 0), ("reroute", 0, 1)]
    assert (st["nic_failovers"], st["rerouted_flows"], st["no_route_flows"], st["stalls"]) == (1, 1, 0, 1)
    assert fluid.stats()["stalls"] == 1
    assert cp.end_ns == pytest.approx(cf.end_ns, rel=0.02)


@pytest.mark.ns3
def test_packet_mode_stalls_a_one_nic_endpoint_and_says_so(ns3_lib) -> None:
    """A one-NIC GPU's NIC down for D: in both engines the failure stalls the flow, the re-convergence leaves it with
    no route (its reroute row and no_route_flows say 1, and the run's summary), and it completes after the repair."""
    topo = leaf_spine(2, 1, 1, nic_rate="100Gbps", latency="1us", nvswitch=False)
    sc = parse_scenario(
        'reconvergence = "5us"\n[[events]]\nkind = "nic_down"\nat = "10us"\nrank = 0\nduration = "300us"\n', "sc.toml"
    )
    flow = Flow(0, topo.endpoints[0], topo.endpoints[1], 1_000_000)
    fluid = FaultyFlowSimulator(topo, sc, payload_efficiency=EFF)
    fluid.submit([flow], at=0)
    fluid.drain()
    with FaultyNs3Simulator(topo, sc, PacketConfig()) as sim:
        sim.submit([flow], at=0)
        (cp,) = sim.drain()
        st = sim.stats()
        rows = [(e.op, e.stalled) for e in sim.applied_so_far()]
        said = format_scenario(scenario_results(sc, topo, sim, ml_done=[cp]))
    assert "1 flows stalled with no route left" in said and "1 stalls" in said
    want = [("down", 1), ("reroute", 1), ("up", 0), ("reroute", 0)]
    assert rows == [(e.op, e.stalled) for e in fluid.applied] == want
    assert st["no_route_flows"] == fluid.stats()["no_route_flows"] == 1
    assert st["stalls"] == fluid.stats()["stalls"] == 1 and st["nic_failovers"] == 0
    assert cp.end_ns > 310_000 + 5_000
