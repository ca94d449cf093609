"""A ring broadcast's or reduce's chain (`--granularity chunked`) keeps NCCL_STEPS steps in flight on each hop: step
c goes once step c - 8 of the same hop has been consumed by its receiver and the credit has crossed the path back
(its slot is free: prims_simple.h `waitPeer`, net.cc; collectives/back_pressure.py; NCCL v2.30.7-1)
and its input step has arrived from the previous rank (broadcast.h `directRecvCopyDirectSend`), on the wire after
the steps before it. Times against closed forms on idle 400G rails: one hop takes NCCL's time (a launch and one
network step, then the bytes at the ring graph's rate, as coarse); each further hop adds one step's
store-and-forward at the connection's rate (the chain's fill). Step sizes from enqueue.cc `calcCollChunking`, and
NCCL's latencies and rates, written out here."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import Topology, rail_optimized

MiB = 1 << 20
NCCL_STEPS = 8  # src/include/device.h
# Simple ring broadcast / reduce: BROADCAST_CHUNKSTEPS = REDUCE_CHUNKSTEPS = 1, so a chunk is one step of the 4 MiB
# Simple buffer (NCCL_BUFFSIZE's default) over NCCL_STEPS (collectives.h, enqueue.cc calcCollChunking)
STEP = 4 * MiB // NCCL_STEPS
# NCCL v2.30.7-1 src/graph/tuning.cc: a ring broadcast's or reduce's latency is baseLat[RING][SIMPLE] and one step,
# hwLat[NET][RING][SIMPLE] (µs); its bandwidth the ring graph's (nsteps = nRanks: algbw = busBw)
LATENCY_US = 8.4 + 14.0
GRAPH_GBS = 48.0  # NCCL's ring graph over a 400G NIC (search.cc: the fastest inter-node speed 50 GB/s carries)
CHANNELS = 4  # the graph's channels, duplicated (ncclTopoDupChannels): 12 GB/s a channel and connection


def run(coll: Collective, topo: Topology, granularity: str) -> tuple[float, list, dict]:
    """Time (µs) on an idle flow network, the flows and NCCL's choice."""
    dag = decompose(coll, topo, AlgoOptions(granularity=granularity, nccl_env=nccl_env({})))
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1e3, dag.flows, dag.choice or {}


CTS_BYTES = 64  # sizeof(struct ncclIbSendFifo), src/transport/net_ib/common.h (NCCL v2.29.7-1): one receive's


def data(flows: list) -> list:
    """The flows that carry steps, not the credits going back (`back_pressure.is_credit`)."""
    return [f for f in flows if not is_credit(f)]


@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
@pytest.mark.parametrize("size", [16 * MiB, 64 * MiB])
def test_one_hop_chain_keeps_eight_steps_in_flight(kind: str, size: int) -> None:
    """Two H100s on two hosts: each channel's part crosses one network hop in 512 KiB steps; step c waits for step
    c - 8 of its hop only, so chunked takes NCCL's time (22.4 us and the bytes at 48 GB/s) as coarse does, to
    0.01%. One step at a time (each waiting for the one before to arrive) paid a path's propagation per step:
    1462.11 us against 1420.50 at 64 MiB."""
    topo = rail_optimized(2, 1, gpu="h100")
    coll = Collective(kind, (0, 1), size, "fp32", root=0)
    t, flows, choice = run(coll, topo, "chunked")
    coarse, _, _ = run(coll, topo, "coarse")
    assert choice["algorithm"] == "Ring" and choice["protocol"] == "Simple"
    assert {f.size for f in data(flows)} == {STEP}
    hops: dict[int, list] = {}
    for f in data(flows):
        hops.setdefault(f.conn, []).append(f)
    by_id = {f.id: f for f in flows}
    assert len(hops) == choice["channels"] == CHANNELS
    for steps in hops.values():
        assert len({f.queue for f in steps}) == 1 and steps[0].queue  # the hop's steps on the wire in order
        for c, f in enumerate(steps):  # the receiver consumes a step as it lands; its clear-to-send crosses back
            slot = [by_id[d] for d in f.deps]  # the first NCCL_STEPS: the receives posted at the start, one CTS each
            assert [g.deps for g in slot] == [(steps[c - NCCL_STEPS].id,) if c >= NCCL_STEPS else ()]
            assert all(is_credit(g) and (g.src, g.dst, g.size) == (f.dst, f.src, CTS_BYTES) for g in slot)
    assert t == pytest.approx(LATENCY_US + size / (1000 * GRAPH_GBS), rel=1e-4)
    assert t == pytest.approx(coarse, rel=1e-4)


@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
@pytest.mark.parametrize("size", [16 * MiB, 64 * MiB])
def test_longer_chain_adds_one_step_per_extra_hop(kind: str, size: int) -> None:
    """Four H100s on four hosts: a chain of 3 network hops. A step is forwarded once it has arrived whole (Simple),
    so the last rank's first step lands 2 step times after it would over one hop: chunked = NCCL's time (as over
    one hop) + (hops - 1) x STEP at the connection's 12 GB/s (48 over 4 channels), to 0.01%, whatever the size (the
    fill does not grow with the steps). A middle rank's clear-to-sends leave by the NIC its own steps leave by, so
    it may take longer, by at most a 64 B clear-to-send a step at the connection's rate (64 MiB: 32 steps a
    channel, 0.17 us)."""
    topo = rail_optimized(4, 1, gpu="h100")
    coll = Collective(kind, (0, 1, 2, 3), size, "fp32", root=0)
    t, flows, choice = run(coll, topo, "chunked")
    assert choice["channels"] == CHANNELS
    assert {f.rate_bps for f in data(flows)} == {GRAPH_GBS / CHANNELS * 8e9}
    fill_us = (4 - 2) * STEP / (1000 * GRAPH_GBS / CHANNELS)
    want = LATENCY_US + size / (1000 * GRAPH_GBS) + fill_us
    cts_us = size // CHANNELS // STEP * CTS_BYTES / (1000 * GRAPH_GBS / CHANNELS)
    assert want * (1 - 1e-4) <= t <= want * (1 + 1e-4) + cts_us
