"""NCCL's clear-to-send as a message on the network (`collectives/back_pressure.py`). Across hosts a freed slot's
credit goes back as net_ib's CTS: the receiving proxy posts a receive for the slot and writes one `ncclIbSendFifo`
entry per request into the sender's CTS FIFO, an inline RDMA WRITE (NCCL v2.29.7-1, src/transport/net_ib/p2p.cc
`ncclIbPostFifo`; the struct in net_ib/common.h), so it crosses the reverse path and queues behind what that path
carries. Inside a host the credit stays the flag the receiver stores into the sender's memory. Sizes written out
from NCCL's headers here; times against closed forms and bounds derived here, not against earlier runs."""

from __future__ import annotations

import math

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import cts_bytes, is_credit, is_cts, ring_receives
from phantora.collectives.mirrors import Mirrors
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.plan import CallSpec, CollectivePlanner
from phantora.netsim.base import Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig
from phantora.topology import rail_optimized
from tests.engine_pair import start_end_ns
from tests.test_back_pressure import G, builder, star

KiB, MiB = 1 << 10, 1 << 20
NCCL_STEPS = 8  # src/include/device.h
# struct ncclIbSendFifo (net_ib/common.h): addr, size (uint64), rkeys[NCCL_IB_MAX_DEVS_PER_NIC = 4] (uint32), nreqs,
# tag (uint32), idx (uint64), padding[16]
SEND_FIFO_BYTES = 8 + 8 + 4 * 4 + 4 + 4 + 8 + 16
TURN_NS = 600  # the proxy's progress turn, nccl/proxy.py PROXY_STEP_US


def test_a_cts_is_one_send_fifo_entry_a_receive() -> None:
    """64 bytes a receive (common.h asserts a 32-byte multiple); a Simple ring chunk (CHUNKSTEPS = NCCL_STEPS / 2
    slots, 2 in flight) is posted in slices of SLICESTEPS = NCCL_STEPS / 4, so 2 receives; an LL / LL128 chunk,
    a p2p or chain step takes one slot and one receive."""
    assert SEND_FIFO_BYTES == 64 and SEND_FIFO_BYTES % 32 == 0
    assert cts_bytes() == SEND_FIFO_BYTES
    assert ring_receives(NCCL_STEPS // (NCCL_STEPS // 2)) == 2
    assert ring_receives(NCCL_STEPS) == 1
    assert cts_bytes(ring_receives(2)) == 2 * SEND_FIFO_BYTES


@pytest.mark.parametrize(("proto", "receives", "window"), [("Simple", 1, 4), ("LL", 1, 8)])
def test_across_hosts_the_credit_is_a_cts_inside_a_flag(proto: str, receives: int, window: int) -> None:
    """A chunked ring all-reduce over 2 hosts of 2 H100: every credit of a connection between hosts is a flow of
    receives x 64 B from the step's receiver to its sender, released when the receiver has consumed the step (no
    delay of its own), on a queue pair of its own per connection (not the data's), its ECMP key the reverse
    connection's on the same channel (an LL step consumed once written on to the next GPU of the receiver's host,
    `back_pressure.written`; a Simple chunk moves as its 2 slices, each a message of one receive, `ring_slices`);
    the first `window` messages of each such connection (NCCL_STEPS slots over a message's: a Simple slice's 8 / 2,
    LL 8 / 1) wait for one each without
    dependencies: the receiving proxy posts its first NCCL_STEPS slots' receives from the call's start, one a
    progress call (net.cc `recvProxyProgress`), so step k's leaves with its first receive, k x receives proxy turns
    of 600 ns (nccl/proxy.py PROXY_STEP_US) after the call's first delay. Every credit inside a host is still a
    zero-byte flow at the sender released the NVLink path's propagation later, and the first window there waits for
    none."""
    topo = rail_optimized(2, 2, gpu="h100")
    env = nccl_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": proto})
    coll = Collective("all_reduce", (0, 1, 2, 3), 16 * MiB, "fp32")
    dag = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=env))
    host = {n: topo.nodes[n].host for n in topo.endpoints}
    by_id = {f.id: f for f in dag.flows}
    steps = [f for f in dag.flows if not is_credit(f)]
    data_conns = {f.conn for f in steps}
    across = inside = 0
    (start,) = {f.delay_ns for f in steps if not f.deps}  # the call's first flows' delay
    first: dict[int, int] = {}  # a connection between hosts -> its steps that wait for a CTS posted at the start
    for f in steps:
        for g in (by_id[d] for d in f.deps if is_credit(by_id[d])):
            consumed = [by_id[d] for d in g.deps]
            if host[f.src] != host[f.dst]:
                across += 1
                assert is_cts(g) and (g.src, g.dst, g.size) == (f.dst, f.src, receives * 64)
                k = first.get(f.conn, 0)  # posted: the call's first delay (NCCL's latency) and the proxy's turns
                assert g.delay_ns == (0 if consumed else start + k * receives * TURN_NS)
                assert g.conn and g.conn not in data_conns and g.rate_bps == 0
                assert g.key is not None and f.key is not None and g.key >> 48 == f.key >> 48  # the same channel
                if consumed:
                    # the receiver's consumption of a step: what it got, or its write of it on inside its host
                    assert any(f.dst in (c.dst, c.src) for c in consumed)
                else:
                    first[f.conn] = first.get(f.conn, 0) + 1
            else:
                inside += 1
                assert not is_cts(g) and (g.src, g.dst, g.size) == (f.src, f.src, 0)
                assert g.delay_ns == topo.path_latency_ns(topo.route(f.dst, f.src)) > 0
    assert across and inside
    crossing = {f.conn for f in steps if host[f.src] != host[f.dst]}
    assert set(first) == crossing and set(first.values()) == {window}
    cts_conns: dict[int, set[tuple[int, int]]] = {}
    for g in dag.flows:
        if is_cts(g):
            cts_conns.setdefault(g.conn, set()).add((g.src, g.dst))
    assert all(len(ends) == 1 for ends in cts_conns.values())  # one receiver's CTS queue pair a connection


def test_a_loss_tolerant_collective_keeps_its_cts_lossless() -> None:
    """DLCP: a loss-tolerant chunked ring all-reduce across hosts gets a loss budget on its steps, its traffic class
    on every flow, and none on its clear-to-sends, which carry no tensor bytes."""
    topo = rail_optimized(2, 2, gpu="h100")
    env = nccl_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})
    planner = CollectivePlanner(topo, AlgoOptions(granularity="chunked", nccl_env=env), Mirrors(4, 4))
    call = CallSpec("all_reduce", (0, 1, 2, 3), 16 * MiB, "fp32", algo={"loss_tolerance": 0.1, "traffic_class": 2})
    plan = planner.plan(call, "all_reduce#0")
    cts = [f for f in plan.flows if is_cts(f)]
    assert cts and all(f.loss_budget == 0 and f.priority == 2 for f in cts)
    assert all(f.loss_budget == int(f.size * 0.1) for f in plan.flows if not is_credit(f))


REVERSE_BYTES = 4 * MiB  # each of 3 senders into GPU 0: the CTS path's last hop, GPU 0's link
STEP, STEPS, WINDOW = 16 * KiB, 64, 2


def window_bound_p2p(reverse: bool) -> tuple[list[Flow], list[int], list[Flow]]:
    """GPU 0 sends 64 x 16 KiB to GPU 1, 2 in flight, over a star of 100 Gbit/s links of 1 µs (each GPU a host):
    window-bound (2 x 16 KiB is below the 100 Gbit/s x 4 µs round trip). `reverse`: GPUs 2-4 each send 4 MiB to
    GPU 0, so the switch's port to GPU 0, which the clear-to-sends 1 -> 0 cross, queues. The flows, the forward
    steps' ids and the reverse flows."""
    topo, gpus = star([100 * G] * 5, 1000)
    b = builder(topo, gpus, "p2p")
    fwd = b.add_chunks(0, 1, [STEP] * STEPS, "p2p", 0, window=WINDOW)
    flows = b.finish().flows
    first = max(f.id for f in flows) + 1
    rev = [Flow(first + i, gpus[2 + i], gpus[0], REVERSE_BYTES, tag=f"reverse{i}") for i in range(3)] if reverse else []
    return flows + rev, fwd, rev


def run(network: str, flows: list[Flow], cc: str = "dcqcn") -> dict[int, tuple[int, int]]:
    """Flow id -> (start, end) ns, every flow submitted at 0."""
    topo, _ = star([100 * G] * 5, 1000)
    return start_end_ns(network, topo, flows, cc)


def test_a_window_bound_connection_waits_a_cts_each_window_flow_engine() -> None:
    """On the idle path the connection moves a window per round trip: the step, the way back of its CTS (64 B at
    100 Gbit/s, 5.12 ns, and the 2 µs path) and the next step's 2 µs path. The first window waits for its own two
    CTSs, posted at the start and sent in turn on the receiver's CTS queue pair (the first in after 5.12 ns and the
    2 µs path, the second 5.12 ns later), then goes at once (the second step behind the first on the wire), then
    STEPS / WINDOW - 1 rounds of (4,000 + 16 KiB / 100 Gbit/s + 64 B / 100 Gbit/s) ns: a rate of WINDOW x 16 KiB
    per round, to 2 ns a round (each flow's end rounded up to its ns). The reverse flows share GPU 0's link with
    the CTSs max-min: each CTS takes a quarter of it, 4 x 5.12 ns, and the transfer ends later by at most the three
    extra shares a round (and the first CTS's three)."""
    flows, fwd, _ = window_bound_p2p(False)
    done = run("flow", flows)
    back, xfer = 64 * 8e9 / (100 * G), STEP * 8e9 / (100 * G)
    rounds = STEPS // WINDOW - 1
    want = (2000 + back) + 2000 + WINDOW * xfer + rounds * (4000 + xfer + back)
    assert done[fwd[-1]][1] == pytest.approx(want, abs=2 * (rounds + 1))
    cts = [f for f in flows if is_cts(f)]
    assert len(cts) == STEPS and {(f.src, f.dst, f.size) for f in cts} == {(1, 0, 64)}
    assert [f.id for f in cts if not f.deps] == [d for s in fwd[:WINDOW] for d in by(flows, s).deps]
    flows, fwd, _ = window_bound_p2p(True)
    busy = run("flow", flows)
    assert 0 < busy[fwd[-1]][1] - done[fwd[-1]][1] <= (rounds + 1) * (3 * back + 1)


def by(flows: list[Flow], fid: int) -> Flow:
    """The flow of id `fid`."""
    return next(f for f in flows if f.id == fid)


@pytest.mark.ns3
def test_reverse_traffic_queues_the_cts_and_slows_the_forward_transfer(ns3_lib) -> None:
    """ns-3, DCQCN: the CTSs of a window-bound transfer 0 -> 1 cross GPU 0's link backwards; with 3 x 4 MiB of
    reverse traffic into GPU 0 they wait in the switch's queue to it, and the transfer, which sends a step only
    once a CTS is back, slows. Bounds: every CTS gates the rest of its chain of steps, so the transfer ends later by
    at least the longest CTS's wait beyond its idle time; it cannot end later than the reverse bytes take through
    GPU 0's link at line rate (with the packets' headers): by then no queue is left for a CTS to wait behind."""
    idle_flows, fwd, _ = window_bound_p2p(False)
    idle = run("ns3", idle_flows)
    flows, fwd, rev = window_bound_p2p(True)
    busy = run("ns3", flows)
    cts = [f.id for f in flows if is_cts(f)]
    idle_cts = max(idle[i][1] - idle[i][0] for i in cts)
    waited = max(busy[i][1] - busy[i][0] for i in cts) - idle_cts
    later = busy[fwd[-1]][1] - idle[fwd[-1]][1]
    p = PacketConfig()
    drain = sum(f.size for f in rev) * (p.payload_bytes + p.header_bytes) / p.payload_bytes * 8e9 / (100 * G)
    assert waited > 10 * idle_cts  # the CTS queued (more than ten times its idle time)
    assert waited <= later <= drain
    assert later > 0.2 * idle[fwd[-1]][1]  # measurably: by more than a fifth


def first_window(reverse: list[tuple[int, int]], at: int) -> tuple[list[Flow], list[Flow], list[int], list[Flow]]:
    """`window_bound_p2p`'s connection (64 x 16 KiB from GPU 0 to GPU 1, 2 in flight) submitted at `at` ns, after
    4 MiB flows `reverse` (src, dst GPU indexes) submitted at 0: the reverse flows, the connection's flows, its
    steps' ids and the clear-to-sends of its first window (posted at the start: no dependencies)."""
    topo, gpus = star([100 * G] * 5, 1000)
    b = builder(topo, gpus, "p2p")
    fwd = b.add_chunks(0, 1, [STEP] * STEPS, "p2p", 0, window=WINDOW)
    flows = b.finish().flows
    first = max(f.id for f in flows) + 1
    rev = [Flow(first + i, gpus[s], gpus[d], REVERSE_BYTES, tag=f"reverse{i}") for i, (s, d) in enumerate(reverse)]
    posted = [f for f in flows if is_cts(f) and not f.deps]
    return rev, flows, fwd, posted


def run_at(network: str, rev: list[Flow], flows: list[Flow], at: int) -> dict[int, tuple[int, int]]:
    """Flow id -> (start, end) ns: `rev` submitted at 0, `flows` at `at`."""
    topo, _ = star([100 * G] * 5, 1000)
    sim = make_engine(EngineSpec(network=network, packet=PacketConfig(cc="dcqcn")), topo)
    try:
        sim.submit(rev, at=0)
        sim.advance(at)
        sim.submit(flows, at=at)
        done = {c.flow_id: (c.start_ns, c.end_ns) for c in sim.drain()}
    finally:
        sim.close()
    assert len(done) == len(rev) + len(flows)
    return done


def test_the_first_window_waits_for_the_cts_of_its_posted_receives_flow_engine() -> None:
    """The receiver posts its first NCCL_STEPS slots' receives when the call starts, and the sender writes step s <
    window only once the CTS of receive s is in (net.cc `recvProxyProgress`, net_ib `ncclIbIsend`): each of the
    first window's steps depends on one CTS of 64 B from GPU 1 to GPU 0 without dependencies of its own, sent in
    turn on the receiver's CTS queue pair. Idle: step 0 goes at 2,000 + 5.12 ns (the CTS's path and bytes, its end
    rounded up to the ns). With a 4 MiB flow 1 -> 0 on the same links from the start, the CTS takes half of GPU 1's
    link, max-min: 2,000 + 10.24 ns."""
    back = 64 * 8e9 / (100 * G)
    for reverse, share in (([], 1), ([(1, 0)], 2)):
        rev, flows, fwd, posted = first_window(reverse, 0)
        assert [f.deps for f in flows if f.id in fwd[:WINDOW]] == [(f.id,) for f in posted]
        assert all((f.src, f.dst, f.size) == (1, 0, 64) for f in posted) and len({f.queue for f in posted}) == 1
        done = run_at("flow", rev, flows, 0)
        assert done[fwd[0]][0] == done[posted[0].id][1] == math.ceil(2000 + share * back)


@pytest.mark.ns3
def test_a_queued_reverse_path_holds_back_the_first_window(ns3_lib) -> None:
    """ns-3, DCQCN: GPUs 2-4 send 4 MiB each into GPU 0 from 0 ns, so the switch's port to GPU 0 has a queue when
    the connection 0 -> 1 starts at 20 µs; the CTSs of its first window cross that port, so its first step leaves
    only once CTS 0 is through it: its start is CTS 0's end, later than on the idle path by that CTS's wait (more
    than ten times its idle 2 µs), which the reverse bytes' drain through GPU 0's link at line rate bounds."""
    at = 20_000
    rev, flows, fwd, posted = first_window([], at)
    idle = run_at("ns3", rev, flows, at)
    rev, flows, fwd, posted = first_window([(2, 0), (3, 0), (4, 0)], at)
    busy = run_at("ns3", rev, flows, at)
    cts0 = posted[0].id
    for done in (idle, busy):
        assert done[fwd[0]][0] >= done[cts0][1]  # the step waits for its CTS
    idle_fct = idle[cts0][1] - idle[cts0][0]
    waited = (busy[cts0][1] - busy[cts0][0]) - idle_fct
    p = PacketConfig()
    drain = sum(f.size for f in rev) * (p.payload_bytes + p.header_bytes) / p.payload_bytes * 8e9 / (100 * G)
    assert 10 * idle_fct < waited <= drain
    assert busy[fwd[0]][0] - idle[fwd[0]][0] >= waited - 1


@pytest.mark.parametrize(("size", "freed"), [(MiB, False), (64 * MiB, True)])
def test_grouped_receives_share_one_cts(size: int, freed: bool) -> None:
    """A chunked all-to-all on 2 x 8 H100 (rail-optimised): PXN sends a GPU's parts for the other host through the
    GPU there on the receiver's rail, so a receiver's 8 transfers from that host on a channel come through one
    sending proxy and share its receive comm (net.cc: NCCL_NET_SHARED_COMMS, IB's maxRecvs NCCL_NET_IB_MAX_RECVS
    = 8). `recvProxyProgress` posts step s of the 8 as one irecv, which net_ib answers with one CTS of nreqs = 8
    entries (`ncclIbPostFifo`): every CTS is 8 x 64 B from the receiver to that GPU, and gates step s of the 8
    transfers, one connection each; a transfer's first window waits for one posted at the start. At 64 MiB (8 steps
    of 128 KiB a part, 2 in flight: 16 shared slots over 8 subs) the later ones free slots."""
    topo = rail_optimized(2, 8, gpu="h100")
    coll = Collective("all_to_all", tuple(range(16)), size, "fp32")
    dag = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=nccl_env({})))
    cts = {f.id: f for f in dag.flows if is_cts(f)}
    assert cts and {f.size for f in cts.values()} == {8 * SEND_FIFO_BYTES}
    gated: dict[int, list[Flow]] = {i: [] for i in cts}
    for f in dag.flows:
        for d in f.deps:
            if d in gated:
                gated[d].append(f)
    host = {n: topo.nodes[n].host for n in topo.endpoints}
    for i, c in cts.items():
        steps = gated[i]
        assert len(steps) == 8 and {(f.src, f.dst) for f in steps} == {(c.dst, c.src)} and host[c.src] != host[c.dst]
        assert len({f.conn for f in steps}) == 8  # one step of each of the 8 connections
        if c.deps:  # a freed slot's: once the receiver has consumed step s - window of all 8
            assert len([d for d in c.deps if d in {f.id for f in dag.flows if f.dst == c.src}]) == 8
    assert any(not c.deps for c in cts.values())
    assert any(c.deps for c in cts.values()) == freed


def test_no_shared_comms_no_grouped_receives() -> None:
    """NCCL_NET_SHARED_COMMS=0 (net.cc: each sub keeps its own receive comm): every transfer's receive is posted alone,
    so each CTS is one entry (64 B) gating one step of one connection, 8 times as many as grouped."""
    topo = rail_optimized(2, 8, gpu="h100")
    coll = Collective("all_to_all", tuple(range(16)), MiB, "fp32")

    def cts_of(env: dict[str, str]) -> list[Flow]:
        dag = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=nccl_env(env)))
        return [f for f in dag.flows if is_cts(f)]

    grouped, alone = cts_of({}), cts_of({"NCCL_NET_SHARED_COMMS": "0"})
    assert {f.size for f in alone} == {SEND_FIFO_BYTES} and len(alone) == 8 * len(grouped)
    assert sum(f.size for f in alone) == sum(f.size for f in grouped)
