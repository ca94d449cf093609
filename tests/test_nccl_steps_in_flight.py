"""NCCL_STEPS steps in flight on a connection (`--granularity chunked`): a sender's step s goes once step s - 8 of
the same connection has arrived (its buffer slot is free: prims_simple.h `waitPeer`, NCCL v2.30.7-1) and its data
is there, on the wire after the steps before it, so the steps of a transfer across hosts or of PAT's rounds do not
each wait a path's propagation. Times against closed forms written out here (latency from NCCL's tuning tables
plus bytes over the rate the hosts' NICs give, below) on idle networks the call does not saturate; chunk sizes
from NCCL's enqueue.cc (`calcCollChunking`'s PAT ladder, `addP2pToPlan`'s p2p chunk), written out here."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import Topology, rail_optimized
from tests.engine_pair import flow_and_ns3_end_ns

KiB, MiB = 1 << 10, 1 << 20
NCCL_STEPS = 8  # src/include/device.h
SIMPLE_STEP = 4 * MiB // NCCL_STEPS  # the Simple buffer (NCCL_BUFFSIZE's 4 MiB default) over NCCL_STEPS
# NCCL v2.30.7-1 src/graph/tuning.cc (µs): baseLat[RING][SIMPLE], baseLat[PAT][SIMPLE], hwLat[NET][*][SIMPLE] (ring
# and tree alike), and getNetOverhead on Intel hosts (one proxy op)
BASE_LAT_RING, BASE_LAT_PAT, NET_HOP, NET_OVERHEAD = 8.4, 8.0, 14.0, 1.0
CTS_BYTES = 64  # sizeof(struct ncclIbSendFifo), src/transport/net_ib/common.h (NCCL v2.29.7-1): one receive's
NIC_GBS = 400 / 8  # one 400G NIC a GPU (rail_optimized), GB/s
GRAPH_GBS = 48.0  # NCCL's ring graph over it (search.cc: the fastest inter-node speed a 50 GB/s NIC carries)
CHANNELS = (
    4  # NCCL's channels here: the graph's, duplicated (ncclTopoDupChannels); a 400G NIC's p2p need, pow2Up(50 / 14)
)


def run(coll: Collective, topo: Topology, granularity: str, **env: str) -> tuple[float, list, dict]:
    """Time (µs) on an idle flow network, the flows and NCCL's choice."""
    dag = decompose(coll, topo, AlgoOptions(granularity=granularity, nccl_env=nccl_env(env)))
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1e3, dag.flows, dag.choice or {}


@pytest.mark.parametrize("size", [MiB, 16 * MiB, 64 * MiB])
def test_sendrecv_across_hosts_keeps_eight_steps_in_flight(size: int) -> None:
    """Send/recv between two H100s on two hosts (2 x 2, 400G NICs): 4 channels, each part in steps of the 128 KiB
    net p2p chunk (a transfer under 8 chunks takes half of one). Step s waits for step s - 8 of its connection and
    nothing else, so the call takes NCCL's time to 0.01%: a launch and one network step (8.4 + 14 us), a proxy op
    per channel each way (2 x 4 x 1 us), and the bytes at the NIC's 50 GB/s. One step at a time, each waiting the
    path's propagation (the window of one before), it took 463.8 us at 16 MiB on 2 x 8 H100s where this is 365.9."""
    topo = rail_optimized(2, 2, gpu="h100")
    coll = Collective("send_recv", (0, 2), size, "fp32")
    t, flows, choice = run(coll, topo, "chunked")
    coarse, _, _ = run(coll, topo, "coarse")
    step = 128 * KiB if size >= NCCL_STEPS * 128 * KiB else 64 * KiB
    by_id = {f.id: f for f in flows}
    flows = [f for f in flows if not is_credit(f)]  # the steps, not the credits going back
    assert {f.size for f in flows} == {step}
    assert len(flows) == size // step
    conns: dict[int, list] = {}
    for f in flows:
        conns.setdefault(f.conn, []).append(f)
    assert len(conns) == choice["channels"] == CHANNELS
    for steps in conns.values():
        assert len({f.queue for f in steps}) == 1 and steps[0].queue  # one queue: the connection's order
        for s, f in enumerate(steps):  # the receiver consumes a step as it lands; its clear-to-send crosses back
            slot = [by_id[d] for d in f.deps]  # the first NCCL_STEPS: the receives posted at the start, one CTS each
            assert [g.deps for g in slot] == [(steps[s - NCCL_STEPS].id,) if s >= NCCL_STEPS else ()]
            assert all(is_credit(g) and (g.src, g.dst, g.size) == (f.dst, f.src, CTS_BYTES) for g in slot)
    want = BASE_LAT_RING + NET_HOP + 2 * CHANNELS * NET_OVERHEAD + size / (1000 * NIC_GBS)
    assert t == pytest.approx(want, rel=1e-4)
    assert t == pytest.approx(coarse, rel=1e-4)


def pat_chunk(kind: str, nbytes: int, channels: int) -> int:
    """calcCollChunking's PAT chunk: the Simple step, halved while chunk x channels x (32 all-gather, 16
    reduce-scatter) exceeds the bytes, down to 64 KiB."""
    chunk, per = SIMPLE_STEP, 32 if kind == "all_gather" else 16
    while chunk * channels * per > nbytes and chunk > 64 * KiB:
        chunk //= 2
    return chunk


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("size", [MiB, 16 * MiB])
def test_chunked_pat_runs_its_rounds_in_steps_in_nccls_time(kind: str, size: int) -> None:
    """PAT on 4 H100s of one GPU a node (400G rails): rounds of 1 then 2 blocks (all-gather; reduce-scatter the
    reverse), each in steps of PAT's chunk. All-gather's second round forwards what the first brought: its steps
    past the own block wait for the first round's steps that brought their bytes. Chunked takes NCCL's time to
    0.02%, as coarse does: PAT's latency (8 + log2(4) x 14 / 3.5 + 4 x 2.8 us, tuning.cc) and the bytes at 3/4 of
    the ring graph's 48 GB/s (PAT's 0.75)."""
    topo = rail_optimized(4, 1, gpu="h100")
    coll = Collective(kind, (0, 1, 2, 3), size, "fp32")
    t, flows, choice = run(coll, topo, "chunked", NCCL_ALGO="PAT")
    coarse, _, _ = run(coll, topo, "coarse", NCCL_ALGO="PAT")
    assert choice["algorithm"] == "PAT"
    chunk, block = pat_chunk(kind, size, choice["channels"]), size // 4
    flows = [f for f in flows if not is_credit(f)]  # the steps, not the credits going back
    assert {f.size for f in flows} == {chunk}
    assert len(flows) == 4 * 3 * block // chunk  # each rank sends 3 blocks in all
    want = BASE_LAT_PAT + 2 * NET_HOP / 3.5 + 4 * 2.8 + size / (1000 * 0.75 * GRAPH_GBS)
    assert t == pytest.approx(want, rel=2e-4)
    assert t == pytest.approx(coarse, rel=2e-4)
    if kind == "all_gather":
        first = [f for f in flows if "/round0/" in f.tag and f.dst == topo.node_of_rank(0)]  # from rank 3
        second = [f for f in flows if "/round1/" in f.tag and f.src == topo.node_of_rank(0)]
        own = block // chunk
        assert all(not set(f.deps) & {g.id for g in first} for f in second[:own])
        for j, f in enumerate(second[own:]):
            assert first[j].id in f.deps


@pytest.mark.ns3
@pytest.mark.parametrize(
    ("kind", "topology", "ranks", "env"),
    [
        ("all_gather", "star8", tuple(range(8)), {"NCCL_ALGO": "PAT"}),
        ("reduce_scatter", "star8", tuple(range(8)), {"NCCL_ALGO": "PAT"}),
        ("send_recv", "testbed16", (0, 8), {}),
    ],
)
def test_packet_mode_keeps_the_steps_in_flight(ns3_lib, kind: str, topology: str, ranks: tuple, env: dict) -> None:
    """16 MiB chunked through ns-3 (its NIC sends a connection's messages in order, and a queue's, SetQueue, one
    at a time): every flow's bytes, within 1% of the flow network at the packets' goodput. Without the queue in
    ns-3 a PAT rank's rounds went side by side there, each at the rank's rate (64 MiB all-gather on star8: 5851
    against 7499 us)."""
    from phantora.topology import load_topology

    topo = load_topology(topology)
    coll = Collective(kind, ranks, 16 * MiB, "fp32")
    dag = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=nccl_env(env)))
    assert any(f.queue for f in dag.flows)
    times = flow_and_ns3_end_ns(topo, dag.flows)
    assert times["ns3"] == pytest.approx(times["flow"], rel=0.01)
