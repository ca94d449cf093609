"""The hybrid's fluid side reads the flows that ended on either side from one done set (`FluidNvlinkSimulator._ended`
is its fluid engine's), so a fluid flow keeps a short deps list whole when handed over; its drained completions
come in order without a sort when the steps give them so (`in_order`); the flow engine reuses the last freed rate
cap pseudo-channel. Each checked against one flow engine carrying the same traffic, to the ns, and against closed
forms."""

from __future__ import annotations

import random

from phantora.netsim.base import Completion, Flow, completion
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.hybrid import FLUID, PACKET, FluidNvlinkSimulator, in_order
from phantora.netsim.maxmin import maxmin_python
from phantora.topology.loader import load_topology
from tests.random_dags import MIB, gpus_by_host, random_dag

HOSTS = gpus_by_host("testbed16")


def key(done: list[Completion]) -> list[tuple[int, int, int]]:
    return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)


def test_the_hybrid_over_two_flow_engines_is_one_flow_engine_with_deps_across_sides_and_batches() -> None:
    """Random DAGs over both sides (fluid flows after fabric flows, fabric flows after fluid ones, markers, wide
    lists), submitted in two batches, the second after the first drained (its flows wait on flows done on either
    side): every start and end that of one flow engine carrying all of them (NVLink and fabric channels are
    disjoint, so max-min over both sides is max-min over all), each fluid re-solve checked against a full one."""
    topo = load_topology("testbed16")
    rng = random.Random(5)
    crossed = 0
    for trial in range(12):
        first = random_dag(rng, HOSTS, 0, rng.randint(20, 70), [], markers=0.1, wide=0.1)
        second = random_dag(rng, HOSTS, len(first), rng.randint(10, 40), [f.id for f in first], markers=0.1, wide=0.1)
        one = FlowSimulator(topo)
        fluid = FlowSimulator(topo, verify=True)
        two = FluidNvlinkSimulator(FlowSimulator(topo), fluid, payload_bytes=1000, header_bytes=48)
        side = {f.id: two.side_of(f) for f in first + second}
        crossed += sum(1 for f in first + second for d in f.deps if side[d] != side[f.id])
        for sim in (one, two):
            sim.submit(first, 0)
        want, got = one.drain(), two.drain()
        assert key(got) == key(want), trial
        assert got == in_order(got)  # (drained in (end, id) order, as one engine's)
        for sim in (one, two):
            sim.submit(second, sim.now() + 500)
        assert key(two.drain()) == key(one.drain()), trial
        assert two.in_flight() == 0
    assert crossed > 100  # (deps across the sides, often)


def test_a_fluid_flow_after_a_fabric_flow_starts_at_its_end_with_its_deps_kept() -> None:
    """A 1 MiB fabric flow (400 Gb/s NIC: 20,971.52 ns, so 20,972, + its hops) and an NVLink flow after it and after
    an NVLink flow of its host: the fluid engine gets the flow itself (no copy without the fabric dep, which it
    reads as done) and starts it at the later end, 1 MiB at its 400 Gb/s cap after that."""
    topo = load_topology("testbed16")
    fluid = FlowSimulator(topo)
    two = FluidNvlinkSimulator(FlowSimulator(topo), fluid, payload_bytes=1000, header_bytes=48)
    fabric = Flow(0, 8, 0, MIB)
    nvlink = Flow(1, 1, 0, 4096, rate_bps=400_000_000_000)
    after = Flow(2, 0, 2, MIB, (0, 1), rate_bps=400_000_000_000)
    assert [two.side_of(f) for f in (fabric, nvlink, after)] == [PACKET, FLUID, FLUID]
    two.submit([fabric, nvlink, after], 0)
    done = {c.flow_id: c for c in two.drain()}
    one = FlowSimulator(topo)
    one.submit([fabric, nvlink, after], 0)
    alone = {c.flow_id: c for c in one.drain()}
    assert done[2].start_ns == max(done[0].end_ns, done[1].end_ns) == done[0].end_ns
    hops = done[2].end_ns - done[2].start_ns - (-(-MIB * 8 * 1_000_000_000 // 400_000_000_000))
    assert hops == 50  # GPU -> NVSwitch -> GPU, 25 ns a hop
    assert {i: (c.start_ns, c.end_ns) for i, c in done.items()} == {i: (c.start_ns, c.end_ns) for i, c in alone.items()}
    assert 0 in fluid._done  # (the hybrid's ends are the fluid engine's done set)


def test_in_order_returns_the_list_itself_when_ordered_else_sorted_by_end_then_id() -> None:
    ordered = [completion(i, 0, end, 1, 0, 1) for i, end in ((3, 10), (5, 10), (1, 20), (0, 30))]
    assert in_order(ordered) is ordered
    mixed = [ordered[1], ordered[0], ordered[3], ordered[2]]
    assert [c.flow_id for c in in_order(mixed)] == [3, 5, 1, 0]
    assert in_order([]) == []


def test_max_min_rates_do_not_depend_on_the_channel_ids() -> None:
    """Why reusing the last freed rate cap pseudo-channel (not the lowest) changes no rate: progressive filling over
    the same paths with every channel renamed gives the same rates bit for bit (random capped problems)."""
    rng = random.Random(3)
    for _ in range(200):
        nch = rng.randint(2, 12)
        cap = [rng.choice([50.0, 100.0, 450.0, rng.uniform(1.0, 500.0)]) for _ in range(nch)]
        paths = [rng.sample(range(nch), rng.randint(1, min(4, nch))) for _ in range(rng.randint(1, 20))]
        ids = list(range(100, 100 + nch))
        rng.shuffle(ids)
        renamed_cap = [0.0] * (100 + nch)
        for c, new in enumerate(ids):
            renamed_cap[new] = cap[c]
        renamed = [[ids[c] for c in p] for p in paths]
        assert maxmin_python(renamed, renamed_cap) == maxmin_python(paths, cap)
