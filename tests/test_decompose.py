"""Decomposition of link-disjoint traffic into parallel ns-3 workers (issue 13, lever 3), and nic_latency.

The tiny fabric: 3 hosts x 2 GPUs, rail-optimised (GPU r of every host on rail leaf r, one spine). With
nvlink=fluid each rail is a piece; a DAG whose rails wait on each other through NVLink flows (and one
direct cross-rail dependency) must come out of 2 workers exactly as out of one engine: every start and
end, PFC frames, ECN marks, CNPs and per-channel counters, to the ns.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import astuple
from typing import Any

import pytest
import zmq

from bridge.workers import spawn_workers
from phantora.errors import InputError
from phantora.netsim.base import INF_NS, Flow
from phantora.netsim.decompose import DecomposedSimulator, WorkerDiedError
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.netsim.pieces import NO_PIECE, PieceRoutes, fabric_pieces, piece_of, route_in_piece
from phantora.topology.generators import rail_optimized
from phantora.topology.model import Topology

L_NS = 1000
QUIET_NS = 200_000
_G100 = 100_000_000_000
SETTINGS = {
    "cc": "dcqcn",
    "nvlink": "fluid",
    "nic_latency": L_NS,
    "payload_bytes": 4096,
    "header_bytes": 62,
    "kmin_map": {_G100: 20_000},  # low ECN thresholds: the incasts mark (RED draws from per-switch streams)
    "kmax_map": {_G100: 80_000},
}


def tiny() -> Topology:
    return rail_optimized(3, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="rail-3x2")


def gpu(topo: Topology, host: int, rail: int) -> int:
    return topo.node_of_rank(2 * host + rail)


def rail_dag(topo: Topology, stages: int = 3) -> list[Flow]:
    """Per stage and rail: an incast (hosts 0 and 1 -> host 2) that marks ECN; then on host 2 an NVLink flow to
    the other rail's GPU, which the other rail's next incast waits on; and one direct rail 0 -> rail 1 dep."""
    flows: list[Flow] = []
    nid = 0
    gate: dict[int, int | None] = {0: None, 1: None}
    for s in range(stages):
        nxt: dict[int, int | None] = {}
        for r in (0, 1):
            ids = []
            for h in (0, 1):
                g = gate[r]
                deps: tuple[int, ...] = () if g is None else (g,)
                size = (384 << 10) + 4096 * (7 * s + 3 * r + h)
                flows.append(Flow(nid, gpu(topo, h, r), gpu(topo, 2, r), size, deps, delay_ns=150 * h, key=nid))
                ids.append(nid)
                nid += 1
            flows.append(Flow(nid, gpu(topo, 2, r), gpu(topo, 2, 1 - r), 2 << 20, tuple(ids), key=nid))
            nxt[1 - r] = nid
            nid += 1
        gate = nxt
    # a direct cross-rail dependency: a rail 1 flow waits on the last rail 0 incast flow
    flows.append(Flow(nid, gpu(topo, 0, 1), gpu(topo, 1, 1), 200_000, (nid - 3,), key=nid))
    return flows


def outputs(sim: object) -> dict[str, object]:
    fab = sim.fabric()  # type: ignore[attr-defined]
    return {
        "pfc": sorted(map(astuple, fab.pfc_events())),
        "marks": sorted(map(astuple, fab.ecn_mark_events())),
        "cnps": sorted(map(astuple, fab.cnp_events())),
        "usage": sorted(
            (u.channel, u.bytes, u.packets, u.paused_ns, u.ecn_marks, u.max_queue_bytes) for u in fab.channel_usage()
        ),  # fmt: skip
        "transport": sorted(map(astuple, fab.flow_transport().values())),
    }


def test_pieces_of_a_rail_fabric_are_its_rails() -> None:
    topo = tiny()
    pieces = fabric_pieces(topo)
    assert {pieces[gpu(topo, h, r)] for h in range(3) for r in (0, 1)} == {0, 1}
    assert all(pieces[gpu(topo, h, 0)] == pieces[gpu(topo, 0, 0)] for h in range(3))
    kinds = {n.kind for n in topo.nodes if pieces[n.id] == NO_PIECE}
    assert kinds == {"nvswitch", "switch"}  # the NVSwitches and the spine


def test_a_cross_piece_flow_is_refused_naming_flow_ends_and_switch() -> None:
    topo = tiny()
    f = Flow(42, gpu(topo, 0, 0), gpu(topo, 1, 1), 1000)
    with pytest.raises(InputError) as err:
        piece_of(topo, fabric_pieces(topo), f)
    text = str(err.value)
    spine = next(n.name for n in topo.nodes if n.kind == "switch" and n.tier == 2)
    assert "flow 42" in text and topo.nodes[f.src].name in text and topo.nodes[f.dst].name in text
    assert spine in text


def _routed(topo: Topology, f: Flow) -> tuple[int, int, int]:
    piece, path = route_in_piece(topo, fabric_pieces(topo), f)
    return piece, topo.path_latency_ns(path), topo.path_bottleneck_bps(path)


def test_piece_routes_equal_each_flows_own_route_on_a_rail_fabric() -> None:
    topo = tiny()
    topo.use_ecmp(topo.ecmp_hash)
    routes = PieceRoutes(topo, fabric_pieces(topo))
    fid = 0
    for r in (0, 1):
        for a in range(3):
            for b in range(3):
                if a == b:
                    continue
                for key in (None, 7, 12345):
                    f = Flow(fid, gpu(topo, a, r), gpu(topo, b, r), 1000, key=key)
                    assert routes.of(f) == _routed(topo, f)
                    fid += 1
    # one leaf per rail: one route per pair, so every pair got a per-pair summary (3 GPUs x 2 peers x 2 rails)
    assert sum(s is not None for s in routes._pair.values()) == 12
    with pytest.raises(InputError, match="crosses pieces"):
        routes.of(Flow(99, gpu(topo, 0, 0), gpu(topo, 1, 1), 1000))


def test_piece_routes_route_each_flow_when_equal_cost_routes_differ() -> None:
    """Two equal-hop routes inside one piece with different propagation (1 vs 3 us) and bottleneck: the pair has
    no single summary, so each flow gets its own route's, and both occur."""
    topo = Topology("uneven", [], [])
    g0, g1 = topo.add_node("gpu", "g0"), topo.add_node("gpu", "g1")
    e0, e1 = topo.add_node("switch", "e0", tier=1), topo.add_node("switch", "e1", tier=1)
    a0, a1 = topo.add_node("switch", "a0", tier=2), topo.add_node("switch", "a1", tier=2)
    core = topo.add_node("switch", "core", tier=3)
    topo.add_link(g0, e0, _G100, 1000)
    topo.add_link(g1, e1, _G100, 1000)
    topo.add_link(e0, a0, _G100, 1000)
    topo.add_link(e1, a0, _G100, 1000)
    topo.add_link(e0, a1, _G100 // 2, 3000)
    topo.add_link(e1, a1, _G100, 1000)
    topo.add_link(a0, core, _G100, 1000)
    routes = PieceRoutes(topo, fabric_pieces(topo))
    seen = set()
    for key in range(40):
        f = Flow(key, g0, g1, 1000, key=key)
        got = routes.of(f)
        assert got == _routed(topo, f)
        seen.add(got[1:])
    assert seen == {(4000, _G100), (6000, _G100 // 2)}
    assert routes._pair[(g0, g1)] is None


def test_decomposition_needs_fluid_nvlink_and_a_latency() -> None:
    with pytest.raises(InputError, match="nvlink=fluid"):
        PacketConfig(workers=2, nic_latency=1000)
    with pytest.raises(InputError, match="nic_latency > 0"):
        PacketConfig(workers=2, nvlink="fluid")
    cfg = apply_overrides(PacketConfig(), ["nvlink=fluid", "nic_latency=1us", "workers=2"])
    assert (cfg.workers, cfg.nic_latency) == (2, 1000)


def test_the_commands_sample_queues_by_default_except_when_decomposed() -> None:
    """The CLI samples queues every 1 us unless told otherwise; a decomposed run cannot, so there the default is
    off (the README's `--set workers=2` line works as written), while an explicit request is refused."""
    from phantora.netsim.cli_config import QUEUE_SAMPLE_NS, packet_config_from_flags

    decomposed = ["nvlink=fluid", "nic_latency=1us", "workers=2"]
    assert packet_config_from_flags(sets=decomposed[:2]).queue_sample_ns == QUEUE_SAMPLE_NS
    assert packet_config_from_flags(sets=decomposed).queue_sample_ns == 0
    with pytest.raises(InputError, match="queue_sample_ns"):
        packet_config_from_flags(sets=decomposed, queue_sample_ns=500)
    with pytest.raises(InputError, match="queue_sample_ns"):
        packet_config_from_flags(sets=["queue_sample_ns=500", *decomposed])


def test_nic_latency_adds_exactly_l_to_an_isolated_flow() -> None:
    """A flow alone on the fabric: its first packet leaves L later, nothing else changes, so FCT(L) = FCT(0) + L."""
    topo = tiny()
    f = Flow(1, gpu(topo, 0, 0), gpu(topo, 2, 0), 1 << 20)
    fct = {}
    for lat in (0, 1700):
        sim = make_engine(EngineSpec("ns3", PacketConfig(cc="dcqcn", nic_latency=lat)), topo)
        sim.submit([f], 5000)
        (c,) = sim.drain()
        sim.close()
        assert c.start_ns == 5000
        fct[lat] = c.end_ns - c.start_ns
    assert fct[1700] == fct[0] + 1700


@pytest.fixture(scope="module")
def two_workers() -> Any:
    """One workers=2 engine on the tiny fabric, shared by the two tests below (starting two workers that load ns-3
    costs more than either test's own work): the equality test runs it from 0 ns, the killed-worker test after it."""
    sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2)), tiny(), spawner=spawn_workers)
    yield sim
    sim.close()


def test_two_workers_equal_one_engine_to_the_ns(two_workers: Any) -> None:
    topo = tiny()
    flows = rail_dag(topo, stages=2)
    one = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS)), topo)
    one.submit(flows, 0)
    want = sorted((c.flow_id, c.start_ns, c.end_ns) for c in one.drain())
    want_out = outputs(one)
    one.advance(one.now() + QUIET_NS)  # the last ACKs home: channel counters compare once the fabric is quiet
    want_usage = outputs(one)["usage"]
    one.close()
    assert len(want) == len(flows)
    assert want_out["marks"] and want_out["cnps"]  # the incasts do congest: the comparison is not vacuous

    sim = two_workers
    assert sim.now() == 0, "the shared workers=2 engine must come fresh to this test (the first to use it)"
    packet = sim.packet
    assert isinstance(packet, DecomposedSimulator) and len(packet.workers) == 2
    # the engine stays open for the killed-worker test, which checks that closing it leaves no orphans
    bad = Flow(10_000, gpu(topo, 0, 0), gpu(topo, 1, 1), 1000)
    with pytest.raises(InputError, match="flow 10000"):
        sim.submit([bad], 0)
    sim.submit(flows, 0)
    t0 = time.perf_counter()
    got = sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain())
    drain_wall = time.perf_counter() - t0
    assert got == want
    dec = sim.stats()["decompose"]
    # where the wall went: each round covers its slowest worker's serving; rounds and the time between them
    # fit in the drain
    assert 0 < dec["critical_wall_s"] <= dec["round_wall_s"]  # type: ignore[index]
    assert 0 <= dec["gather_wall_s"] <= dec["round_wall_s"]  # type: ignore[index]
    assert 0 <= dec["between_wall_s"]  # type: ignore[index]
    assert dec["round_wall_s"] + dec["between_wall_s"] <= drain_wall  # type: ignore[index]
    got_out = outputs(sim)
    del got_out["usage"], want_out["usage"]
    assert got_out == want_out  # event records up to now(), the same
    sim.advance(sim.now() + QUIET_NS)
    assert outputs(sim)["usage"] == want_usage
    stats = sim.stats()
    assert stats["decompose"]["workers"] == 2 and stats["decompose"]["rounds"] > 0  # type: ignore[index]
    assert len(stats["workers"]) == 2  # type: ignore[arg-type]
    assert "decompose" not in stats["approximations"]  # type: ignore[operator]
    assert stats["events"] == sum(w["events"] for w in stats["workers"])  # type: ignore[attr-defined, union-attr]


def test_a_killed_worker_ends_the_run_within_seconds_naming_it(two_workers: Any) -> None:
    """On the shared engine, at whatever time the equality test left it (or fresh, run alone): a long DAG under
    way, then a worker killed."""
    topo = tiny()
    sim = two_workers
    base, now = 1_000_000, sim.now()  # ids and times past anything the engine was given
    flows = [Flow(f.id + base, f.src, f.dst, f.size, tuple(d + base for d in f.deps), f.delay_ns, key=f.key)
             for f in rail_dag(topo, stages=40)]  # fmt: skip
    packet = sim.packet
    try:
        sim.submit(flows, now)
        sim.advance(now + 20_000)
        victim = packet.workers[1]
        os.kill(victim.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError, match=f"worker 1 \\(pid {victim.pid}"):
            sim.drain()
        assert time.monotonic() - t0 < 5.0
    finally:
        sim.close()
    assert all(w.proc is not None and w.proc.poll() is not None for w in packet.workers)


@pytest.mark.slow
def test_a_stopped_worker_ends_the_run_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker stopped mid-run (SIGSTOP: alive, no message, no CPU time) ends the round after the silence limit,
    named, and close() leaves no worker behind. Before, the driver waited for its reply without end."""
    import bridge.workers

    monkeypatch.setattr(bridge.workers, "WORKER_SILENCE_S", 2.0)
    topo = tiny()
    sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2)), topo, spawner=spawn_workers)
    packet = sim.packet
    try:
        sim.submit(rail_dag(topo, stages=40), 0)
        sim.advance(20_000)
        victim = packet.workers[1]
        os.kill(victim.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError, match=f"worker 1 \\(pid {victim.pid}.*silent for 2 s"):
            sim.drain()
        assert 1.0 <= time.monotonic() - t0 < 10.0
    finally:
        sim.close()
    assert all(w.proc is not None and w.proc.poll() is not None for w in packet.workers)


def ring_chains(topo: Topology, laps: int = 4, size: int = 256 << 10) -> list[Flow]:
    """On each rail a ring over the 3 hosts, `laps` times round, each flow after the previous one: every dep is
    inside one piece, so the workers resolve them without a round."""
    flows: list[Flow] = []
    for r in (0, 1):
        prev: tuple[int, ...] = ()
        for k in range(3 * laps):
            fid = len(flows)
            flows.append(Flow(fid, gpu(topo, k % 3, r), gpu(topo, (k + 1) % 3, r), size, prev, key=fid))
            prev = (fid,)
    return flows


def one_engine_ends(topo: Topology, flows: list[Flow]) -> list[tuple[int, int, int]]:
    """(flow id, start, end) of every completion of `flows` on one ns-3 engine: what workers must equal."""
    one = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS)), topo)
    one.submit(flows, 0)
    want = sorted((c.flow_id, c.start_ns, c.end_ns) for c in one.drain())
    one.close()
    return want


def one_engine_and_two_workers(
    topo: Topology, flows: list[Flow], *, asynchronous: bool = True
) -> tuple[list[Any], list[Any], int]:
    """(flow id, start, end) of every completion, from one engine and from workers=2, and workers=2's rounds;
    `asynchronous=False`: the fluid NVLink side does not run while the workers do (no `run_ahead`)."""
    want = one_engine_ends(topo, flows)
    sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2)), topo, spawner=spawn_workers)
    try:
        if not asynchronous:
            sim.packet.meanwhile = None  # type: ignore[attr-defined]
        sim.submit(flows, 0)
        got = sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain())
        rounds = sim.packet.rounds  # type: ignore[attr-defined]
    finally:
        sim.close()
    return want, got, rounds


@pytest.mark.slow  # workers=2: 2 processes loading ns-3 (about 3.5 CPU s)
def test_chains_inside_a_piece_need_no_rounds_and_stay_exact() -> None:
    """Dependency-aware windows: the old bound ran one round per L of simulated time while anything was in
    flight; a chain whose deps all stay in one worker now runs in one or two rounds, with the same result."""
    topo = tiny()
    flows = ring_chains(topo)
    want, got, rounds = one_engine_and_two_workers(topo, flows)
    assert got == want
    end = max(e for _, _, e in want)
    assert end // L_NS > 100  # the old bound: at least this many rounds
    assert rounds <= 2


@pytest.mark.slow
def test_ray_local_workers_equal_local_subprocess_workers() -> None:
    """`ray=local`: a private Ray instance starts the two workers (actors launching bridge.netserver over
    loopback tcp); the completions equal those of workers=2 as local subprocesses, to the ns."""
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install ray)")
    topo = tiny()
    flows = rail_dag(topo, stages=2)
    got = {}
    for ray in ("", "local"):
        sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2, ray=ray)), topo, spawner=spawn_workers)
        try:
            sim.submit(flows, 0)
            got[ray] = sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain())
            placement = sim.stats()["decompose"]["placement"]  # type: ignore[index]
        finally:
            sim.close()
        assert placement == ("ray:local" if ray else "local")
    assert got["local"] == got[""] and len(got[""]) == len(flows)


@pytest.mark.slow
def test_ray_workers_over_curve_equal_one_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ray=local` with PHANTORA_BRIDGE_CURVE=1: the workers are CurveZMQ servers (as on other machines) that let
    in the driver's key only; the completions equal one engine's, to the ns, and a plain peer is refused."""
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install ray)")
    from bridge.errors import BridgeError
    from bridge.remote import RemoteSimulator
    from bridge.transport import CURVE_ALWAYS

    monkeypatch.setenv(CURVE_ALWAYS, "1")
    topo = tiny()
    flows = rail_dag(topo, stages=2)
    want = one_engine_ends(topo, flows)
    sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2, ray="local")), topo, spawner=spawn_workers)
    try:
        packet = sim.packet  # type: ignore[attr-defined]
        sim.submit(flows, 0)
        got = sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain())
        assert sim.stats()["decompose"]["curve"] is True  # type: ignore[index]
        ctx = zmq.Context()
        try:
            endpoint = packet.workers[0].endpoint
            with pytest.raises(BridgeError, match=f"{endpoint} requires CurveZMQ"):
                RemoteSimulator(ctx, endpoint, "no-token", startup_timeout_s=20, call_timeout_s=20)
        finally:
            ctx.term()
        events = sim.stats()["events"]  # the workers still serve the run after the refused peer
        assert isinstance(events, int) and events > 0
    finally:
        sim.close()
    assert got == want and len(got) == len(flows)


def test_completion_bound_of_a_lone_flow_is_its_closed_form() -> None:
    """`PhantoraNetwork::CompletionBounds`: right after a lone flow starts, its bound is start + size x 8 / line rate
    + the path's propagation, less at most one packet's time (the first packet is already sent) and 2 ns; it never
    passes the flow's end; once every byte is sent it is the last byte's first send + the path's propagation (less
    1 ns), so the end is above it by the last packet's store and forward at the path's two links alone."""
    topo = tiny()
    size, start = 1 << 20, 5000
    f = Flow(1, gpu(topo, 0, 0), gpu(topo, 2, 0), size)
    sim = make_engine(EngineSpec("ns3", PacketConfig(cc="dcqcn", payload_bytes=4096, header_bytes=62)), topo)
    try:
        sim.submit([f], start)
        sim.advance(start)
        (b0,) = sim.completion_bounds().values()  # type: ignore[attr-defined]
        prop = 2 * 1000  # GPU -> rail leaf -> GPU: two 1 us links
        closed = start + size * 8 * 10**9 // _G100 + prop
        packet_ns = 4096 * 8 * 10**9 // _G100
        assert closed - packet_ns - 3 <= b0 <= closed  # (3: two ns of rounding, one of integer division)
        seen: list[tuple[int, int]] = [(start, b0)]  # (now, bound) every 500 ns while in flight
        done: list[Any] = []
        t = start
        while not done:
            t += 500
            done += sim.advance(t)
            seen += [(t, b) for b in sim.completion_bounds().values()]  # type: ignore[attr-defined]
        (c,) = done
    finally:
        sim.close()
    wire_ns = (4096 + 62) * 8 * 10**9 / _G100  # the last packet (payload and headers) on one link
    top = max(b for _, b in seen)
    assert top <= c.end_ns and c.end_ns - top <= 2 * wire_ns + 2  # (2: the bound's 1 ns and the ns rounding)
    # the bound is the next ns only within the last packet's store and forward of the end (before the last-byte
    # bound, it was the next ns from the last byte's send on, the propagation included)
    assert all(c.end_ns - now <= 2 * wire_ns + 2 for now, b in seen if b == now + 1)
    assert c.end_ns - b0 < 0.03 * (c.end_ns - start)  # headers (1.5 %) and the hops' store and forward


def test_completion_bound_of_an_incast_flow_is_where_its_last_byte_waits() -> None:
    """Two flows into one GPU share the leaf's link to it, so each one's last byte waits in the leaf's queue well
    after its first send. Once the leaf queues it (lossless fabric: nothing ahead of it is lost), the bound is that
    queue's bytes ahead at the line rate + the cable (`PfcSwitch::LastByteQueued`): at most 3 ns before the end
    (2 of rounding, 1 of integer division), never after it, where its first send + the propagation falls short by
    the queueing."""
    topo = tiny()
    size = 1 << 20
    flows = [Flow(i, gpu(topo, i, 0), gpu(topo, 2, 0), size, key=i) for i in (0, 1)]
    sim = make_engine(EngineSpec("ns3", PacketConfig(cc="dcqcn", payload_bytes=4096, header_bytes=62)), topo)
    try:
        sim.submit(flows, 0)
        sim.advance(0)
        sim.completion_bounds()  # type: ignore[attr-defined]  # asked once: the engine keeps tail bounds from now
        top: dict[int, int] = {}
        ends: dict[int, int] = {}
        t = 0
        while len(ends) < 2:
            t += 200
            ends.update((c.flow_id, c.end_ns) for c in sim.advance(t))
            for i, b in sim.completion_bounds().items():  # type: ignore[attr-defined]
                top[i] = max(top.get(i, 0), b)
    finally:
        sim.close()
    two_flows_ns = 2 * size * 8 * 10**9 // _G100  # both through the one 100 Gbps link: the later end is past it
    assert max(ends.values()) > two_flows_ns
    for i in (0, 1):
        assert ends[i] - 3 <= top[i] <= ends[i]


def shared_rails(topo: Topology, size: int = 2 << 20) -> list[Flow]:
    """On each rail an incast (hosts 0 and 1 -> host 2: the two flows share the leaf's link to host 2, each at
    half rate), then a flow on the other rail that waits on both (a gate: the driver must watch them)."""
    flows = []
    for r in (0, 1):
        a, b = 3 * r, 3 * r + 1
        flows.append(Flow(a, gpu(topo, 0, r), gpu(topo, 2, r), size, key=a))
        flows.append(Flow(b, gpu(topo, 1, r), gpu(topo, 2, r), size + 8192, key=b))
        flows.append(Flow(3 * r + 2, gpu(topo, 0, 1 - r), gpu(topo, 1, 1 - r), 64 << 10, (a, b), key=3 * r + 2))
    return flows


@pytest.mark.slow  # workers=2: 2 processes loading ns-3 (about 3.5 CPU s)
def test_dynamic_bounds_cut_rounds_on_shared_links_and_stay_exact() -> None:
    """Two flows sharing a link run at half rate, so each passes its static bound (full rate) halfway through;
    with the static bound only every round then spans L (over 250 rounds here). The workers' completion bounds
    (unsent bytes at line rate) halve the gap each round: a few dozen rounds, every completion as one engine's."""
    topo = tiny()
    flows = shared_rails(topo)
    want, got, rounds = one_engine_and_two_workers(topo, flows)
    assert got == want
    incast_end = max(e for i, _, e in want if i % 3 != 2)
    half_rate_tail = incast_end // 2 // L_NS  # rounds of L each after the static bounds pass, at least
    assert half_rate_tail > 150
    assert rounds < half_rate_tail / 5


def nvlink_chain_beside_rings(topo: Topology, links: int = 20) -> list[Flow]:
    """Ring chains on both rails (as `ring_chains`) and, meanwhile, a chain of `links` NVLink flows on host 2 whose
    last one releases a rail 0 flow: the fluid side has an event every few us, and only its last completion
    hands the packet side anything."""
    flows = ring_chains(topo)
    prev: tuple[int, ...] = ()
    for k in range(links):
        fid = len(flows)
        flows.append(Flow(fid, gpu(topo, 2, k % 2), gpu(topo, 2, 1 - k % 2), 1 << 20, prev, key=fid))
        prev = (fid,)
    fid = len(flows)
    flows.append(Flow(fid, gpu(topo, 0, 0), gpu(topo, 1, 0), 128 << 10, prev, key=fid))
    return flows


@pytest.mark.slow  # workers=2 twice: 4 processes loading ns-3 (about 7 CPU s)
def test_fluid_side_running_while_the_workers_run_cuts_rounds_and_stays_exact() -> None:
    """Issue 38, asynchronous rounds: while the workers run a round, the fluid NVLink side runs alone up to the
    earliest packet completion it reacts to (`run_ahead`), so its chain's events no longer end rounds. With
    synchronous rounds (and no floor) every fluid event of the chain is a round; with them a handful, and every
    completion equals one engine's. (The floor with asynchronous rounds: the next test.)"""
    topo = tiny()
    flows = nvlink_chain_beside_rings(topo)
    want, got, rounds = one_engine_and_two_workers(topo, flows, asynchronous=False)
    assert got == want
    assert rounds >= 15  # synchronous: stop at every fluid event
    _, got, rounds = one_engine_and_two_workers(topo, flows)
    assert got == want
    assert rounds <= 4


def ring_behind_nvlink(topo: Topology, laps: int = 4) -> list[Flow]:
    """An NVLink flow on host 0, then a ring on rail 1 over the 3 hosts (`laps` times round, each step after the
    one before) that waits on it, then an NVLink flow on host 2 after the ring's last step: the hierarchical
    all-reduce's shape (a rail ring between NVLink phases)."""
    flows = [Flow(0, gpu(topo, 0, 0), gpu(topo, 0, 1), 1 << 20, key=0)]
    prev = (0,)
    for k in range(3 * laps):
        fid = len(flows)
        flows.append(Flow(fid, gpu(topo, k % 3, 1), gpu(topo, (k + 1) % 3, 1), 256 << 10, prev, key=fid))
        prev = (fid,)
    fid = len(flows)
    flows.append(Flow(fid, gpu(topo, 2, 1), gpu(topo, 2, 0), 1 << 20, prev, key=fid))
    return flows


def test_a_ring_behind_an_nvlink_flow_waits_in_the_packet_side_with_the_same_result() -> None:
    """Issue 38: a fabric flow held by the fluid NVLink side (its dep waits on NVLink) used to hold every later
    step of its ring too, each released by the hybrid at its dep's end: every step a hand-off it reacts to (a
    round each, decomposed). Over the NIC-latency engine, which posts a flow handed over before its deps end at
    their end, the steps now go with the first: only the ring's last step, which an NVLink flow waits on, is
    reacted to, and every start and end is the hold-every-step run's."""
    topo = tiny()
    flows = ring_behind_nvlink(topo)
    ring = [f.id for f in flows[1:-1]]
    runs = {}
    for chains in (False, True):
        sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS)), topo)
        assert sim.chains  # type: ignore[attr-defined]
        sim.chains = chains  # type: ignore[attr-defined]
        sim.submit(flows, 0)
        reacted = [f for f in ring if sim.reacts_to(f)]  # type: ignore[attr-defined]
        assert reacted == (ring[-1:] if chains else ring)
        runs[chains] = sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain())
        sim.close()
    assert runs[True] == runs[False]
    assert len(runs[True]) == len(flows)


@pytest.mark.slow  # workers=2 twice: 4 processes loading ns-3 (about 7 CPU s)
def test_a_ring_behind_an_nvlink_flow_runs_in_few_rounds_and_stays_exact() -> None:
    """The same DAG decomposed: holding each ring step in the hybrid made a round per step (at least 12 here);
    handed on with the first they wait in their worker, and the ring costs a round or two. Both equal one engine."""
    topo = tiny()
    flows = ring_behind_nvlink(topo)
    want, got, rounds = one_engine_and_two_workers(topo, flows)
    assert got == want
    assert rounds <= 4
    sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2)), topo, spawner=spawn_workers)
    try:
        sim.chains = False  # type: ignore[attr-defined]
        sim.submit(flows, 0)
        assert sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain()) == want
        assert sim.packet.rounds >= len(flows) - 2  # type: ignore[attr-defined]
    finally:
        sim.close()


def watched_run(sim: Any, topo: Topology, flows: list[Flow]) -> list[Any]:
    """Drive `sim` as the runtime does: `advance_watching` on a fluid flow and two packet flows, and at each
    watched completion submit new flows at that ns (NVLink and rail flows, one of them after a fluid flow, which
    is watched in turn). Returns what came back, call by call: (now, [(flow id, start, end)])."""
    nv = len(ring_chains(topo))  # the chain's first NVLink flow
    extra = {
        nv + 9: [Flow(100, gpu(topo, 0, 0), gpu(topo, 0, 1), 1 << 20, key=100),
                 Flow(101, gpu(topo, 0, 1), gpu(topo, 1, 1), 64 << 10, key=101)],
        5: [Flow(102, gpu(topo, 1, 0), gpu(topo, 1, 1), 2 << 20, key=102),
            Flow(103, gpu(topo, 1, 1), gpu(topo, 2, 1), 64 << 10, (102,), key=103)],
        17: [Flow(104, gpu(topo, 2, 1), gpu(topo, 0, 1), 128 << 10, key=104)],
        102: [Flow(105, gpu(topo, 2, 0), gpu(topo, 1, 0), 64 << 10, key=105)],
    }  # fmt: skip
    sim.submit(flows, 0)
    watch, trace = {nv + 9, 5, 17}, []
    while watch:
        got = sim.advance_watching(INF_NS, watch)
        now = sim.now()
        trace.append((now, sorted((c.flow_id, c.start_ns, c.end_ns) for c in got)))
        for fid in sorted({c.flow_id for c in got} & watch):
            watch.discard(fid)
            sim.submit(extra[fid], now)
            watch.update(f.id for f in extra[fid] if f.id == 102)
    trace.append((None, sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain())))
    return trace


@pytest.mark.slow  # workers=2: 2 processes loading ns-3 (about 3.5 CPU s)
def test_asynchronous_rounds_return_at_watched_completions_as_one_engine() -> None:
    """The runtime's way of driving the engine, with asynchronous rounds: the fluid side runs ahead while the
    workers run, but stops at a completion the caller watches (it submits there) and never past a packet
    completion it reacts to; every call returns at the same ns with the same completions as one engine's."""
    topo = tiny()
    flows = nvlink_chain_beside_rings(topo)
    one = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS)), topo)
    try:
        want = watched_run(one, topo, flows)
    finally:
        one.close()
    sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2)), topo, spawner=spawn_workers)
    try:
        got = watched_run(sim, topo, flows)
        assert sim.ahead_steps > 0  # type: ignore[attr-defined]  # the fluid side did run ahead
    finally:
        sim.close()
    returned = {fid for _, done in want[:-1] for fid, _, _ in done}
    assert {len(ring_chains(topo)) + 9, 5, 17, 102, 105} <= returned | {fid for fid, _, _ in want[-1][1]}
    assert got == want


@pytest.mark.slow  # workers=2 twice: 4 processes loading ns-3 (about 7 CPU s)
@pytest.mark.timeout(120)
def test_fluid_flows_outlasting_the_packet_side_end_with_the_floor() -> None:
    """Issue 38 (the 64 MiB hang): once the packet side is idle and the fluid side's flows release nothing there,
    the floor is unbounded, so the decomposed engine's round has no horizon, moves nothing, and used to return
    without reaching the caller's limit (the hybrid's next fluid event): the hybrid asked again, forever, every
    worker answering empty rounds. It must reach the limit, hand out the fluid completions, and equal one engine."""
    topo = tiny()
    flows = [
        Flow(0, gpu(topo, 0, 0), gpu(topo, 1, 0), 64 << 10, key=0),  # about 6 us on the rail
        Flow(1, gpu(topo, 2, 0), gpu(topo, 2, 1), 64 << 20, key=1),  # NVLink, about 150 us: outlasts it
        Flow(2, gpu(topo, 2, 1), gpu(topo, 2, 0), 32 << 20, (0,), key=2),  # NVLink, released by the rail flow
    ]
    want, got, _ = one_engine_and_two_workers(topo, flows)
    assert got == want
    sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2)), topo, spawner=spawn_workers)
    try:
        sim.packet.floor = sim.submit_floor  # type: ignore[attr-defined]
        sim.submit(flows, 0)
        assert sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain()) == want
    finally:
        sim.close()


@pytest.mark.slow  # it waits out several silence limits on purpose (about 10 s)
def test_workers_hear_from_the_driver_through_a_long_fluid_stretch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: while the driver runs the fluid NVLink side alone (ahead of a round, or between rounds), or starts
    the next worker, a worker that has answered waits; it exits after its silence limit. With a 2.5 s limit (the
    heartbeat period is 1 s) and fluid steps slowed to 0.25 s each (stretches of several seconds), the driver's
    throttled heartbeats keep both workers there, and every completion still equals one engine's."""
    import bridge.workers

    monkeypatch.setattr(bridge.workers, "WORKER_PEER_TIMEOUT_S", 2.5)
    topo = tiny()
    flows = nvlink_chain_beside_rings(topo, links=10)
    want = one_engine_ends(topo, flows)
    sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2)), topo, spawner=spawn_workers)
    fluid = sim.fluid  # type: ignore[attr-defined]
    advance = fluid.advance

    def slow_advance(until: int) -> list[Any]:
        time.sleep(0.25)
        return advance(until)

    fluid.advance = slow_advance
    try:
        sim.submit(flows, 0)
        t0 = time.monotonic()
        got = sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain())
        assert time.monotonic() - t0 > 5.0  # the workers did face more than twice their limit of our work
        assert got == want
    finally:
        sim.close()


def wide_dag(topo: Topology) -> tuple[list[Flow], list[Flow]]:
    """Two batches: 24 flows, 20 on both rails and 4 on NVLink (some short, some long), then flows that each wait
    on all 20 rail flows (a fresh, equal deps tuple each: an all-to-all's dependents), on both rails; an NVLink
    flow and a marker that wait on all 24; and one that waits on those too."""
    first = []
    for i in range(24):
        r, h = i % 2, (i // 2) % 3
        src, dst = (gpu(topo, h, r), gpu(topo, (h + 1) % 3, r)) if i % 6 != 5 else (gpu(topo, h, 0), gpu(topo, h, 1))
        first.append(Flow(i, src, dst, 4096 if i < 8 else (512 << 10) + 4096 * i, key=i))
    rail = [f.id for f in first if f.id % 6 != 5]
    ends = [(gpu(topo, 0, 0), gpu(topo, 1, 0)), (gpu(topo, 2, 1), gpu(topo, 0, 1)), (gpu(topo, 1, 1), gpu(topo, 2, 1))]
    second = [
        Flow(100 + k, s, d, 256 << 10, tuple(rail), delay_ns=50 * k, key=100 + k) for k, (s, d) in enumerate(ends)
    ]
    second.append(Flow(103, gpu(topo, 1, 0), gpu(topo, 1, 1), 256 << 10, tuple(range(24)), key=103))  # NVLink
    second.append(Flow(104, gpu(topo, 2, 0), gpu(topo, 2, 0), 0, tuple(range(24))))  # a marker
    second.append(Flow(105, gpu(topo, 0, 1), gpu(topo, 1, 1), 128 << 10, (*rail, 100, 101, 103, 104), key=105))
    return first, second


def run_in_two_batches(sim: Any, first: list[Flow], second: list[Flow], mid: int) -> tuple[list[Any], int]:
    """Submit `first` at 0, run to `mid`, submit `second` there, drain: every (id, start, end), and how many of
    `first` were done at `mid`."""
    sim.submit(first, 0)
    done = sim.advance(mid)
    sim.submit(second, mid)
    done += sim.drain()
    return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done), sum(c.flow_id < 24 for c in done if c.end_ns <= mid)


WIDE_MID = 20_000  # the second batch's ns: some of the first batch's flows are done, some not


def wide_dag_one_engine(topo: Topology, first: list[Flow], second: list[Flow]) -> list[Any]:
    """`run_in_two_batches` on one engine; checks the comparison is not vacuous (some deps done at the second
    batch, some not)."""
    one = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS)), topo)
    want, ended = run_in_two_batches(one, first, second, WIDE_MID)
    one.close()
    assert 0 < ended < 24
    return want


def test_wide_deps_read_once_per_batch_stay_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flows sharing a wide deps list have it read once per batch (`SHARED_DEPS_MIN`), some deps done, some not,
    on either side (fluid NVLink, packet): the same completions as read per dependency edge; each starts no earlier
    than its last dep's end. (On two workers, as one engine: the slow test below.)"""
    topo = tiny()
    first, second = wide_dag(topo)
    want = wide_dag_one_engine(topo, first, second)
    with monkeypatch.context() as m:
        m.setattr("phantora.netsim.hybrid.SHARED_DEPS_MIN", 1 << 30)
        per_edge = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS)), topo)
        assert run_in_two_batches(per_edge, first, second, WIDE_MID)[0] == want
        per_edge.close()
    end = {fid: e for fid, _, e in want}
    for f in second:
        start = next(s for fid, s, _ in want if fid == f.id)
        assert start >= max(end[d] for d in f.deps) + f.delay_ns


@pytest.mark.slow  # workers=2 twice: 4 processes loading ns-3 (about 7 CPU s)
def test_wide_deps_read_once_per_batch_on_two_workers_as_one_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decomposed engine's driver reads a wide deps list once per batch too (`SHARED_DEPS_MIN`), on either
    worker and the driver's side: the same completions as one engine's, and as its own read per dependency edge."""
    topo = tiny()
    first, second = wide_dag(topo)
    want = wide_dag_one_engine(topo, first, second)
    for per_edge in (False, True):
        with monkeypatch.context() as m:
            if per_edge:
                m.setattr("phantora.netsim.hybrid.SHARED_DEPS_MIN", 1 << 30)
                m.setattr("phantora.netsim.decompose.SHARED_DEPS_MIN", 1 << 30)
            sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2)), topo, spawner=spawn_workers)
            try:
                assert run_in_two_batches(sim, first, second, WIDE_MID)[0] == want
            finally:
                sim.close()
