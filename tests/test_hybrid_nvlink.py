"""Fluid NVLink beside the packet fabric (`--set nvlink=fluid`, phantora.netsim.hybrid; issue 13)."""

from __future__ import annotations

import numpy as np
import pytest

from phantora.collectives.decompose import decompose
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.errors import InputError, PhantoraError
from phantora.netsim.base import INF_NS, Completion, Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine, nvlink_efficiency
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.hybrid import FLUID, PACKET, FluidNvlinkSimulator
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.topology.loader import load_topology
from phantora.topology.model import Topology


def fsdp_like_dag(topo: Topology) -> list[Flow]:
    """An all-gather, a compute marker per rank (delay), then a reduce-scatter that waits on it: deps
    cross between NVLink and fabric flows and markers at every step."""
    ranks = tuple(range(topo.num_ranks))
    ag = decompose(Collective("all_gather", ranks, 3 << 20), topo, AlgoOptions("ring", "chunked", 2)).flows
    next_id = max(f.id for f in ag) + 1
    last: dict[int, int] = {}
    for f in ag:
        last[f.dst] = f.id
    markers = []
    for i, node in enumerate(sorted(last)):
        markers.append(Flow(next_id + i, node, node, 0, (last[node],), delay_ns=7_000 + 130 * i, tag="compute"))
    base = next_id + len(markers)
    rs = decompose(Collective("reduce_scatter", ranks, 5 << 20), topo, AlgoOptions("ring", "chunked", 2)).flows
    gate = {m.src: m.id for m in markers}
    out = []
    for f in rs:
        deps = tuple(d + base for d in f.deps) or (gate[f.src],)
        out.append(Flow(f.id + base, f.src, f.dst, f.size, deps, f.delay_ns, f.tag, f.priority, f.key))
    return ag + markers + out


def as_tuples(done: list[Completion]) -> list[tuple[int, int, int]]:
    return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)


def test_split_in_two_flow_engines_is_exactly_one_flow_engine() -> None:
    """NVLink and fabric channels are disjoint, so max-min over both sides equals max-min over all: the
    hand-over of cross-side dependencies must reproduce every start and end to the ns."""
    topo = load_topology("testbed16")
    flows = fsdp_like_dag(topo)
    one = FlowSimulator(topo)
    one.submit(flows, 0)
    want = as_tuples(one.drain())
    two = FluidNvlinkSimulator(FlowSimulator(topo), FlowSimulator(topo), payload_bytes=1000, header_bytes=48)
    sides = {two.side_of(f) for f in flows}
    assert sides == {PACKET, FLUID}
    two.submit(flows, 0)
    got = as_tuples(two.drain())
    assert got == want
    assert two.in_flight() == 0 and two.now() == max(e for _, _, e in want)


def test_each_packet_side_declares_whether_it_posts_a_flow_at_its_deps_ends() -> None:
    """The hybrid reads the packet side's declaration (`CompletionStepper.posts_at_dep_ends`), not a probe: the
    NIC-latency and decomposed engines post a flow at its deps' last end, ns-3 alone, reuse and the flow engine
    start it where it is handed over, so the hybrid holds such flows for them."""
    from phantora.netsim.decompose import DecomposedSimulator
    from phantora.netsim.nic_latency import NicLatencySimulator
    from phantora.netsim.packet import Ns3Simulator
    from phantora.netsim.reuse import ProfileReuseSimulator

    engines = (Ns3Simulator, ProfileReuseSimulator, FlowSimulator, NicLatencySimulator, DecomposedSimulator)
    assert [e.posts_at_dep_ends for e in engines] == [False, False, False, True, True]
    topo = load_topology("testbed16")

    class Chaining(FlowSimulator):
        posts_at_dep_ends = True

    for packet, chains in ((FlowSimulator(topo), False), (Chaining(topo), True)):
        two = FluidNvlinkSimulator(packet, FlowSimulator(topo), payload_bytes=1000, header_bytes=48)
        assert two.chains is chains


def test_advance_and_watching_step_as_one_engine() -> None:
    """advance(t) in slices and advance_watching stop where a single engine stops."""
    topo = load_topology("testbed16")
    flows = fsdp_like_dag(topo)
    one = FlowSimulator(topo)
    two = FluidNvlinkSimulator(FlowSimulator(topo), FlowSimulator(topo), payload_bytes=1000, header_bytes=48)
    for sim in (one, two):
        sim.submit(flows[:5], 0)
    watch = {flows[-1].id, flows[len(flows) // 2].id}
    a = one.advance(3_000)
    b = two.advance(3_000)
    assert as_tuples(a) == as_tuples(b) and one.now() == two.now() == 3_000
    for sim in (one, two):
        sim.submit(flows[5:], 3_000)
    a = one.advance_watching(INF_NS, watch)
    b = two.advance_watching(INF_NS, watch)
    assert as_tuples(a) == as_tuples(b) and one.now() == two.now()
    assert as_tuples(one.drain()) == as_tuples(two.drain())


def test_a_flow_waiting_on_a_flow_that_never_comes_is_reported() -> None:
    topo = load_topology("testbed16")
    two = FluidNvlinkSimulator(FlowSimulator(topo), FlowSimulator(topo), payload_bytes=1000, header_bytes=48)
    with pytest.raises(InputError, match="unknown flow"):
        two.submit([Flow(1, 0, 9, 100, deps=(77,))], 0)


def test_nvlink_mode_is_checked_and_named() -> None:
    with pytest.raises(InputError) as exc:
        apply_overrides(PacketConfig(), ["nvlink=wormhole"])
    assert exc.value.field == "nvlink"
    assert apply_overrides(PacketConfig(), ["nvlink=fluid"]).approximations() == ["nvlink=fluid"]
    assert PacketConfig().approximations() == []


def test_nvlink_efficiency_counts_headers_and_the_ack_stream() -> None:
    cfg = PacketConfig()
    assert nvlink_efficiency(cfg) == pytest.approx(1000 / (1000 + 48 + 48))
    assert nvlink_efficiency(PacketConfig(cc="hpcc")) == pytest.approx(1000 / (1000 + 90 + 90))
    assert nvlink_efficiency(PacketConfig(payload_bytes=4096, ack_interval=4)) == pytest.approx(4096 / (4096 + 48 + 12))


def fcts(done: list[Completion], topo: Topology, nvlink: bool) -> np.ndarray:
    return np.array(
        [c.end_ns - c.start_ns for c in done if c.size and (topo.shared_nvswitch(c.src, c.dst) is not None) == nvlink]
    )


def test_fluid_nvlink_against_the_full_packet_model(ns3_lib) -> None:
    """A 16-GPU ring all-reduce (2 hosts, NVLink inside, 400G fabric between): the makespan within 1 %,
    FCT p50 and p99 within 5 % on each side, for a fraction of the packet events."""
    runs = {}
    for mode in ("packet", "fluid"):
        topo = load_topology("testbed16")
        flows = decompose(
            Collective("all_reduce", tuple(range(16)), 8 << 20), topo, AlgoOptions("ring", "chunked", 0)
        ).flows
        sim = make_engine(EngineSpec("ns3", PacketConfig(cc="dcqcn", nvlink=mode)), topo)
        sim.submit(flows, 0)
        runs[mode] = (sim.drain(), sim.stats(), topo)
        sim.close()
    (exact, est, topo), (fluid, fst, _) = runs["packet"], runs["fluid"]
    span = max(c.end_ns for c in exact)
    assert abs(max(c.end_ns for c in fluid) - span) / span < 0.01
    for nv in (False, True):
        a, b = fcts(exact, topo, nv), fcts(fluid, topo, nv)
        assert len(a) == len(b) > 100
        for q in (50, 99):
            pa, pb = np.percentile(a, q), np.percentile(b, q)
            assert abs(pb - pa) / pa < 0.05, (nv, q, pa, pb)
    assert fst["approximations"] == ["nvlink=fluid"] and est["approximations"] == []
    assert fst["events"] < est["events"] / 2


def test_a_lone_nvlink_flow_takes_its_closed_form_time(ns3_lib) -> None:
    """size / (3.6 Tb/s x payload share) + two 25 ns hops, and the packet model agrees within 2 %."""
    size = 4 << 20
    ends = {}
    for mode in ("packet", "fluid"):
        sim = make_engine(EngineSpec("ns3", PacketConfig(nvlink=mode)), load_topology("testbed16"))
        sim.submit([Flow(1, 0, 1, size)], 0)
        ends[mode] = sim.drain()[0].end_ns
        sim.close()
    # a lone flow has no reverse data, but its own ACK stream does not slow it; the fluid stand-in charges
    # the ACKs of symmetric traffic, so it is slower than the packet model here by at most header/payload
    want = size * 8 / (3.6e12 * nvlink_efficiency(PacketConfig())) * 1e9 + 50
    assert ends["fluid"] == pytest.approx(want, abs=2)
    assert ends["packet"] == pytest.approx(want, rel=0.06)


def test_hybrid_refuses_stuck_flows() -> None:
    topo = load_topology("testbed16")
    two = FluidNvlinkSimulator(FlowSimulator(topo), FlowSimulator(topo), payload_bytes=1000, header_bytes=48)
    two.submit([Flow(1, 0, 9, 1000)], 0)
    two.drain()
    with pytest.raises(PhantoraError, match="did not drain"):
        two.submit([Flow(2, 0, 9, 10**9)], two.now())
        two.drain(limit_ns=two.now() + 10)


def test_netsim_refuses_fluid_nvlink_naming_the_field(capsys) -> None:
    from phantora.cli import main

    assert main(["netsim", "--network", "ns3", "-t", "hpcc/star8", "-f", "incast4", "--set", "nvlink=fluid"]) == 2
    err = capsys.readouterr().err
    assert "nvlink" in err and "run and replay" in err and "Traceback" not in err
