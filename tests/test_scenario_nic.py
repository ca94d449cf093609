"""nic_down (issue 36): the endpoint's flows fail over to another NIC where it has one, else they stall and the run
says so; which NIC is named by index or by its switch. Closed forms on the flow engine; packet mode refuses a
nic_down on a several-NIC endpoint (no queue-pair failover there yet)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.faults import FaultyFlowSimulator
from phantora.netsim.packet_faults import check_packet_scenario
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


@pytest.mark.parametrize(
    ("nic", "text"), [("2", "has 2 NIC(s) (nic = 0 .. 1), got 2"), ('"spine9"', "no NIC to a switch named 'spine9'")]
)
def test_a_nic_that_does_not_exist_is_refused(nic: str, text: str) -> None:
    sc = parse_scenario(f'[[events]]\nkind = "nic_down"\nat = "0ns"\nrank = 1\nnic = {nic}\n', "sc.toml")
    with pytest.raises(InputError) as err:
        FaultyFlowSimulator(two_planes(), sc)
    assert text in str(err.value) and "sc.toml:1" in str(err.value) and "events[0].nic" in str(err.value)


def test_packet_mode_refuses_a_nic_down_on_a_several_nic_endpoint() -> None:
    sc = parse_scenario('[[events]]\nkind = "nic_down"\nat = "0ns"\nrank = 0\n', "sc.toml")
    with pytest.raises(InputError, match="has 2 NICs, needs the flow network"):
        check_packet_scenario(sc, two_planes())
    check_packet_scenario(sc, leaf_spine(2, 1, 1, nic_rate="100Gbps", nvswitch=False))  # one NIC: runs in ns-3
