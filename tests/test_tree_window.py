"""A tree's steps in flight: NCCL keeps NCCL_STEPS (8) on each edge of a tree all-reduce and of NVLS-Tree's tree,
for every protocol (calcCollChunking, enqueue.cc: a tree chunk is one step; all_reduce.h runTreeUpDown /
runTreeSplit and NVLS-Tree's tree warps: ProtoSimple<1, 1>; prims_ll.h / prims_ll128.h `waitSend`: one wait a
chunk for the head NCCL_STEPS back; NCCL v2.29.7-1), and across hosts each step waits for its receiver's
clear-to-send (net.cc `recvProxyProgress`, net_ib). Closed forms written out here on a star of one GPU a host
(`tests/test_back_pressure.py`'s), with no rate caps, so the links alone set the pace; the chunked collectives'
structure read off `decompose`."""

from __future__ import annotations

from collections import defaultdict

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit, is_cts
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.tree import tree_flows
from phantora.netsim.base import Flow
from phantora.topology import rail_optimized
from tests.engine_pair import start_end_ns
from tests.test_back_pressure import G, builder, run, sends, star

KiB, MiB = 1 << 10, 1 << 20
NCCL_STEPS = 8  # src/include/device.h
CTS = 64  # sizeof(struct ncclIbSendFifo), net_ib/common.h: one receive's clear-to-send
STEP, STEPS = 64 * KiB, 64
RATE = 100 * G


def two_host_tree(latency_ns: int, window: int) -> tuple[list[Flow], list[Flow], list[Flow]]:
    """The all-reduce tree of 2 GPUs, each a host of its own (GPU 1 the leaf, GPU 0 the root), 64 steps of 64 KiB
    up and down, `window` in flight an edge, over 100 Gbit/s links of `latency_ns` each (a path of two): its flows,
    the leaf's steps up and the root's steps down."""
    topo, gpus = star([RATE, RATE], latency_ns)
    b = builder(topo, gpus, "tree")
    tree_flows(b, [None, 0], STEPS * STEP, 0, up=True, down=True, chunked=True, chunk_bytes=STEP, step_delay_ns=0,
               name="tree", window=window)  # fmt: skip
    flows = b.finish().flows
    return flows, sends(flows, gpus[1]), sends(flows, gpus[0])


def window_gaps(done: dict[int, tuple[int, int]], steps: list[Flow], w: int) -> list[int]:
    """ns between the ends of step c and step c + w, each c from the second window on."""
    return [done[steps[c + w].id][1] - done[steps[c].id][1] for c in range(w, len(steps) - w)]


def test_long_links_a_tree_edge_moves_a_window_a_round_trip() -> None:
    """50 µs links (a one-way path P of 100 µs): with 8 steps in flight an edge moves 8 steps per round trip, the
    step's path, the wire time x of the step that frees the slot (64 KiB / 100 Gbit/s) and the way back of its
    clear-to-send (P and 64 B / 100 Gbit/s): 8 x 64 KiB / (2P + x + 64 B / rate), 2.55 GB/s, the rate min(link,
    window x step / RTT) of a window-bound edge; within a window the steps go back to back. With one in flight (the
    tree before) a step waits for the one before to land, P + x a step: 0.62 GB/s, 4.1x slower. The other phase's
    steps and clear-to-sends share the links max-min, a CTS's 5.12 ns at a time: at most one each a step."""
    p, x, back = 2 * 50_000, STEP * 8e9 / RATE, CTS * 8e9 / RATE
    flows, up, down = two_host_tree(50_000, NCCL_STEPS)
    done = run(star([RATE, RATE], 50_000)[0], flows)
    for steps in (up, down):
        gaps = window_gaps(done, steps, NCCL_STEPS)
        assert min(gaps) == pytest.approx(2 * p + x + back, abs=1)  # each end rounded up to its ns
        assert max(gaps) <= 2 * p + x + back + NCCL_STEPS * (back + 1)
    window_rate = NCCL_STEPS * STEP / (2 * p + x + back)  # bytes a ns: GB/s
    assert window_rate == pytest.approx(2.554, abs=1e-3) and window_rate < RATE / 8e9
    flows, up, down = two_host_tree(50_000, 1)
    assert not any(is_credit(f) for f in flows)
    one = run(star([RATE, RATE], 50_000)[0], flows)
    for steps in (up, down):
        assert window_gaps(one, steps, 1) == pytest.approx([p + x] * (STEPS - 2), abs=1)
    assert STEP / (p + x) == pytest.approx(0.623, abs=1e-3)
    assert done[down[-1].id][1] < one[down[-1].id][1] / 3.5


def test_short_links_the_window_fills_the_pipe() -> None:
    """1 µs links (P = 2 µs): 8 x 64 KiB outlast the round trip (2P + x = 9.2 µs < 8x = 41.9 µs), so each edge
    runs at the link's rate, a step every x (and the other phase's CTS, 5.12 ns, sharing the link); one in flight
    waits P + x a step, 1.38x slower."""
    p, x, back = 2 * 1000, STEP * 8e9 / RATE, CTS * 8e9 / RATE
    assert 2 * p + x < NCCL_STEPS * x
    flows, up, down = two_host_tree(1000, NCCL_STEPS)
    done = run(star([RATE, RATE], 1000)[0], flows)
    for steps in (up, down):
        gaps = window_gaps(done, steps, 1)
        assert x - 1 <= min(gaps) and sum(gaps) / len(gaps) <= x + back + 1
    flows, up, down = two_host_tree(1000, 1)
    one = run(star([RATE, RATE], 1000)[0], flows)
    assert window_gaps(one, up, 1) == pytest.approx([p + x] * (STEPS - 2), abs=1)


def crossing_connections(flows: list[Flow], host: dict[int, int]) -> dict[tuple[str, int, int], list[Flow]]:
    """Each tree edge between hosts, (channel/phase tag, sender, receiver) -> its steps in order."""
    edges: dict[tuple[str, int, int], list[Flow]] = defaultdict(list)
    for f in flows:
        if not is_credit(f) and host[f.src] != host[f.dst]:
            edges[f.tag.rsplit("/", 1)[0], f.src, f.dst].append(f)
    return edges


def steps_of(pieces: list[Flow], by_id: dict[int, Flow]) -> list[tuple[Flow, list[Flow]]]:
    """A connection's flows between hosts as its steps: each step's clear-to-send and its flows, one a step under
    Simple, an LL / LL128 step's sweeps (the receiver's, as its lines land: collectives.md, Chains) behind the one
    clear-to-send they all wait for. Asserts that each flow waits for exactly one."""
    steps: list[tuple[Flow, list[Flow]]] = []
    for f in pieces:
        gates = [by_id[d] for d in f.deps if is_cts(by_id[d])]
        assert len(gates) == 1, f
        if steps and steps[-1][0].id == gates[0].id:
            steps[-1][1].append(f)
        else:
            steps.append((gates[0], [f]))
    return steps


CASES = [
    ("Tree", "Simple", 2, 2, 64 * MiB),
    ("Tree", "LL", 2, 2, 8 * MiB),
    ("Tree", "LL128", 2, 2, 8 * MiB),
    ("NVLSTree", "Simple", 2, 8, 256 * MiB),
]


@pytest.mark.parametrize(("algo", "proto", "hosts", "gpus", "size"), CASES)
def test_a_tree_edge_across_hosts_waits_for_clear_to_sends(
    algo: str, proto: str, hosts: int, gpus: int, size: int
) -> None:
    """A chunked tree all-reduce (and NVLS-Tree's tree) over 2 hosts of H100s: on every edge between the hosts step
    s < 8 waits for one 64 B clear-to-send from its receiver released at the call's start (the receives its proxy
    posts for the first NCCL_STEPS slots), and step s >= 8 for one released once the receiver has consumed step
    s - 8 (8 in flight, not 1: no step waits for the one before to land), or, where the receiver sends it on inside
    its host, once it has written it on (`back_pressure.written`). Every step keeps its protocol's bytes."""
    topo = rail_optimized(hosts, gpus, gpu="h100")
    env = nccl_env({"NCCL_ALGO": algo, "NCCL_PROTO": proto})
    coll = Collective("all_reduce", tuple(range(hosts * gpus)), size, "fp32")
    dag = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=env))
    assert dag.choice is not None and (dag.choice["algorithm"], dag.choice["protocol"]) == (algo, proto)
    host = {n: topo.nodes[n].host for n in topo.endpoints}
    by_id = {f.id: f for f in dag.flows}
    edges = {edge: steps_of(pieces, by_id) for edge, pieces in crossing_connections(dag.flows, host).items()}
    assert edges and max(len(steps) for steps in edges.values()) > NCCL_STEPS
    for (_, src, dst), steps in edges.items():
        for s, (g, step) in enumerate(steps):
            assert (g.src, g.dst, g.size) == (dst, src, CTS)
            for f in step:  # not the step before's arrival
                assert not any(d == steps[s - 1][1][-1].id for d in f.deps) if s else True
            if s < NCCL_STEPS:
                assert not g.deps  # posted at the start
            else:  # once the receiver has consumed step s - 8: it has it, or has written it on inside its host
                back = steps[s - NCCL_STEPS][1][-1].id
                assert back in g.deps or any(
                    back in by_id[d].deps and by_id[d].src == dst and host[by_id[d].dst] == host[dst] for d in g.deps
                ), (src, dst, s)
    data = [f for f in dag.flows if not is_credit(f)]
    coarse = decompose(coll, topo, AlgoOptions(granularity="coarse", nccl_env=env))
    assert sum(f.size for f in data) == sum(f.size for f in coarse.flows)


def steps_wait_for_their_cts(network: str, flows: list[Flow], topo) -> tuple[int, int]:
    """On `network`: (steps that waited for a clear-to-send, CTSs in flight); asserts that every step between hosts
    starts no earlier than the CTS it waits for ends."""
    done = start_end_ns(network, topo, flows)
    by_id = {f.id: f for f in flows}
    gated = 0
    for f in flows:
        for d in f.deps:
            if is_cts(by_id[d]) and not is_credit(f):
                assert done[f.id][0] >= done[d][1]
                gated += 1
    return gated, sum(is_cts(f) for f in flows)


@pytest.mark.ns3
def test_ns3_tree_steps_wait_for_their_cts(ns3_lib) -> None:
    """ns-3 (DCQCN) carries a chunked Tree/Simple all-reduce's clear-to-sends over 2 x 2 H100 as RDMA writes of their
    own, and every step between the hosts leaves only once its CTS has landed, as on the flow engine; the window
    between hosts keeps the call within 2% of the flow engine's time at the packets' goodput."""
    from tests.engine_pair import flow_and_ns3_end_ns

    topo = rail_optimized(2, 2, gpu="h100")
    env = nccl_env({"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"})
    coll = Collective("all_reduce", (0, 1, 2, 3), 16 * MiB, "fp32")
    flows = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=env)).flows
    for network in ("flow", "ns3"):
        gated, cts = steps_wait_for_their_cts(network, flows, topo)
        assert gated == cts > 0  # each clear-to-send gates one step
    times = flow_and_ns3_end_ns(topo, flows)
    assert times["ns3"] == pytest.approx(times["flow"], rel=0.02)
