"""A chunked ring's messages on their connection's queue (`--granularity chunked`, NCCL's model): a rank's chunks to its
successor go on the wire one at a time, in order, each once its input has arrived and its buffer slots are free: the
chunk NCCL_STEPS / CHUNKSTEPS before it has arrived (a Simple ring chunk takes ALLREDUCE_CHUNKSTEPS = 4 of the 8
slots, its empty slices too, so 2 chunks are in flight; an LL / LL128 chunk takes 1, so 8: prims_simple.h
`waitPeer`, enqueue.cc `calcCollChunking`'s chunkSteps, collectives.h; the proxy posts a network connection's
steps in order, net.cc `sendProxyProgress`; NCCL v2.30.7-1). ns-3's NIC sends a connection's messages that way too,
so both engines share a link between connections, not between messages. Closed forms written out here: NCCL_STEPS
from device.h, the busiest link's bytes over its line rate (each flow on its ECMP route)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.dag import DagBuilder
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.ring import ring_flows
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.topology import Topology, load_topology, rail_optimized
from tests.engine_pair import flow_and_ns3_end_ns

MiB = 1 << 20
NCCL_STEPS = 8  # src/include/device.h
ALLREDUCE_CHUNKSTEPS = NCCL_STEPS // 2  # src/include/collectives.h: a Simple ring chunk's buffer slots
SIMPLE_WINDOW = NCCL_STEPS // ALLREDUCE_CHUNKSTEPS  # Simple ring chunks in flight on a connection
ALLREDUCE_SLICESTEPS = NCCL_STEPS // 4  # a chunk's slices' slots: each slice a message of its own
SLICE_WINDOW = NCCL_STEPS // ALLREDUCE_SLICESTEPS  # Simple ring slices in flight on a connection
TOPO = load_topology("testbed16")  # 2 hosts x 8 H100, a 400G NIC a GPU, two leaves and four 800G spines
RING_SIMPLE = nccl_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})


def ring(size: int) -> tuple[list, dict]:
    """The chunked flows and NCCL's choice of a Simple ring all-reduce of `size` bytes over testbed16's 16 GPUs."""
    coll = Collective("all_reduce", tuple(range(16)), size, "fp32")
    dag = decompose(coll, TOPO, AlgoOptions(granularity="chunked", nccl_env=RING_SIMPLE))
    return dag.flows, dag.choice or {}


def busiest_link_us(flows: list) -> float:
    """The longest time any link needs for the bytes routed over it, at its line rate (µs)."""
    load: dict[int, int] = defaultdict(int)
    for f in flows:
        for link in TOPO.route(f.src, f.dst, f.key):
            load[link] += f.size
    return max(n * 8 / TOPO.channel_bandwidth(link) * 1e6 for link, n in load.items())


def test_ring_steps_go_in_turn_on_their_connection() -> None:
    """256 MiB: 16 channels of a 1 MiB slice a rank, one pass of 2(16 - 1) = 30 steps a connection. Each step is on
    its connection's queue as its 2 slices, and each slice waits for its receiver to have consumed the slice
    NCCL_STEPS / ALLREDUCE_SLICESTEPS = 4 before it (`waits_back`); on the flow
    network no connection's steps overlap on the wire, so the spine links that ECMP gives six connections share
    their rate six ways by connection, and the call takes NCCL's latency plus the busiest link's bytes at its line
    rate, to 0.1%. (When a connection's steps ran side by side each took a share of the link, and the ring ran 2.7%
    longer.)"""
    flows, choice = ring(256 * MiB)
    conns: dict[int, list] = defaultdict(list)
    for f in flows:
        if not is_credit(f):
            conns[f.conn].append(f)
    assert len(conns) == 16 * 16 and all(len(steps) == 2 * 2 * 15 for steps in conns.values())
    by_id = {f.id: f for f in flows}
    for steps in conns.values():
        assert len({f.queue for f in steps}) == 1 and steps[0].queue
        where = {f.id: s for s, f in enumerate(steps)}
        for s, f in enumerate(steps[SLICE_WINDOW:], SLICE_WINDOW):
            assert waits_back(by_id, where, s, f) == {SLICE_WINDOW}
    sim = FlowSimulator(TOPO)
    sim.submit(flows, at=0)
    done = {c.flow_id: c for c in sim.drain()}
    for steps in conns.values():
        prop = TOPO.path_latency_ns(TOPO.route(steps[0].src, steps[0].dst, steps[0].key))
        for a, b in zip(steps, steps[1:], strict=False):
            assert done[b.id].start_ns >= done[a.id].end_ns - prop  # after the step before left the sender
    end_us = max(c.end_ns for c in done.values()) / 1e3
    assert end_us == pytest.approx(choice["model_lat_us"] + busiest_link_us(flows), rel=1e-3)


@pytest.mark.slow
@pytest.mark.ns3
def test_ns3_pays_the_spine_queue_the_fluid_share_has_not() -> None:
    """16 MiB (64 KiB steps): ns-3 and the flow network at goodput agree to 0.6% where the connections' rate caps
    leave every link some room (each network step capped at 120 Gbit/s: at most 6 x 120 x 1048 / 1000 Gbit/s of
    wire on an 800G spine link; 0.1% before back-pressure: a step's slot now waits for its credit to come back, and
    each such round trip carries ns-3's store-and-forward of the step's last packet at every hop, which the fluid
    share has not: 297,683 against 296,835 ns; 0.3% before the clear-to-send was a packet: across hosts it is a
    128 B RDMA write that ns-3 stores and forwards at every hop and queues behind the steps leaving the same NIC,
    median 4,052 against the fluid share's 4,010 ns, 298,677 against 297,005 ns in all). At the model's caps (a
    channel's 172 Gbit/s) six connections offer a spine link more than its rate: ns-3 queues the excess in the
    switch, each step arrives later, and the ring, whose every step waits for the one before to arrive, takes at
    least 0.4% longer than the fluid share, which has no queue (294,376 against 292,944 ns; 294,673 against
    292,851 before the clear-to-send was a packet; 1.33% before back-pressure, whose credits keep fewer steps in
    flight and so the spine's queue shorter)."""
    flows, _ = ring(16 * MiB)
    nic = {TOPO.node_of_rank(r): TOPO.nodes[TOPO.node_of_rank(r)].host for r in range(16)}
    capped = [dataclasses.replace(f, rate_bps=120 * 10**9) if nic[f.src] != nic[f.dst] else f for f in flows]
    room = flow_and_ns3_end_ns(TOPO, capped)
    assert room["ns3"] == pytest.approx(room["flow"], rel=6e-3)
    model = flow_and_ns3_end_ns(TOPO, flows)
    assert model["ns3"] > 1.004 * model["flow"]


def waits_back(by_id: dict, where: dict[int, int], s: int, f: Flow) -> set[int]:
    """How many messages back, on its own connection, message `f` (number `s` there: `where`) waits for (its
    pass's start), or for its receiver to have consumed (its slot: through the credit going back, the receiver's
    step that sends it on, or, across hosts, what that step waited for; `back_pressure.py`)."""
    waits = [e for d in f.deps for e in (by_id[d].deps if is_credit(by_id[d]) else (d,))]
    back = [e for e in waits if e in where] or [x for e in waits for x in by_id[e].deps if x in where]
    return {s - where[x] for x in back}


def own_offsets(flows: list) -> set[int]:
    """`waits_back` of every message of every connection."""
    by_id = {f.id: f for f in flows}
    conns: dict[int, list] = defaultdict(list)
    for f in flows:
        if not is_credit(f):
            conns[f.conn].append(f)
    out: set[int] = set()
    for steps in conns.values():
        where = {f.id: s for s, f in enumerate(steps)}
        for s, f in enumerate(steps):
            out |= waits_back(by_id, where, s, f)
    return out


@pytest.mark.parametrize(
    ("proto", "window", "size"),
    [("Simple", SLICE_WINDOW, 128 * MiB), ("LL", NCCL_STEPS, 4 * MiB), ("LL128", NCCL_STEPS, 64 * MiB)],
)
def test_a_ring_chunk_takes_its_protocols_slots(proto: str, window: int, size: int) -> None:
    """2 hosts x 2 H100 (8 channels), an all-reduce of several passes: a Simple chunk (2 MiB) moves as 2 slices,
    each waiting for the slice 4 back (2 slots a slice), an LL / LL128 chunk for the one 8 back (a slot a chunk);
    at a pass's start a message waits for the rank's last of the pass before (a rank runs its passes in turn): 1
    back, and for a Simple chunk's second slice 2."""
    env = nccl_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": proto})
    coll = Collective("all_reduce", (0, 1, 2, 3), size, "fp32")
    dag = decompose(coll, rail_optimized(2, 2, gpu="h100"), AlgoOptions(granularity="chunked", nccl_env=env))
    assert own_offsets(dag.flows) == ({1, 2, window} if proto == "Simple" else {1, window})


def latency_ring() -> Topology:
    """4 GPUs in a ring of direct 8 Gbit/s links (a byte a ns), 1 us each but the first, 10 us."""
    topo = Topology(name="ring4")
    gpus = [topo.add_node("gpu", host=i) for i in range(4)]
    for i in range(4):
        topo.add_link(gpus[i], gpus[(i + 1) % 4], 8 * 10**9, 10_000 if i == 0 else 1_000)
    return topo


@pytest.mark.parametrize(("window", "end_us"), [(SIMPLE_WINDOW, 22.0), (NCCL_STEPS, 15.0)])
def test_the_window_binds_where_a_slot_comes_back_late(window: int, end_us: float) -> None:
    """An all-gather's 3 steps of a 1000-byte chunk (1 us on the wire) round `latency_ring`, no step delay. Rank 0's
    chunks cross the 10 us link: with 2 in flight its third waits for its first to arrive, 1 + 10, then goes,
    1 + 10 more: 22 us. With 8 in flight it goes once rank 3's second chunk is in (2 + 2 = 4 us) and arrives at
    4 + 1 + 10 = 15, as rank 2's last (rank 1's second arrives 11 + 1 + 1 = 13, rank 2's third 13 + 2 = 15)."""
    topo = latency_ring()
    b = DagBuilder(nodes=topo.endpoints, ranks=(0, 1, 2, 3), first_id=1, prefix="", comm=7)
    order, slices = [0, 1, 2, 3], [1000] * 4
    ring_flows(
        b, "all_gather", order, slices, 0, chunked=True, chunk_bytes=1000, step_delay_ns=0, in_turn=True, window=window
    )
    sim = FlowSimulator(topo)
    sim.submit(b.flows, at=0)
    assert max(c.end_ns for c in sim.drain()) / 1e3 == pytest.approx(end_us)
