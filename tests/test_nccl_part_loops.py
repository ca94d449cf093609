"""Chunked tree all-reduce and broadcast / reduce chain flows carry NCCL 2.22+'s own step bytes
(`nccl/part_loops.py`).

Expected byte lists are written out here from NCCL v2.30.7-1's arithmetic, none from the code under test:
- the channel parts (enqueue.cc `scheduleCollTasksToPlan`): traffic = count x 2 (all-reduce) or x 1 (broadcast,
  reduce), x 4 more under LL; a cell is 32 KiB of traffic (16 KiB of an all-reduce's count, 4 KiB under LL; 32 KiB of
  a broadcast's, 8 KiB under LL); the budget traffic // channels rounded up to 16 B; cellsPerChannel = ceil(budget /
  traffic per cell), the lo part as many, the mids cellsPerChannel each, the hi part the rest, the count's excess
  over whole cells off the hi part;
- the chunk (`calcCollChunking` per part, nChannels = 1): a Simple step (NCCL_BUFFSIZE / 8, 512 KiB by default), an
  LL step's data (32 KiB), LL128's 576,000 B halved by its tree ladder, then cut to whole grains (LL128 1,920 B);
- the loop (all_reduce.h `runTreeUpDown` / `runTreeSplit`, broadcast.h / reduce.h `runRing`): `nelem =
  min(chunkCount, channelCount - elemOffset)`: whole chunks, the last what is left, no realignment.
On the wire a flow is its chunk's lines: LL 16 B per 8 data bytes, LL128 128 B per 120, Simple the bytes.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host, rail_optimized
from tests.engine_pair import flow_and_ns3_end_ns

KiB, MiB = 1 << 10, 1 << 20
HOSTS2 = rail_optimized(2, 2, gpu="h100")  # 2 hosts x 2 H100: the tree's 8 channels
HOST8 = dgx_host(gpu="h100")  # one 8-GPU H100 host: 24 channels


def wire(data: int, proto: str) -> int:
    """Bytes on the wire of `data` payload bytes: whole LL (8 of 16 B) or LL128 (120 of 128 B) lines."""
    if proto == "LL":
        return math.ceil(data / 8) * 16
    if proto == "LL128":
        return math.ceil(data / 120) * 128
    return data


def steps(flows: list[Flow], channel: int, phase: str) -> dict[tuple[int, int], list[int]]:
    """Each (src, dst) edge's flow sizes on `channel` and `phase` (up / down), in the order they were made."""
    out: dict[tuple[int, int], list[int]] = defaultdict(list)
    for f in flows:
        parts = f.tag.split("/")
        if not is_credit(f) and parts[1] == f"ch{channel}" and parts[2] == phase:
            out[f.src, f.dst].append(f.size)
    return dict(out)


def run(kind: str, topo, n: int, size: int, **env: str) -> tuple[list[Flow], dict]:
    coll = Collective(kind, tuple(range(n)), size, "fp32", root=0)
    dag = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=nccl_env(env)))
    assert dag.choice is not None
    return dag.flows, dag.choice


def chunks(part: int, chunk: int) -> list[int]:
    return [chunk] * (part // chunk) + ([part % chunk] if part % chunk else [])


# 2 hosts x 2 H100, a tree all-reduce (8 channels; up and down 3 edges each: the chain in each host and the hosts'
# tree). Simple, 2^24 + 17 B: cells ceil(16,777,233 / 16,384) = 1,025; budget 33,554,466 // 8 = 4,194,308 -> 4,194,320;
# 129 cells a channel; lo 129, (1,025 - 129) // 129 = 6 mids, hi 896 % 129 = 122 cells less the excess 16,367 B:
# 7 parts of 2,113,536 B and one of 1,982,481; a 524,288 B chunk: 4 whole + 16,384, and 3 whole + 409,617.
# LL, 3 x 2^20 + 5 B: 4 KiB cells, 769 of them; budget 25,165,864 // 8 = 3,145,733 -> 3,145,744, 97 cells a
# channel; 6 mids, hi 672 % 97 = 90 cells less 4,091 B: 7 parts of 397,312 and one of 364,549; a 32,768 B chunk:
# 12 whole + 4,096, and 11 whole + 4,101.
# LL128, 3 x 2^20 + 5 B: Simple's cells: 193; budget 786,433 -> 786,448, 25 cells; 6 mids, hi 168 % 25 = 18 cells less
# 16,379 B: 7 parts of 409,600 and one of 278,533. The ladder (nstepsLL128 = 1 + log2i(2) + 0.1 x 2 = 2.2, ppn 2:
# halve while part // chunk < 70.4 and chunk > 128 KiB, then while < 17.6 and > 32 KiB): 576,000 -> 72,000 ->
# 18,000 for both parts, whole 1,920 B grains: 17,280; 23 whole + 12,160, and 16 whole + 2,053.
TWO_HOSTS = [
    ("Simple", 16 * MiB + 17, [(2_113_536, 524_288)] * 7 + [(1_982_481, 524_288)]),
    ("LL", 3 * MiB + 5, [(397_312, 32_768)] * 7 + [(364_549, 32_768)]),
    ("LL128", 3 * MiB + 5, [(409_600, 17_280)] * 7 + [(278_533, 17_280)]),
]


# Under LL / LL128 the NVLink edge inside each host forwards each chunk in sweeps of lines (the tree kernel's 640
# threads: 448 reduce, 192 broadcast; 8 B a thread under LL, 60 B under LL128), and the hosts' edge lands each step
# in the receiver's sweeps (the proxy sends a whole step, whose lines the next GPU reads as they land, net.cc); Simple
# whole chunks everywhere.
TREE_SWEEPS = {"LL": (448 * 8, 192 * 8), "LL128": (448 * 60, 192 * 60)}


@pytest.mark.parametrize(("proto", "size", "parts"), TWO_HOSTS)
def test_two_host_tree_steps(proto: str, size: int, parts: list[tuple[int, int]]) -> None:
    """Every edge of channel c carries its part up and down in NCCL's chunks, the last what is left; under LL /
    LL128 each hop, inside a host or between the hosts, cuts each chunk in sweeps."""
    flows, choice = run("all_reduce", HOSTS2, 4, size, NCCL_ALGO="Tree", NCCL_PROTO=proto)
    assert (choice["algorithm"], choice["protocol"], choice["channels"]) == ("Tree", proto, 8)
    assert sum(part for part, _ in parts) == size
    host = {HOSTS2.node_of_rank(r): r // 2 for r in range(4)}
    made = 0
    for c, (part, chunk) in enumerate(parts):
        assert sum(chunks(part, chunk)) == part
        for phase, sweep in zip(("up", "down"), TREE_SWEEPS.get(proto, (0, 0)), strict=True):
            edges = steps(flows, c, phase)
            assert len(edges) == 3
            for (src, dst), got in edges.items():
                cut = sweeps(part, chunk, sweep) if sweep else chunks(part, chunk)
                want = [wire(x, proto) for x in cut]
                assert got == want, (c, phase, src, dst)
                made += len(got)
            assert sum(host[s] != host[d] for s, d in edges) == 1
    data = [f for f in flows if not is_credit(f)]  # the steps; credits and clear-to-sends are no tensor bytes
    assert len(data) == made


def test_two_host_simple_tree_last_chunks_by_hand() -> None:
    """The same Simple case read off: channel 0's edges send four 512 KiB steps and a 16 KiB one, channel 7's three
    and 409,617 B (not near-equal chunks of 422,708 and 495,621 B)."""
    flows, _ = run("all_reduce", HOSTS2, 4, 16 * MiB + 17, NCCL_ALGO="Tree", NCCL_PROTO="Simple")
    for c, want in ((0, [524_288] * 4 + [16_384]), (7, [524_288] * 3 + [409_617])):
        assert {tuple(v) for v in steps(flows, c, "up").values()} == {tuple(want)}


# One host of 8 H100 (24 channels; the tree is a chain of 7 NVLink hops up and 7 down). Simple, 2^24 + 17 B: 1,025
# cells; budget 33,554,466 // 24 = 1,398,102 -> 1,398,112, 43 cells a channel; lo 43, 22 mids, hi 982 % 43 = 36
# cells less 16,367 B: 23 parts of 704,512 and one of 573,457: 524,288 + 180,224 and 524,288 + 49,169.
# LL, 2^20 + 17 B: 257 cells of 4 KiB; budget 8,388,744 // 24 = 349,531 -> 349,536, 11 cells; 22 mids, hi 246 % 11 =
# 4 cells less 4,079 B: 23 parts of 45,056 and one of 12,305: 32,768 + 12,288, and 12,305. Inside one node LL lines
# go on in sweeps (448 threads x 8 B up = 3,584 B, 192 x 8 = 1,536 B down), each chunk swept afresh.
def sweeps(part: int, chunk: int, sweep: int) -> list[int]:
    return [s for x in chunks(part, chunk) for s in chunks(x, sweep)]


def test_one_host_simple_tree_steps() -> None:
    flows, choice = run("all_reduce", HOST8, 8, 16 * MiB + 17, NCCL_ALGO="Tree", NCCL_PROTO="Simple")
    assert choice["channels"] == 24
    parts = [704_512] * 23 + [573_457]
    assert sum(parts) == 16 * MiB + 17
    for c, part in enumerate(parts):
        want = chunks(part, 524_288)
        assert want == ([524_288, 180_224] if c < 23 else [524_288, 49_169])
        for phase in ("up", "down"):
            edges = steps(flows, c, phase)
            assert len(edges) == 7 and all(got == want for got in edges.values()), (c, phase)


def test_one_host_ll_tree_sweeps_nccls_chunks() -> None:
    flows, choice = run("all_reduce", HOST8, 8, MiB + 17, NCCL_ALGO="Tree", NCCL_PROTO="LL")
    assert choice["channels"] == 24
    parts = [45_056] * 23 + [12_305]
    assert sum(parts) == MiB + 17
    for c, part in enumerate(parts):
        for phase, sweep in (("up", 3_584), ("down", 1_536)):
            want = [wire(x, "LL") for x in sweeps(part, 32_768, sweep)]
            edges = steps(flows, c, phase)
            assert len(edges) == 7 and all(got == want for got in edges.values()), (c, phase)
    assert steps(flows, 0, "up")[7, 6][9:] == [1_024] + [7_168] * 3 + [3_072]  # 32,768 = 9 x 3,584 + 512; 12,288


# Broadcast and reduce (NCCL's ring, here a chain from / to the root; 24 channels on one host). Their traffic is the
# count: Simple, 2^24 + 17 B: 513 cells of 32 KiB; budget 16,777,233 // 24 = 699,051 -> 699,056, 22 cells a channel;
# lo 22, 22 mids, hi 491 % 22 = 7 cells less 32,751 B: 23 parts of 720,896 and one of 196,625; a 512 KiB chunk
# (BROADCAST_CHUNKSTEPS = REDUCE_CHUNKSTEPS = 1 step): 524,288 + 196,608, and 196,625.
# LL: 8 KiB cells, 2,049; budget 67,108,932 // 24 = 2,796,205 -> 2,796,208, 86 cells; 22 mids, hi 1,963 % 86 = 71
# cells less 8,175 B: 23 parts of 704,512 and one of 573,457; 32 KiB chunks: 21 whole + 16,384, and 17 + 16,401.
# Inside the host an LL chunk crosses each hop in sweeps of the ring kernel's 512 threads' lines, 8 data bytes a
# thread (4,096 B), as each warp sends its lines on once they land (prims_ll.h `GenericOp`); Simple whole steps.
CHAINS = [
    ("Simple", [(720_896, 524_288)] * 23 + [(196_625, 524_288)], 0),
    ("LL", [(704_512, 32_768)] * 23 + [(573_457, 32_768)], 512 * 8),
]


@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
@pytest.mark.parametrize(("proto", "parts", "sweep"), CHAINS)
def test_chain_steps(kind: str, proto: str, parts: list[tuple[int, int]], sweep: int) -> None:
    flows, choice = run(kind, HOST8, 8, 16 * MiB + 17, NCCL_ALGO="Ring", NCCL_PROTO=proto)
    assert (choice["algorithm"], choice["protocol"], choice["channels"]) == ("Ring", proto, 24)
    assert sum(part for part, _ in parts) == 16 * MiB + 17
    phase = "down" if kind == "broadcast" else "up"
    for c, (part, chunk) in enumerate(parts):
        want = [wire(x, proto) for x in (sweeps(part, chunk, sweep) if sweep else chunks(part, chunk))]
        edges = steps(flows, c, phase)
        assert len(edges) == 7 and all(got == want for got in edges.values()), (c, kind)
    if proto == "LL":  # the last chunk's 16,401 B: 4 sweeps and 17 B, 3 lines
        assert steps(flows, 23, phase)[next(iter(steps(flows, 23, phase)))][-5:] == [8_192] * 4 + [48]


@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
def test_an_ll128_chain_forwards_its_chunks_sweep_by_sweep(kind: str) -> None:
    """LL128 inside one host: the ring kernel's 640 threads forward 60 data bytes a lane a sweep (8 words of 15/16
    data), so each hop takes a chunk in pieces of 38,400 B (320 lines of 128 B), not whole (prims_ll128.h)."""
    flows, choice = run(kind, HOST8, 8, 16 * MiB, NCCL_ALGO="Ring", NCCL_PROTO="LL128")
    assert (choice["algorithm"], choice["protocol"], choice["channels"]) == ("Ring", "LL128", 24)
    edges = steps(flows, 0, "down" if kind == "broadcast" else "up")
    assert len(edges) == 7
    sizes = next(iter(edges.values()))
    assert max(sizes) == wire(640 * 60, "LL128") == 320 * 128 and all(got == sizes for got in edges.values())


@pytest.mark.slow
@pytest.mark.ns3
def test_ns3_delivers_the_tree_steps(ns3_lib) -> None:
    """A small tree all-reduce through ns-3 (~10 s): 2 hosts x 2 H100, NCCL_MAX_NCHANNELS=2, a 128 KiB Simple buffer
    (16 KiB steps), 3 x 2^16 + 5 B: 13 cells of 16 KiB; budget 393,226 // 2 = 196,613 -> 196,624, 7 cells; lo 7, hi
    6 less 16,379 B: parts 114,688 (seven 16 KiB steps) and 81,925 (five and one of 5 B). ns-3 delivers every flow
    whole, each its step's bytes, and ends within 5% of the flow network at the packets' goodput."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine

    env = {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": "2", "NCCL_BUFFSIZE": str(128 * KiB)}
    flows, choice = run("all_reduce", HOSTS2, 4, 3 * 64 * KiB + 5, **env)
    assert choice["channels"] == 2
    for c, want in ((0, [16 * KiB] * 7), (1, [16 * KiB] * 5 + [5])):
        for phase in ("up", "down"):
            assert {tuple(v) for v in steps(flows, c, phase).values()} == {tuple(want)}
    sim = make_engine(EngineSpec(network="ns3"), HOSTS2)
    try:
        sim.submit(flows, at=0)
        done = sim.drain()
    finally:
        sim.close()
    assert {c.flow_id: c.size for c in done} == {f.id: f.size for f in flows}
    assert all(c.lost_bytes == 0 for c in done)
    times = flow_and_ns3_end_ns(HOSTS2, flows)
    assert times["ns3"] == pytest.approx(times["flow"], rel=0.05)


# NCCL v2.30.7-1 src/graph/tuning.cc on one host of 8 H100: the tree's 24 channels of 15 GB/s, busBw x 0.92 for a
# tree all-reduce and its 0.5 ratio of algorithm to bus bandwidth; latency baseLat[TREE][SIMPLE] + 2 x 7 x
# hwLat[NVLINK][TREE][SIMPLE] (µs).
TREE_ALGBW_GBS, TREE_LAT_US = 24 * 15.0 * 0.92 * 0.5, 8.4 + 2 * 7 * 4.0


def test_one_host_simple_tree_ends_at_the_channels_rate() -> None:
    """runTreeSplit runs a channel's root with all its threads and a middle GPU's two halves side by side, so every
    GPU's kernel on a channel sends at the channel's rate: the root (down only) and the leaf (up only) too, not at
    their own bytes over NCCL's time (half of it). The busiest part is 704,512 B of 2^24 + 17 (above), so the
    channel's rate is 2 x algbw x 704,512 / S. With NCCL's whole first chunk (524,288 B) the pipeline's fill is then
    12 chunk times less the 180,224 B last one, under the model's 13 (`pipeline.py`), which is charged: NCCL's
    latency + 13 x 524,288 B at the even channel share 2 x algbw / 24 + S / algbw, coarse's time, to 0.1%. (At a
    root's and leaf's own bytes the fill was 14 chunk times less the last one, +3.2% at this size.)"""
    size = 16 * MiB + 17
    coll = Collective("all_reduce", tuple(range(8)), size, "fp32")
    env = nccl_env({"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"})
    dag = decompose(coll, HOST8, AlgoOptions(granularity="chunked", nccl_env=env))
    rate = 2 * TREE_ALGBW_GBS * 704_512 / size * 8e9
    assert all(f.rate_bps == pytest.approx(rate, rel=1e-6) for f in dag.flows)
    ends = {}
    for granularity in ("coarse", "chunked"):
        sim = FlowSimulator(HOST8)
        sim.submit(decompose(coll, HOST8, AlgoOptions(granularity=granularity, nccl_env=env)).flows, at=0)
        ends[granularity] = max(c.end_ns for c in sim.drain()) / 1e3
    fill = 13 * 524_288 / (1000 * 2 * TREE_ALGBW_GBS / 24)
    want = TREE_LAT_US + fill + size / (1000 * TREE_ALGBW_GBS)
    assert ends["chunked"] == pytest.approx(want, rel=1e-3)
    assert ends["chunked"] == pytest.approx(ends["coarse"], rel=1e-3)


# NCCL 2.21 (v2.21.5-1 enqueue.cc `computeColl`, `computeCollAlignCount`, `computeCollLastChunkInfo`): the host
# splits the count into parts of alignUp(divUp(count, channels), alignCount), 4,096 B under Simple, and the ring
# all-reduce's last loop takes alignUp(divUp(rest, nranks), alignCount); the chunk is the call's (2 MiB for a Simple
# ring, one 512 KiB step for a tree), not cut to grains.
def test_nccl_2_21_ring_last_loop_aligned_to_4096_bytes() -> None:
    """2^20 + 17 B Simple ring all-reduce on 8 H100s, 24 channels: parts alignUp(43,692, 4,096) = 45,056 B, 24 of
    them, the last 1,048,593 - 23 x 45,056 = 12,305 B. One short loop each: 45,056 B -> chunk alignUp(5,632, 4,096) =
    8,192: five of 8,192, one of 4,096 and two empty; 12,305 B -> 4,096: three of 4,096, one of 17 and four empty
    (2.22 would cut 16-byte aligned chunks). Rank 0 sends chunk (0 - s - 1) mod 8 at step s < 7, (0 - s) mod 8 after."""
    flows, choice = run(
        "all_reduce", HOST8, 8, MiB + 17, NCCL_ALGO="Ring", NCCL_PROTO="Simple", PHANTORA_NCCL_VERSION="2.21"
    )
    assert choice["channels"] == 24
    order = [(0 - s - 1) % 8 for s in range(7)] + [(0 - s) % 8 for s in range(7)]
    for c, chunk in ((0, [8_192] * 5 + [4_096, 0, 0]), (23, [4_096] * 3 + [17, 0, 0, 0, 0])):
        sent = [f.size for f in flows if f.src == 0 and f.tag.startswith(f"ring/ch{c}/") and not is_credit(f)]
        assert sent == [chunk[j] for j in order], c
    assert sum(f.size for f in flows) == 14 * (MiB + 17)


def test_nccl_2_21_tree_parts_and_chunks() -> None:
    """2^24 + 17 B Simple tree all-reduce on one host of 8 H100s under 2.21, 24 channels: parts alignUp(699,052,
    4,096) = 700,416 B, the last 16,777,233 - 23 x 700,416 = 667,665 B; 512 KiB chunks, the last what is left."""
    flows, choice = run(
        "all_reduce", HOST8, 8, 16 * MiB + 17, NCCL_ALGO="Tree", NCCL_PROTO="Simple", PHANTORA_NCCL_VERSION="2.21"
    )
    assert choice["channels"] == 24
    for c, want in ((0, [524_288, 176_128]), (22, [524_288, 176_128]), (23, [524_288, 143_377])):
        edges = steps(flows, c, "up")
        assert len(edges) == 7 and all(got == want for got in edges.values()), c
