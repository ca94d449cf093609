"""The fluid NVLink side's reaction to a packet completion (`FluidNvlinkSimulator.reaction_ns`), and wide deps lists.

A stepped packet side (`phantora.netsim.partition_stepped`) runs its workers up to a reacting completion + this
reaction, so it must be a lower bound on the ns between the completion and the first flow handed to the packet side
because of it. On testbed16 an NVLink flow of 3.6 MB crosses two 3.6 Tb/s channels of 25 ns each: its least time
from release to completion (`_fluid_step`) is 3.6e6 x 8 / 3.6e12 s = 8,000 ns, - 2 ns (the fluid engine's rounding
allowance), + 50 ns of propagation = 8,048 ns.
"""

from __future__ import annotations

from phantora.collectives.decompose import decompose
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.netsim.base import INF_NS, Completion, Flow, Observed
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.hybrid import SHARED_DEPS_MIN, FluidNvlinkSimulator
from phantora.topology.loader import load_topology

NVLINK_STEP = 3_600_000 * 8_000_000_000 // 3_600_000_000_000 - 2 + 2 * 25  # 8,048 ns


def hybrid(packet: FlowSimulator | None = None) -> FluidNvlinkSimulator:
    topo = load_topology("testbed16")
    return FluidNvlinkSimulator(packet or FlowSimulator(topo), FlowSimulator(topo), payload_bytes=1000, header_bytes=48)


def test_a_fluid_waiter_counts_its_step_plus_its_own_reaction() -> None:
    """g0 -> g8 crosses the fabric (packet side); g8 -> g9 is NVLink (fluid). An NVLink flow waiting on the fabric
    flow hands nothing over while nothing waits on it (INF_NS: the workers need not stop); a marker of 500 ns after
    it, then a fabric flow after the marker: 8,048 + 500 ns; a fabric flow straight after the NVLink flow: 8,048
    ns; a fabric flow held on a fabric flow held here (after the NVLink flow): 0 for that one. Each placement is
    seen (the values are kept between placements)."""
    sim = hybrid()
    sim.submit([Flow(1, 0, 8, 1 << 20), Flow(2, 8, 9, 3_600_000, deps=(1,))], 0)
    assert sim.reacts_to(1) and sim.reaction_ns(1) == INF_NS
    sim.submit([Flow(3, 9, 9, 0, deps=(2,), delay_ns=500)], 0)  # a marker: a compute step of 500 ns
    assert sim.reaction_ns(1) == INF_NS
    sim.submit([Flow(4, 9, 1, 1 << 20, deps=(3,))], 0)
    assert sim.reaction_ns(1) == NVLINK_STEP + 500
    sim.submit([Flow(5, 9, 2, 1 << 20, deps=(2,))], 0)
    assert sim.reaction_ns(1) == NVLINK_STEP
    sim.submit([Flow(6, 8, 0, 1 << 20, deps=(2,)), Flow(7, 0, 9, 1 << 20, deps=(6,))], 0)  # 6 held: so is 7
    assert sim.reaction_ns(6) == 0 and sim.reaction_ns(1) == NVLINK_STEP
    assert not sim.reacts_to(7) and sim.reaction_ns(7) == INF_NS
    done = {c.flow_id: c for c in sim.drain()}
    # the bounds held: each hand-over came at least its reaction after the completion that caused it
    assert done[4].start_ns >= done[1].end_ns + NVLINK_STEP + 500
    assert done[5].start_ns >= done[1].end_ns + NVLINK_STEP


def two_all_to_alls() -> list[Flow]:
    """Two all-to-alls over testbed16's 16 GPUs (both hosts: NVLink and fabric flows), each flow of the second
    waiting on every flow of the first (240 deps, a wide list)."""
    topo = load_topology("testbed16")
    algo = AlgoOptions("direct", "coarse", model="ideal")
    first = decompose(Collective("all_to_all", tuple(range(16)), 16 << 20), topo, algo).flows
    ids = tuple(f.id for f in first)
    base = max(ids) + 1
    second = decompose(Collective("all_to_all", tuple(range(16)), 16 << 20), topo, algo).flows
    return [*first, *(Flow(f.id + base, f.src, f.dst, f.size, deps=tuple(ids)) for f in second)]


def test_wide_deps_lists_across_sides_run_as_one_engine() -> None:
    """The second all-to-all's flows each wait on both sides (read once per list and batch): every start and end
    as one flow engine's, with a packet side that starts flows where handed over and one that chains them."""
    flows = two_all_to_alls()
    assert min(len(f.deps) for f in flows[240:]) == 240 >= SHARED_DEPS_MIN
    one = FlowSimulator(load_topology("testbed16"))
    one.submit(flows, 0)
    want = sorted((c.flow_id, c.start_ns, c.end_ns) for c in one.drain())

    class Chaining(FlowSimulator):
        posts_at_dep_ends = True

    for packet in (FlowSimulator(load_topology("testbed16")), Chaining(load_topology("testbed16"))):
        sim = hybrid(packet)
        sim.submit(flows, 0)
        got: list[Completion] = sim.drain()
        assert sorted((c.flow_id, c.start_ns, c.end_ns) for c in got) == want
        assert sim.in_flight() == 0


def test_a_watch_changed_in_place_between_calls_is_seen() -> None:
    """A caller may grow its watch set in place between `advance_watching` calls (`step_events`, `drain_watching`
    shrink theirs): the reaction to the fabric flow counts the NVLink flow once it is watched (its step, 8,048 ns),
    where it counted none before, though the set is the same object."""
    topo = load_topology("testbed16")
    seen: list[int] = []

    class Probe(FlowSimulator):
        def advance_to_completion(self, until: int) -> list[Completion]:
            seen.append(sim.reaction_ns(1))
            return super().advance_to_completion(until)

    sim = FluidNvlinkSimulator(Probe(topo), FlowSimulator(topo), payload_bytes=1000, header_bytes=48)
    sim.submit([Flow(1, 0, 8, 1 << 20), Flow(2, 8, 9, 3_600_000, deps=(1,)), Flow(3, 1, 9, 1 << 20)], 0)
    watch = {3}
    sim.advance_watching(1_000, watch)
    assert seen and set(seen) == {INF_NS}
    watch.add(2)
    seen.clear()
    sim.advance_watching(2_000, watch)
    assert seen and set(seen) == {NVLINK_STEP}


def test_a_progress_displays_flows_are_watched_but_not_reacted_to() -> None:
    """A caller that watches a flow to submit at its completion makes it a reacting one (reaction 0: stepped
    workers stop exactly there); a progress display's `Observed` flows (`drain_observed`) submit nothing, so the
    packet side may run past them (INF_NS), and the watch still returns at the completion: 1 MiB from g0 to g8 at
    400 Gb/s, 20,971.52 ns + 4 us of propagation over the four 1 us hops, the same either way."""
    seen: list[tuple[bool, int]] = []

    class Probe(FlowSimulator):
        def advance_to_completion(self, until: int) -> list[Completion]:
            seen.append((sim.reacts_to(1), sim.reaction_ns(1)))
            return super().advance_to_completion(until)

    ends = []
    for watch in ({1}, Observed({1})):
        sim = hybrid(Probe(load_topology("testbed16")))
        sim.submit([Flow(1, 0, 8, 1 << 20), Flow(2, 1, 9, 4 << 20)], 0)
        got = sim.advance_watching(INF_NS, watch)
        assert [c.flow_id for c in got] == [1] and sim.now() == got[0].end_ns
        ends.append(got[0].end_ns)
    assert seen[0] == (True, 0) and seen[-1] == (False, INF_NS)
    assert ends[0] == ends[1] and abs(ends[0] - (4_000 + (1 << 20) * 8 / 400)) <= 2
