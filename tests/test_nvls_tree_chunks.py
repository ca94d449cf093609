"""NVLS-Tree's tree between hosts as NCCL's kernel moves it: a flow per channel, head GPU and loop on each edge.

all_reduce.h (NCCL_ALGO_NVLS_TREE, v2.29.7-1): each channel walks its own part of the buffer (`ncclCollCbdPart`,
parts dealt by enqueue.cc scheduleCollTasksToPlan over the NVLS channels) in loops of nHeads x chunkCount; head GPU
h sends `min(chunkCount, channelCount - (elemOffset + h x chunkCount))` of each loop up its channel's tree and gets
it back down, the last loop's chunkCount `alignUp(divUp(rest, nHeads), 16 / sizeof(T))`; channel c runs tree c % 2
of the double binary tree of hosts (connect.cc `treeUp[c%2]`). Chunks from calcCollChunking (enqueue.cc): the NVLS
chunk (128 KiB, nvls.cc) halved while the part is under 32 / 16 / 4 / 1 x nHeads x chunk and the chunk above
256 / 128 / 64 / 32 KiB. The figures are written out here, not read from the code."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit, is_cts
from phantora.collectives.nccl.nvls_tree_loops import head_loops
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import rail_optimized

KiB, MiB = 1 << 10, 1 << 20
HEADS = 8  # one head a GPU of an 8-GPU H100 host (nvls.cc: nHeads = the node's GPUs, at most 32)
CHANNELS = 16  # NCCL_NVLS_NCHANNELS' default on H100 (nvls.cc), the channels NVLS-Tree is dealt over


@pytest.mark.parametrize(
    ("part", "chunk", "want"),
    [
        (3 * 512 * KiB, 128 * KiB, [[128 * KiB, 64 * KiB]] * 8),  # a whole loop, then 512 KiB: 64 KiB a head
        (64 * KiB, 32 * KiB, [[8 * KiB]] * 8),  # no whole loop: 64 KiB / 8
        (100_000, 8 * KiB, [[8 * KiB, 4_320]] * 7 + [[8 * KiB, 4_224]]),  # 34,464 left: 4,308 up to 4,320 a head
        (48, 8 * KiB, [[16]] * 3 + [[0]] * 5),  # 6 B a head, up to 16: three heads have it, five move nothing
        (0, 8 * KiB, [[]] * 8),  # no loop
    ],
)
def test_head_loops_walk_nccls_loops(part: int, chunk: int, want: list[list[int]]) -> None:
    assert head_loops(part, chunk, HEADS) == want
    assert sum(map(sum, head_loops(part, chunk, HEADS))) == part


def run_ns(flows: list, topo) -> float:
    sim = FlowSimulator(topo)
    sim.submit(flows, at=0)
    return max(c.end_ns for c in sim.drain())


@pytest.mark.parametrize(
    ("size", "loops"),
    [
        # 20 MiB: 16 parts of 1.25 MiB (40 MiB of traffic over 16 channels); chunk 64 KiB (under 4 x 8 x 128 KiB);
        # two loops of 8 x 64 KiB, then 256 KiB: 32 KiB a head
        (20 * MiB, [64 * KiB, 64 * KiB, 32 * KiB]),
        # 256 MiB: 16 parts of 16 MiB; chunk 128 KiB (not under 16 x 8 x 128 KiB); 16 loops
        (256 * MiB, [128 * KiB] * 16),
    ],
)
def test_a_flow_per_channel_head_and_loop(size: int, loops: list[int]) -> None:
    """NVLS-Tree all-reduce on 2 x 8 H100s, chunked: between the hosts, for each of the 16 channels and each head
    GPU i, one flow a loop up and one down between the hosts' GPU i, of NCCL's chunk; even channels reduce towards
    one host and odd ones towards the other (tree 1 is tree 0 mirrored on two hosts, trees.cc ncclGetDtree). Each
    channel's connections are its own: their steps wait for clear-to-sends of their own (8 slots a connection: a
    step past the eighth waits for the receiver's consumption of the one 8 back). The call keeps NCCL's time (the
    coarse flows') to 0.1%, and every byte."""
    topo = rail_optimized(2, 8, gpu="h100")
    env = nccl_env({"NCCL_ALGO": "NVLSTree"})
    coll = Collective("all_reduce", tuple(range(16)), size, "fp32")
    dag = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=env))
    assert dag.choice is not None and (dag.choice["algorithm"], dag.choice["channels"]) == ("NVLSTree", CHANNELS)
    host = {n: topo.nodes[n].host for n in topo.endpoints}
    local = {n: i % 8 for i, n in enumerate(topo.endpoints)}
    by_id = {f.id: f for f in dag.flows}
    tree = [f for f in dag.flows if not is_credit(f) and host[f.src] != host[f.dst]]
    conns: dict[tuple[int, str, int, int], list] = defaultdict(list)
    for f in tree:
        channel = int(f.tag.split("/ch")[1].split("/")[0])
        phase = f.tag.split("/")[-2] if "/chunk" in f.tag else f.tag.split("/")[-1]
        conns[channel, phase, f.src, f.dst].append(f)
        assert local[f.src] == local[f.dst]  # head i's chunks go between the hosts' GPU i
    assert len(conns) == CHANNELS * HEADS * 2
    toward: dict[int, set[int]] = defaultdict(set)
    for (channel, phase, src, dst), steps in conns.items():
        assert [f.size for f in steps] == loops
        if phase == "up":
            toward[channel % 2].add(host[dst])
        for s, f in enumerate(steps):
            (cts,) = [by_id[d] for d in f.deps if is_cts(by_id[d])]
            assert (cts.src, cts.dst, cts.size) == (dst, src, 64)
            assert (steps[s - 8].id in cts.deps) if s >= 8 else not cts.deps
    assert len(toward[0]) == len(toward[1]) == 1 and toward[0] != toward[1]
    assert Counter(f.size for f in tree) == Counter({s: 2 * CHANNELS * HEADS * n for s, n in Counter(loops).items()})
    coarse = decompose(coll, topo, AlgoOptions(granularity="coarse", nccl_env=env))
    assert sum(f.size for f in dag.flows if not is_credit(f)) == sum(f.size for f in coarse.flows)
    assert run_ns(dag.flows, topo) == pytest.approx(run_ns(coarse.flows, topo), rel=1e-3)


@pytest.mark.ns3
def test_ns3_carries_the_per_chunk_tree_flows(ns3_lib) -> None:
    """Through ns-3 (DCQCN), a 4 MiB NVLS-Tree all-reduce on 2 x 8 H100s, chunked (16 parts of 256 KiB, a 32 KiB
    chunk: one loop of 8 x 32 KiB): each of the 256 tree steps between the hosts leaves only once its 64 B
    clear-to-send has landed, and ns-3 ends within 2% of the flow network at the packets' goodput."""
    from tests.engine_pair import flow_and_ns3_end_ns, start_end_ns

    topo = rail_optimized(2, 8, gpu="h100")
    env = nccl_env({"NCCL_ALGO": "NVLSTree"})
    dag = decompose(Collective("all_reduce", tuple(range(16)), 4 * MiB, "fp32"), topo,
                    AlgoOptions(granularity="chunked", nccl_env=env))  # fmt: skip
    host = {n: topo.nodes[n].host for n in topo.endpoints}
    tree = [f for f in dag.flows if not is_credit(f) and host[f.src] != host[f.dst]]
    assert len(tree) == 2 * CHANNELS * HEADS and {f.size for f in tree} == {32 * KiB}
    done = start_end_ns("ns3", topo, dag.flows)
    by_id = {f.id: f for f in dag.flows}
    for f in tree:
        (cts,) = [by_id[d] for d in f.deps if is_cts(by_id[d])]
        assert done[f.id][0] >= done[cts.id][1]
    times = flow_and_ns3_end_ns(topo, dag.flows)
    assert times["ns3"] == pytest.approx(times["flow"], rel=0.02)
