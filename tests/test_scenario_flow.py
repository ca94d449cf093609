"""The flow engine under a scenario (issue 36): link failures, re-convergence, flaps and degrades, closed forms."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from phantora.errors import InputError, PhantoraError
from phantora.netsim.base import Flow
from phantora.netsim.faults import FaultyFlowSimulator
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.scenario import parse_scenario
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

G = 10**9
LAT = 1000  # every link: 1 us


def fabric() -> Topology:
    """2 leaves x 2 GPUs, 2 spines; 100G NICs, 100G uplinks (non-blocking); 1 us links, no NVSwitch."""
    return leaf_spine(2, 2, 2, nic_rate="100Gbps", latency="1us", nvswitch=False)


def scenario(body: str, reconvergence: str = "0ns"):
    return parse_scenario(f'reconvergence = "{reconvergence}"\n' + body, "test.toml")


def tx(size: float, bps: int) -> Fraction:
    return Fraction(size) * 8 * G / bps


def uplink_of(topo: Topology, flow: Flow) -> tuple[str, str]:
    """The (leaf, spine) names of the uplink a flow's ECMP route takes."""
    path = topo.route(flow.src, flow.dst, flow.id if flow.key is None else flow.key)
    a, b = topo.channel_ends(path[1])
    return topo.nodes[a].name, topo.nodes[b].name


def other_spine(name: str) -> str:
    return "spine1" if name == "spine0" else "spine0"


def run(sim: FlowSimulator, flows: list[Flow]) -> dict[int, tuple[int, int]]:
    sim.submit(flows, at=0)
    return {c.flow_id: (c.start_ns, c.end_ns) for c in sim.drain()}


def test_no_event_is_the_plain_engine() -> None:
    topo = fabric()
    g = topo.endpoints
    flows = [Flow(i, g[i % 2], g[2 + (i // 2) % 2], 1_000_000 + 7919 * i) for i in range(8)]
    plain = run(FlowSimulator(topo), flows)
    faulty = run(FaultyFlowSimulator(topo, scenario("")), flows)
    assert plain == faulty


@pytest.mark.parametrize("delay_ns", [0, 20_000])
def test_failed_uplink_reroutes_at_line_rate(delay_ns: int) -> None:
    """One 100G flow; its leaf uplink fails at t1: it stalls for the re-convergence delay, loses the bytes on
    the dead wire (rate x 1 us), and finishes on the other spine at line rate."""
    topo = fabric()
    g = topo.endpoints
    size, t1 = 4_000_000, 100_000
    flow = Flow(0, g[0], g[2], size)
    leaf, spine = uplink_of(topo, flow)
    sc = scenario(f'[[events]]\nkind = "link_down"\nat = "{t1}ns"\nlink = ["{leaf}", "{spine}"]\n', f"{delay_ns}ns")
    sim = FaultyFlowSimulator(topo, sc)
    (start, end) = run(sim, [flow])[0]
    rate = 100 * G
    sent = tx(1, rate) ** -1 * t1  # bytes by t1
    lost = min(sent, Fraction(rate, 8 * G) * LAT)
    want = t1 + delay_ns + math.ceil(tx(size - sent + lost, rate)) + 4 * LAT
    assert start == 0 and end == want
    st = sim.stats()
    assert st["lost_bytes"] == round(lost) and st["rerouted_flows"] == 1
    assert st["rerouted_bytes"] == round(size - sent + lost)
    assert [e.op for e in sim.applied] == ["down", "reroute"]
    assert (sim.applied[1].moved, sim.applied[1].moved_bytes) == (1, st["rerouted_bytes"])  # per action


def test_two_flows_share_the_remaining_uplink_max_min() -> None:
    """Two cross-leaf flows from leaf0 on different spines; spine0's uplink from leaf0 fails with no delay:
    both then cross leaf0-spine1 (100G), and max-min gives each 50G."""
    topo = fabric()
    g = topo.endpoints
    flows = []
    for key in range(200):  # find ECMP keys that put gpu0->gpu2 and gpu1->gpu3 on different spines
        f0, f1 = Flow(0, g[0], g[2], 10**7, key=key), Flow(1, g[1], g[3], 10**7, key=key + 1000)
        if uplink_of(topo, f0)[1] != uplink_of(topo, f1)[1]:
            flows = [f0, f1]
            break
    assert flows
    dead = next(f for f in flows if uplink_of(topo, f)[1] == "spine0")
    sc = scenario('[[events]]\nkind = "link_down"\nat = "0ns"\nlink = ["leaf0", "spine0"]\n')
    sim = FaultyFlowSimulator(topo, sc)
    sim.submit(flows, at=0)
    sim.advance(10)
    assert sim.rates() == pytest.approx({0: 50 * G / 8e9, 1: 50 * G / 8e9}, rel=1e-12)
    done = {c.flow_id: c.end_ns for c in sim.drain()}
    assert done[0] == done[1] == math.ceil(tx(10**7, 50 * G)) + 4 * LAT
    assert sim.stats()["rerouted_flows"] == 1 and dead.id in done


def test_flap_without_traffic_or_delay_changes_nothing() -> None:
    topo = fabric()
    g = topo.endpoints
    flows = [Flow(i, g[i % 4], g[(i + 2) % 4], 500_000 * (i + 1), deps=(i - 1,) if i else ()) for i in range(6)]
    flows.append(Flow(9, g[1], g[3], 2_000_000, delay_ns=3_000_000))  # after the flaps
    body = '[[events]]\nkind = "link_flap"\nat = "0ns"\nlink = ["leaf0", "spine0"]\nperiod = "1ms"\nduty = 0.5\n'
    body += 'count = 2\n[[events]]\nkind = "link_down"\nat = "2500us"\nlink = ["leaf1", "spine1"]\n'
    body += 'duration = "100us"\n'
    # the traffic before the flaps is over by the time they start: shift it after them
    late = [Flow(f.id, f.src, f.dst, f.size, f.deps, f.delay_ns + (3_000_000 if not f.deps else 0)) for f in flows]
    assert run(FlowSimulator(topo), late) == run(FaultyFlowSimulator(topo, scenario(body)), late)


def test_degrade_changes_capacity_then_restores() -> None:
    """A NIC link degraded to 25G for 100 us: the flow runs at 100G, 25G, then 100G again."""
    topo = fabric()
    g = topo.endpoints
    sc = scenario(
        '[[events]]\nkind = "link_degrade"\nat = "100us"\nduration = "100us"\nlink = ["gpu0", "leaf0"]\n'
        'rate = "25Gbps"\n'
    )
    size = 4_000_000
    end = run(FaultyFlowSimulator(topo, sc), [Flow(0, g[0], g[2], size)])[0][1]
    sent = tx(1, 100 * G) ** -1 * 100_000 + tx(1, 25 * G) ** -1 * 100_000
    assert end == 200_000 + math.ceil(tx(size - sent, 100 * G)) + 4 * LAT


def test_degrade_loss_is_goodput_and_counted() -> None:
    topo = fabric()
    g = topo.endpoints
    sc = scenario('[[events]]\nkind = "link_degrade"\nat = "0ns"\nlink = ["gpu0", "leaf0"]\nloss = 0.2\n')
    sim = FaultyFlowSimulator(topo, sc)
    size = 1_000_000
    end = run(sim, [Flow(0, g[0], g[2], size)])[0][1]
    assert end == math.ceil(tx(size, 80 * G)) + 4 * LAT
    assert sim.stats()["lost_bytes"] == pytest.approx(size * 0.25, rel=1e-3)


def test_nic_down_stalls_until_it_comes_back() -> None:
    topo = fabric()
    g = topo.endpoints
    sc = scenario('[[events]]\nkind = "nic_down"\nat = "0ns"\nrank = 0\nduration = "1ms"\n', "10us")
    size = 1_000_000
    end = run(FaultyFlowSimulator(topo, sc), [Flow(0, g[0], g[2], size)])[0][1]
    assert end == 1_000_000 + math.ceil(tx(size, 100 * G)) + 4 * LAT
    forever = scenario('[[events]]\nkind = "nic_down"\nat = "0ns"\nrank = 0\n')
    with pytest.raises(PhantoraError, match="stalled for good"):
        run(FaultyFlowSimulator(topo, forever), [Flow(0, g[0], g[2], size)])


def test_switch_down_moves_everything_to_the_other_spine() -> None:
    topo = fabric()
    g = topo.endpoints
    flows = [Flow(i, g[i % 2], g[2 + i % 2], 2_000_000, key=i) for i in range(8)]
    sc = scenario('[[events]]\nkind = "switch_down"\nat = "0ns"\nswitch = "spine0"\n')
    sim = FaultyFlowSimulator(topo, sc)
    run(sim, flows)
    used = {c.link for c in sim.channel_usage() if c.bytes > 0}
    spine0 = next(n.id for n in topo.nodes if n.name == "spine0")
    assert not any(spine0 in (topo.links[x].a, topo.links[x].b) for x in used)


def test_deterministic_and_bytes_add_up() -> None:
    topo = fabric()
    g = topo.endpoints
    flows = [Flow(i, g[i % 4], g[(i + 1 + i // 4) % 4], 300_000 + 1009 * i, key=i) for i in range(40)]
    flows = [f for f in flows if f.src != f.dst]
    body = (
        '[[events]]\nkind = "link_flap"\nat = "20us"\nlink = ["leaf0", "spine1"]\nperiod = "50us"\nduty = 0.3\n'
        'count = 4\n[[events]]\nkind = "link_degrade"\nat = "30us"\nlink = ["leaf1", "spine0"]\n'
        'rate = "40Gbps"\nextra_latency = "2us"\n'
    )
    outs = []
    for _ in range(2):
        sim = FaultyFlowSimulator(topo, scenario(body, "5us"), verify=True)
        outs.append((run(sim, flows), sim.stats(), [(e.t_ns, e.op, e.moved, e.stalled) for e in sim.applied]))
        nic_bytes = sum(c.bytes for c in sim.channel_usage() if topo.nodes[c.src].kind == "gpu")
        st = sim.stats()
        assert st["lost_bytes"] > 0  # the NICs sent every byte once, and the lost ones again
        assert abs(nic_bytes - sum(f.size for f in flows) - st["lost_bytes"]) <= 2 * st["stalls"]
    assert outs[0] == outs[1]


def test_scenario_names_must_exist_in_the_topology() -> None:
    sc = scenario('[[events]]\nkind = "link_down"\nat = "1ms"\nlink = ["leaf0", "spine7"]\n')
    with pytest.raises(InputError) as err:
        FaultyFlowSimulator(fabric(), sc)
    assert err.value.file == "test.toml" and err.value.line == 2 and err.value.field == "events[0].link"
