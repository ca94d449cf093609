"""A chunked ring's messages on their connection's queue (`--granularity chunked`, NCCL's model): a rank's steps to its
successor go on the wire one at a time, in order, each once its input has arrived and the step NCCL_STEPS before it
has (its buffer slot is free: prims_simple.h `waitPeer`; the proxy posts a network connection's steps in order,
net.cc `sendProxyProgress`; NCCL v2.30.7-1). ns-3's NIC sends a connection's messages that way too, so both engines
share a link between connections, not between messages. Closed forms written out here: NCCL_STEPS from device.h,
the busiest link's bytes over its line rate (each flow on its ECMP route)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import load_topology
from tests.engine_pair import flow_and_ns3_end_ns

MiB = 1 << 20
NCCL_STEPS = 8  # src/include/device.h
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
    its connection's queue and waits for the step NCCL_STEPS before it; on the flow network no connection's steps
    overlap on the wire, so the spine links that ECMP gives six connections share their rate six ways by
    connection, and the call takes NCCL's latency plus the busiest link's bytes at its line rate, to 0.1%. (When
    a connection's steps ran side by side each took a share of the link, and the ring ran 2.7% longer.)"""
    flows, choice = ring(256 * MiB)
    conns: dict[int, list] = defaultdict(list)
    for f in flows:
        conns[f.conn].append(f)
    assert len(conns) == 16 * 16 and all(len(steps) == 2 * 15 for steps in conns.values())
    for steps in conns.values():
        assert len({f.queue for f in steps}) == 1 and steps[0].queue
        for s, f in enumerate(steps[NCCL_STEPS:], NCCL_STEPS):
            assert steps[s - NCCL_STEPS].id in f.deps
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
    """16 MiB (64 KiB steps): ns-3 and the flow network at goodput agree to 0.1% where the connections' rate caps
    leave every link some room (each network step capped at 120 Gbit/s: at most 6 x 120 x 1048 / 1000 Gbit/s of
    wire on an 800G spine link). At the model's caps (a channel's 172 Gbit/s) six connections offer a spine link
    more than its rate: ns-3 queues the excess in the switch, each step arrives later, and the ring, whose every
    step waits for the one before to arrive, takes at least 1% longer than the fluid share, which has no queue."""
    flows, _ = ring(16 * MiB)
    nic = {TOPO.node_of_rank(r): TOPO.nodes[TOPO.node_of_rank(r)].host for r in range(16)}
    capped = [dataclasses.replace(f, rate_bps=120 * 10**9) if nic[f.src] != nic[f.dst] else f for f in flows]
    room = flow_and_ns3_end_ns(TOPO, capped)
    assert room["ns3"] == pytest.approx(room["flow"], rel=1e-3)
    model = flow_and_ns3_end_ns(TOPO, flows)
    assert model["ns3"] > 1.01 * model["flow"]
