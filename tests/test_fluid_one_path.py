"""A component whose flows all cross one path (a GPU pair's NVLink channels) gets its max-min rates in closed form,
no solver: k flows get the link's capacity / k each and end at the closed-form time, and the closed form is bit for
bit what progressive filling gives."""

from __future__ import annotations

import random
from types import SimpleNamespace

from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator, one_path_rate
from phantora.netsim.maxmin import maxmin_python
from phantora.topology.loader import load_topology

SIZE = 900_000  # bytes: 2,000 ns alone on a 3.6 Tb/s NVLink port (450 bytes/ns)
LINK = 450.0  # bytes/ns
HOPS_NS = 50  # GPU -> NVSwitch -> GPU, 25 ns a hop


def test_k_flows_on_one_nvlink_path_share_it_evenly(solver_calls):
    topo = load_topology("leafspine1024")  # 8 GPUs a host on one NVSwitch
    flows: list[Flow] = []
    expect: dict[int, int] = {}
    for k in range(1, 9):  # host k - 1: GPU 0 -> GPU 1 of it, k flows at once
        g = 8 * (k - 1)
        for _ in range(k):
            expect[len(flows)] = k * 2_000 + HOPS_NS
            flows.append(Flow(len(flows), g, g + 1, SIZE))
    sim = FlowSimulator(topo)
    sim.submit(flows, at=0)
    sim.advance(1)
    rates = sim.rates()
    for k in range(1, 9):
        mine = [f.id for f in flows if f.src == 8 * (k - 1)]
        assert [rates[i] for i in mine] == [LINK / k] * k
    got = {c.flow_id: c.end_ns for c in sim.drain()}
    assert got == expect
    assert solver_calls == []  # every component was one path: closed forms only


def test_a_flow_joining_a_path_halves_its_rate(solver_calls):
    """A alone for 1,000 ns (450,000 B), then A and B at 225 B/ns: A's last 450,000 B end at 3,000 ns, B's
    first 450,000 B too, and B's rest alone at 450 B/ns by 4,000 ns."""
    topo = load_topology("leafspine1024")
    sim = FlowSimulator(topo)
    sim.submit([Flow(0, 0, 1, SIZE)], at=0)
    assert sim.advance(1_000) == []
    sim.submit([Flow(1, 0, 1, SIZE)], at=1_000)
    got = {c.flow_id: (c.start_ns, c.end_ns) for c in sim.drain()}
    assert got == {0: (0, 3_000 + HOPS_NS), 1: (1_000, 4_000 + HOPS_NS)}
    assert solver_calls == []


def test_closed_form_is_progressive_fillings_value_bit_for_bit():
    rng = random.Random(11)
    caps = [rng.choice((100.0, 300.0, 450.0, 1e3 / 3, 12.5e9 / 8e9 * 0.97)) for _ in range(40)]
    for _ in range(2_000):
        path = tuple(rng.sample(range(40), rng.randint(1, 5)))
        k = rng.randint(1, 64)
        recs = [SimpleNamespace(solve_path=path) for _ in range(k)]
        want = maxmin_python([path] * k, caps)
        assert one_path_rate(recs, caps) == want[0]  # type: ignore[arg-type]
        assert len(set(want)) == 1


def test_not_one_path_is_left_to_the_solver():
    caps = [100.0, 200.0, 300.0]
    assert one_path_rate([SimpleNamespace(solve_path=(0, 1)), SimpleNamespace(solve_path=(0, 2))], caps) is None  # type: ignore[list-item]
    assert one_path_rate([SimpleNamespace(solve_path=(1, 1))], caps) is None  # type: ignore[list-item]
    assert one_path_rate([SimpleNamespace(solve_path=(2, 0, 2))], caps) is None  # type: ignore[list-item]
