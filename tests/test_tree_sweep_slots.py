"""A one-node LL / LL128 tree's slots: its chunks cross a hop in sweeps of lines, and the connection's NCCL_STEPS
(8) slots are a chunk's each. runTreeSplit (all_reduce.h) makes one primitive call a chunk, and the call waits once
for a free slot (`waitSend`: the head NCCL_STEPS back), then its warps store the chunk's lines sweep after sweep
without waiting again; the receiver raises the head once its call has read (and sent on) the whole chunk
(`postRecv`; prims_ll.h, prims_ll128.h, NCCL v2.29.7-1). Closed forms written out here on a star of one host (the
credit a flag stored across the path: its propagation), no rate caps, so the links alone set the pace."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import credit_latency, is_credit
from phantora.collectives.dag import DagBuilder, communicator_id
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.tree import tree_flows
from phantora.netsim.base import Flow
from phantora.topology import Topology
from tests.test_back_pressure import G, run

NCCL_STEPS = 8  # src/include/device.h
LINK_NS = 1000  # each GPU's link to the switch: a path of two links, P = 2,000 ns
SWEEP = 448 * 8 * 8 * 120 // 128  # an LL128 reduce-half sweep: 448 threads x 8 words x 120/128 data, 26,880 B
PER_CHUNK = 4  # sweeps a chunk
CHUNKS = 64


def one_host_star(rates: list[int]) -> tuple[Topology, list[int]]:
    """One switch, GPU i on a link of `rates[i]` bit/s, every GPU in host 0; the topology and the GPUs' nodes."""
    t = Topology()
    gpus = [t.add_node("gpu", host=0) for _ in rates]
    sw = t.add_node("switch")
    for g, rate in zip(gpus, rates, strict=True):
        t.add_link(g, sw, rate, LINK_NS)
    return t.validate(), gpus


def broadcast_half(rates: list[int], window: int) -> tuple[Topology, list[Flow], list[list[Flow]]]:
    """The broadcast half of a tree of GPUs 0 -> 1 -> 2 (GPU 0 the root) in `CHUNKS` chunks of `PER_CHUNK` sweeps,
    `window` slots an edge: the topology, its flows and each edge's sweeps in order."""
    topo, gpus = one_host_star(rates)
    b = DagBuilder(gpus, tuple(range(3)), 0, "", comm=communicator_id("tree", range(3)))
    b.host_of = dict.fromkeys(gpus, 0)
    b.credit_ns = credit_latency(topo, gpus)
    tree_flows(b, [None, 0, 1], CHUNKS * PER_CHUNK * SWEEP, 0, up=False, down=True, chunked=True,
               chunk_bytes=PER_CHUNK * SWEEP, step_delay_ns=0, name="tree", sweeps=(SWEEP, SWEEP),
               window=window)  # fmt: skip
    flows = b.finish().flows
    edges = [[f for f in flows if (f.src, f.dst) == (gpus[v], gpus[v + 1])] for v in (0, 1)]
    return topo, flows, edges


def test_a_chunks_sweeps_go_back_to_back() -> None:
    """Equal 100 Gbit/s links: within a chunk the sweeps of an edge end one sweep time x = 26,880 B / 100 Gbit/s
    = 2,150.4 ns apart, none waiting for the one before to land; one sweep in flight (the tree before) waited
    P + x a sweep, 4,150.4 ns. Each chunk's first sweep alone waits for a slot: past the first window, for the
    flag of the chunk NCCL_STEPS back, one a chunk (the receiver's kernel stores it once it has sent the chunk
    on; the leaf once it has it)."""
    x, p = SWEEP * 8e9 / (100 * G), 2 * LINK_NS
    topo, flows, edges = broadcast_half([100 * G] * 3, NCCL_STEPS)
    done = run(topo, flows)
    by_id = {f.id: f for f in flows}
    for sweeps in edges:
        assert len(sweeps) == CHUNKS * PER_CHUNK
        gaps = [done[b.id][1] - done[a.id][1] for a, b in zip(sweeps, sweeps[1:], strict=False)]
        assert min(gaps) == pytest.approx(x, abs=1) and sorted(gaps)[len(gaps) // 2] == pytest.approx(x, abs=1)
        for i, f in enumerate(sweeps):
            flags = [by_id[d] for d in f.deps if is_credit(by_id[d])]
            assert len(flags) == (1 if i >= NCCL_STEPS * PER_CHUNK else 0)  # the same flag for a chunk's sweeps
            assert all(g.src == g.dst == f.src and g.delay_ns == p for g in flags)
    assert sum(is_credit(f) for f in flows) == 2 * (CHUNKS - NCCL_STEPS)
    topo, flows, edges = broadcast_half([100 * G] * 3, 1)
    done = run(topo, flows)
    gaps = [done[b.id][1] - done[a.id][1] for a, b in zip(edges[0], edges[0][1:], strict=False)]
    assert gaps == pytest.approx([p + x] * len(gaps), abs=1)


def test_a_slow_edge_paces_the_root_a_window_ahead() -> None:
    """GPU 2's link at 25 of 100 Gbit/s: the slow edge 1 -> 2 sends its sweeps back to back (8,601.6 ns each, a
    chunk T = 34,406.4 ns), and the root is held by the slots: its chunk c >= 8 leaves once its queue is free
    (its chunk c - 1 sent, 4 sweeps of x = 2,150.4 ns) and GPU 1 has written chunk c - 8 on into GPU 2's slot, a
    flag later (GPU 1's call raises the head once it has sent the chunk's last sweep on, prims_ll128.h
    `postRecv`; `back_pressure.written`): start(c) = max(start(c - 1) + 4x, end of the slow edge's chunk c - 8 +
    P). So past the first chunks, which fill the slots at the root's own pace (up to chunk 9), the root moves a
    chunk per T, the slow edge's pace, its last sweep done at 1,945,603 ns (1,672,339 before 2026-12-05, when GPU
    1 freed the slot as its send of the chunk was released, behind up to 7 chunks on the slow edge: two windows
    ahead); one sweep in flight and no slots (the tree before) let it run at its own pace, 4 x (P + x) =
    16,601.6 ns a chunk, and finish 2.2x sooner than the slow edge."""
    slow, x, p = SWEEP * 8e9 / (25 * G), SWEEP * 8e9 / (100 * G), 2 * LINK_NS
    topo, flows, (root, mid) = broadcast_half([100 * G, 100 * G, 25 * G], NCCL_STEPS)
    done = run(topo, flows)
    gaps = [done[b.id][1] - done[a.id][1] for a, b in zip(mid[PER_CHUNK:], mid[PER_CHUNK + 1 :], strict=False)]
    assert gaps == pytest.approx([slow] * len(gaps), abs=1)
    paced = 0
    for c in range(NCCL_STEPS, CHUNKS):
        first, held_by = root[c * PER_CHUNK], mid[(c - NCCL_STEPS) * PER_CHUNK + PER_CHUNK - 1]
        free, slot = done[root[c * PER_CHUNK - 1].id][0] + x, done[held_by.id][1] + p
        assert done[first.id][0] == pytest.approx(max(free, slot), abs=2)
        paced += slot > free
    assert paced == CHUNKS - 10  # from chunk 10 on
    ends = [done[root[c * PER_CHUNK + PER_CHUNK - 1].id][1] for c in range(20, CHUNKS)]
    assert (ends[-1] - ends[0]) / (len(ends) - 1) == pytest.approx(PER_CHUNK * slow, abs=PER_CHUNK)  # ns rounding
    topo, flows, (root1, mid1) = broadcast_half([100 * G, 100 * G, 25 * G], 1)
    one = run(topo, flows)
    ends = [one[root1[c * PER_CHUNK + PER_CHUNK - 1].id][1] for c in range(CHUNKS)]
    assert (ends[-1] - ends[0]) / (CHUNKS - 1) == pytest.approx(PER_CHUNK * (p + x), abs=PER_CHUNK)
    assert one[mid1[-1].id][1] / one[root1[-1].id][1] > 2.2


def test_one_node_ll128_tree_takes_a_chunks_slot_once() -> None:
    """A 16 MiB LL128 tree all-reduce on one node of 8 H100s (24 channels, a chain of 7 NVLink hops up and 7 down).
    NCCL 2.30's parts (enqueue.cc scheduleCollTasksToPlan, `tests/test_nccl_chunked.py`): 23 channels of 43 cells
    of 16 KiB (704,512 B) and one of 35 (573,440 B); each part's chunk from LL128's ladder (nstepsLL128 = 1.8:
    576,000 halved while part // chunk < 14.4 and chunk > 128 KiB, to 72,000, cut to 37 whole 1,920 B grains,
    71,040 B): 10 chunks and 9. On every edge the sweeps of chunk c >= 8 wait for one flag, the same for the
    chunk's sweeps (the receiver's consumption of chunk c - 8), and the others for none: 2 flags an edge of the 23
    channels, 1 of the last, 14 x (23 x 2 + 1) = 658 in all. Every byte is coarse's."""
    from phantora.topology import dgx_host

    topo = dgx_host(gpu="h100")
    options = AlgoOptions(granularity="chunked", nccl_env=nccl_env({"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL128"}))
    coll = Collective("all_reduce", tuple(range(8)), 16 << 20, "fp32")
    flows = decompose(coll, topo, options).flows
    by_id = {f.id: f for f in flows}
    edges: dict[tuple[str, int, int], list[Flow]] = {}
    for f in flows:
        if not is_credit(f):
            edges.setdefault((f.tag.split("/chunk")[0], f.src, f.dst), []).append(f)
    assert len(edges) == 24 * 14
    per_edge = []
    for sweeps in edges.values():
        flags = [tuple(d for d in f.deps if is_credit(by_id[d])) for f in sweeps]
        first = next((i for i, g in enumerate(flags) if g), len(flags))
        assert all(len(g) == 1 for g in flags[first:]) and not any(flags[:first])  # from chunk 8 on, one each
        runs = [g for i, g in enumerate(flags[first:], first) if g != flags[i - 1]]
        assert len(runs) == len(set(runs))  # a flag for one chunk's sweeps, in a row
        per_edge.append(len(runs))
    assert sorted(per_edge) == [1] * 14 + [2] * 23 * 14
    assert sum(is_credit(f) for f in flows) == 14 * (23 * 2 + 1)
    coarse = decompose(coll, topo, AlgoOptions(granularity="coarse", nccl_env=options.nccl_env))
    assert sum(f.size for f in flows if not is_credit(f)) == sum(f.size for f in coarse.flows)


@pytest.mark.ns3
def test_ns3_sends_a_chunks_sweeps_behind_its_slot(ns3_lib) -> None:
    """Through ns-3 (DCQCN) the same broadcast half on equal links: no sweep leaves before the flag of its chunk's
    slot has come back (one a chunk past the first window), and an edge's sweeps follow each other on the wire:
    consecutive sweeps end less than x + P / 2 apart (one sweep in flight would take P + x = 4,150.4 ns; each
    packet's headers stretch x through ns-3)."""
    from tests.engine_pair import start_end_ns

    x, p = SWEEP * 8e9 / (100 * G), 2 * LINK_NS
    topo, flows, edges = broadcast_half([100 * G] * 3, NCCL_STEPS)
    done = start_end_ns("ns3", topo, flows)
    by_id = {f.id: f for f in flows}
    held = 0
    for f in flows:
        for d in f.deps:
            if is_credit(by_id[d]) and not is_credit(f):
                assert done[f.id][0] >= done[d][1]
                held += 1
    assert held == 2 * (CHUNKS - NCCL_STEPS) * PER_CHUNK
    for sweeps in edges:
        gaps = [done[b.id][1] - done[a.id][1] for a, b in zip(sweeps, sweeps[1:], strict=False)]
        assert x <= min(gaps) and max(gaps) < x + p / 2
