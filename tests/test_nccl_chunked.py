"""`granularity=chunked` under the NCCL model: flows in NCCL's passes, steps and chunks, whose times are NCCL's.

Expected times come from NCCL's own model (its latency and algorithm bandwidth, the choice's `model_time_us`) and
from closed forms of the pipeline written out here; chunk sizes from NCCL's enqueue.cc (`calcCollChunking`:
the protocol's buffer over NCCL_STEPS, 4 steps a ring's Simple chunk), not from the code under test.
"""

from __future__ import annotations

import math

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.nccl import choose
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import Topology, rail_optimized
from tests.engine_pair import flow_and_ns3_end_ns

KiB, MiB = 1 << 10, 1 << 20
TOPO = rail_optimized(2, 2, gpu="h100")  # 2 hosts x 2 H100: 4 ranks, NVLink inside a host, a 400G NIC each
RANKS = (0, 1, 2, 3)


def opts(granularity: str, **env: str) -> AlgoOptions:
    return AlgoOptions(granularity=granularity, nccl_env=nccl_env(env))


def run(coll: Collective, options: AlgoOptions, topo: Topology = TOPO) -> tuple[float, dict, int]:
    """Time (µs) of one collective on an idle flow network, NCCL's choice, and the count of its flows that carry
    bytes (not the credits going back: `back_pressure.is_credit`)."""
    dag = decompose(coll, topo, options)
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1e3, dag.choice or {}, sum(not is_credit(f) for f in dag.flows)


@pytest.mark.parametrize(
    ("proto", "size"), [("LL", 64 * KiB), ("LL", MiB), ("LL128", 4 * MiB), ("Simple", 4 * MiB), ("Simple", 16 * MiB)]
)
def test_chunked_ring_takes_nccls_time(proto: str, size: int) -> None:
    """A ring all-reduce has no fill: every rank sends from its first step, so its 2(n-1) steps (times the passes)
    of a chunk each at the connection's rate take bytes / algbw, plus NCCL's latency and the network hops of the
    ring's longest chain that NCCL's count leaves out (`chain_us`, ring_chain.py; 3 on 2 hosts of 2 where NCCL
    counts 2, one more network hop at NCCL's net latency in place of an NVLink one) and, on LL and LL128, what the
    proxies' turns on every network step exceed the transfer by (`proxy_us`, proxy.py): NCCL's model time plus
    those, to 0.1%, and the coarse flows' time. The chunks' own hops are part of that latency, not added to it."""
    coll = Collective("all_reduce", RANKS, size, "fp32")
    t, choice, flows = run(coll, opts("chunked", NCCL_ALGO="Ring", NCCL_PROTO=proto))
    coarse, _, coarse_flows = run(coll, opts("coarse", NCCL_ALGO="Ring", NCCL_PROTO=proto))
    assert choice["algorithm"] == "Ring" and choice["protocol"] == proto
    hop = {"LL": 2.7 - 1.0, "LL128": 4.0 - 1.9, "Simple": 0.0}[proto]  # NET less NVLink ring hop; Simple: plateau
    assert choice.get("chain_us", 0.0) == pytest.approx(hop)
    assert proto != "Simple" or "proxy_us" not in choice
    nccl = choice["model_lat_us"] + hop + choice.get("proxy_us", 0.0) + size / (1000 * choice["model_algbw_gbs"])
    assert t == pytest.approx(nccl, rel=1e-3)
    assert t == pytest.approx(coarse, rel=1e-3)
    assert flows >= 2 * (len(RANKS) - 1) * coarse_flows  # at least a flow per step where coarse has one per edge


def ll128_tree_chunk(nbytes: int, channels: int) -> int:
    """calcCollChunking's LL128 tree chunk on 2 nodes of 2 GPUs: the LL128 step's data (its buffer over NCCL_STEPS,
    120 of 128 bytes), halved while too few whole chunks a channel (an integer quotient, against 64 then 16 x
    (1 + log2i 2 + 0.1 x 2) / 2)."""
    chunk = 120 * 640 * 8 * 8 // 8 // 16 * 15
    depth = 1 + 1 + 0.1 * 2
    while nbytes // (channels * chunk) < depth * 64 / 2 and chunk > 128 * KiB:
        chunk //= 2
    while nbytes // (channels * chunk) < depth * 16 / 2 and chunk > 32 * KiB:
        chunk //= 2
    return chunk


@pytest.mark.parametrize(("proto", "size"), [("LL128", MiB), ("Simple", 16 * MiB)])
def test_chunked_tree_charges_its_fill_once(proto: str, size: int) -> None:
    """Tree all-reduce on 2 x 2: a chunk crosses the network at its connection's rate (bytes / algbw per edge and
    direction) and a host's NVLink hop at the link's rate, so the chunks' own fill is about one network crossing
    less than a chunk time each way; the model's fill (NCCL's tree correction, its fit of measured trees, and
    `pipeline.py`'s stages beyond it) is larger and charged once, as coarse charges it: NCCL's latency plus its
    fill plus bytes / algbw (and, on LL128, what the proxies' turns exceed that by, `proxy_us`), never the fill
    twice. LL128 at 1 MiB (chunks of `ll128_tree_chunk`): the correction is the fill; Simple at 16 MiB (512 KiB
    chunks, one Simple step): `pipeline.py`'s (2h - 1) chunk times."""
    coll = Collective("all_reduce", RANKS, size, "fp32")
    options = opts("chunked", NCCL_ALGO="Tree", NCCL_PROTO=proto)
    t, _, flows = run(coll, options)
    nccl = choose(coll, TOPO, options)
    assert nccl is not None and nccl.algorithm == "tree"
    t_bw = size / (1000 * nccl.algbw)
    chunk = ll128_tree_chunk(size, nccl.channels) if proto == "LL128" else 4 * MiB // 8
    part = size // nccl.channels
    chunks = math.ceil(part / chunk)
    # each edge up and down, a flow a chunk; under LL128 the three edges' down half in sweeps of 192 threads x 60 B
    # (11,520 B: two a whole 18,000 B chunk, one the last chunk's 5,072 B; the up half's 26,880 B holds a chunk), the
    # hosts' edge too (its step lands in the receiver's sweeps)
    sizes = [chunk] * (part // chunk) + ([part % chunk] if part % chunk else [])
    down = sum(math.ceil(x / (192 * 60)) for x in sizes) if proto == "LL128" else chunks
    assert flows == nccl.channels * (3 * chunks + 3 * down)
    fill = (2 * 2 - 1) * t_bw / chunks
    model_fill = nccl.fit_us + nccl.fill_us  # what coarse adds to NCCL's latency without its correction
    assert model_fill == pytest.approx(max(nccl.fit_us, fill / 2), rel=1e-6)  # pipeline.py: the channel's rate
    want = nccl.lat_us - nccl.fit_us + model_fill + t_bw + nccl.proxy_us
    assert t == pytest.approx(want, rel=0.01)
    assert t < want + model_fill / 2  # not charged twice


def test_buffsize_sets_the_simple_step_of_chunked_flows() -> None:
    """NCCL_BUFFSIZE = 1 MiB: a 128 KiB Simple step (512 KiB by default). A tree's chunk is one step: a 16 MiB tree
    all-reduce's largest flow is 128 KiB, four times as many flows; a ring's chunk is 4 steps (512 KiB, 2 MiB by
    default): a 64 MiB ring all-reduce on 4 ranks and 8 channels (2 MiB a rank and channel) runs 4 passes instead
    of one (each chunk as its 2 slices), in NCCL's time still (the passes run one after another, each at the
    connection's rate). The coarse
    flows do not change: one per connection and algorithm step whatever the step size."""
    tree = Collective("all_reduce", RANKS, 16 * MiB, "fp32")
    default = decompose(tree, TOPO, opts("chunked", NCCL_ALGO="Tree", NCCL_PROTO="Simple"))
    small = decompose(tree, TOPO, opts("chunked", NCCL_ALGO="Tree", NCCL_PROTO="Simple", NCCL_BUFFSIZE=str(MiB)))
    assert max(f.size for f in default.flows) == 512 * KiB
    assert max(f.size for f in small.flows) == 128 * KiB
    assert sum(not is_credit(f) for f in small.flows) == 4 * sum(not is_credit(f) for f in default.flows)
    ring = Collective("all_reduce", RANKS, 64 * MiB, "fp32")
    env = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
    t1, one, n1 = run(ring, opts("chunked", **env))
    t4, four, n4 = run(ring, opts("chunked", **env, NCCL_BUFFSIZE=str(MiB)))
    assert one["channels"] == four["channels"] == 8
    assert n4 == 4 * n1 == 4 * 8 * 2 * 3 * len(RANKS) * 2  # channels x 2(n - 1) steps x n senders x 2 slices, a pass
    for t, choice in ((t1, one), (t4, four)):
        assert t == pytest.approx(choice["model_lat_us"] + 64 * MiB / (1000 * choice["model_algbw_gbs"]), rel=1e-3)
    plain = decompose(ring, TOPO, opts("coarse", **env)).flows
    buffered = decompose(ring, TOPO, opts("coarse", **env, NCCL_BUFFSIZE=str(MiB))).flows
    assert [f.size for f in plain] == [f.size for f in buffered]


@pytest.mark.ns3
@pytest.mark.parametrize(("algo", "proto", "size"), [("Ring", "LL", MiB), ("Tree", "LL128", MiB)])
def test_packet_mode_carries_the_chunks_in_nccls_time(ns3_lib, algo: str, proto: str, size: int) -> None:
    """Through ns-3 each chunk is a message of its connection: ns-3 delivers every flow's wire bytes (the ring's
    2(n-1)/n S per rank, LL x2; the tree's S per edge and direction, LL128 128/120 a line) and ends within 2% of
    NCCL's time on the flow network at the packets' goodput (what headers leave of the links)."""
    coll = Collective("all_reduce", RANKS, size, "fp32")
    dag = decompose(coll, TOPO, opts("chunked", NCCL_ALGO=algo, NCCL_PROTO=proto))
    n = len(RANKS)
    steps = [f for f in dag.flows if not is_credit(f)]  # not the clear-to-sends going back
    if algo == "Ring":
        assert sum(f.size for f in steps) == 2 * n * 2 * (n - 1) * size // n  # LL: twice the ring's bytes
    else:
        per_edge = [math.ceil(f.size / 128) * 120 for f in steps]  # data of each flow's LL128 lines
        assert sum(per_edge) >= 2 * (n - 1) * size  # every edge up and down carries the channel's share
    times = flow_and_ns3_end_ns(TOPO, dag.flows)  # one message a chunk and step: the bursts
    assert times["ns3"] == pytest.approx(times["flow"], rel=0.02)


def test_one_node_simple_ring_keeps_its_kernels_fill() -> None:
    """A Simple ring inside one NVLink node has no pipeline fill of its chunks (it runs in lockstep), but NCCL's
    ring kernel one slice of its first pass (`ring_kernel.py`): the chunked flows charge that as coarse does, so
    8 H100s take the same time either way, and it is more than NCCL's own model time by that slice."""
    from phantora.topology import dgx_host

    topo = dgx_host(gpu="h100")
    coll = Collective("all_reduce", tuple(range(8)), 64 * MiB, "fp32")
    times = {}
    for gran in ("coarse", "chunked"):
        times[gran], choice, _ = run(coll, opts(gran, NCCL_ALGO="Ring", NCCL_PROTO="Simple"), topo)
    assert choice["fill_us"] > 1.0
    assert times["chunked"] == pytest.approx(times["coarse"], rel=1e-3)
    assert times["chunked"] == pytest.approx(choice["model_time_us"] + choice["fill_us"], rel=1e-2)


def coarse_and_chunked(coll: Collective, topo: Topology, **env: str) -> tuple[float, float, list, list, dict]:
    """Times (µs) of `coll` coarse and chunked on an idle flow network, both DAGs' flows, and NCCL's choice."""
    out = []
    for gran in ("coarse", "chunked"):
        dag = decompose(coll, topo, opts(gran, **env))
        sim = FlowSimulator(topo)
        sim.submit(dag.flows, at=0)
        out.append((max(c.end_ns for c in sim.drain()) / 1e3, dag.flows, dag.choice or {}))
    return out[0][0], out[1][0], out[0][1], out[1][1], out[1][2]


def test_chunked_nvls_runs_nccls_loops_in_coarse_time() -> None:
    """NVLS all-reduce of 64 MiB on 8 H100s, 16 channels x 8 heads: calcCollChunking's ladder takes the 128 KiB
    NVLS chunk to 64 KiB (64 MiB < 64 x 128 ops x 128 KiB, not < 8 x 128 x 64 KiB), so nLoops = 64 MiB / (128 x
    64 KiB) = 8: each GPU's (m + 1)/m S of NVLink bytes is 8 loops one after another, in the coarse flow's time."""
    from phantora.topology import dgx_host

    topo = dgx_host(gpu="h100")
    coll = Collective("all_reduce", tuple(range(8)), 64 * MiB, "fp32")
    coarse, chunked, flows0, flows1, choice = coarse_and_chunked(coll, topo, NCCL_ALGO="NVLS")
    assert (choice["algorithm"], choice["channels"]) == ("NVLS", 16)
    assert len(flows1) == 8 * len(flows0) == 8 * 8
    assert sum(f.size for f in flows1) == sum(f.size for f in flows0) == 8 * 64 * MiB * 9 // 8
    assert max(f.size for f in flows1) == 64 * MiB * 9 // 8 // 8
    assert chunked == pytest.approx(coarse, rel=1e-3)


@pytest.mark.parametrize(("size", "env", "net_chunk"), [(MiB, {"NCCL_P2P_NET_CHUNKSIZE": "16384"}, 8 * KiB),
                                                       (16 * MiB, {}, 128 * KiB)])  # fmt: skip
def test_chunked_all_to_all_moves_each_part_in_p2p_steps(size: int, env: dict, net_chunk: int) -> None:
    """All-to-all on 2 x 8 H100s (rail-optimised): each transfer's parts go in NCCL's p2p steps (addP2pToPlan):
    the communicator's net chunk (it spans nodes), halved to a peer on the other host when the transfer is under 8
    steps (64 KiB < 8 x 16 KiB), not when it is not (1 MiB = 8 x 128 KiB); to a peer on its own host the whole
    chunk. Every byte as coarse, in coarse's time (a connection's steps share its rate)."""
    topo = rail_optimized(2, 8, gpu="h100")
    coll = Collective("all_to_all", tuple(range(16)), size, "fp32")
    coarse, chunked, flows0, flows1, choice = coarse_and_chunked(coll, topo, **env)
    part = size // 16 // choice["channels"]
    step = int(env.get("NCCL_P2P_NET_CHUNKSIZE", 128 * KiB))
    assert max(f.size for f in flows1) == min(part, step)
    steps = [f for f in flows1 if not is_credit(f)]  # not the clear-to-sends going back
    remote = [f for f in steps if topo.shared_nvswitch(f.src, f.dst) is None and f.size]
    assert {f.size for f in remote} == {min(part, net_chunk)}
    assert sum(f.size for f in steps) == sum(f.size for f in flows0)
    assert chunked == pytest.approx(coarse, rel=5e-3)


def test_chunked_sendrecv_and_nvls_tree_keep_coarse_time() -> None:
    """Send/recv of 16 MiB between two H100s of one host (16 channels of 1 MiB, the 512 KiB NVLink p2p chunk: 2
    steps each) and an NVLS-Tree all-reduce of 256 MiB on 2 x 8 H100s (nLoops per operation): NCCL's steps, in
    the coarse flows' time."""
    from phantora.topology import dgx_host

    coll = Collective("send_recv", (0, 1), 16 * MiB, "fp32")
    coarse, chunked, flows0, flows1, choice = coarse_and_chunked(coll, dgx_host(gpu="h100"))
    assert choice["channels"] == 16 and len(flows1) == 2 * 16 and {f.size for f in flows1} == {512 * KiB}
    assert chunked == pytest.approx(coarse, rel=1e-3)
    coll = Collective("all_reduce", tuple(range(16)), 256 * MiB, "fp32")
    coarse, chunked, flows0, flows1, choice = coarse_and_chunked(coll, rail_optimized(2, 8, gpu="h100"))
    assert choice["algorithm"] == "NVLSTree" and len(flows1) > len(flows0)
    assert sum(f.size for f in flows1 if not is_credit(f)) == sum(f.size for f in flows0)
    assert chunked == pytest.approx(coarse, rel=5e-3)


@pytest.mark.ns3
@pytest.mark.parametrize(("kind", "group", "size"), [("all_to_all", RANKS, MiB), ("send_recv", (0, 2), 4 * MiB)])
def test_packet_mode_carries_p2p_steps(ns3_lib, kind: str, group: tuple[int, ...], size: int) -> None:
    """Chunked p2p steps (all-to-all and send/recv across the 2 x 2 hosts): ns-3 delivers every flow, one message
    a step, with every byte coarse carries, within 2% of the flow network at the packets' goodput."""
    topo = TOPO
    coll = Collective(kind, group, size, "fp32")
    dag = decompose(coll, topo, opts("chunked"))
    coarse = decompose(coll, topo, opts("coarse"))
    assert len(dag.flows) > len(coarse.flows)
    assert sum(f.size for f in dag.flows if not is_credit(f)) == sum(f.size for f in coarse.flows)
    times = flow_and_ns3_end_ns(topo, dag.flows)
    assert times["ns3"] == pytest.approx(times["flow"], rel=0.02)


@pytest.mark.parametrize(("kind", "size", "env"), [("all_reduce", 64 * MiB, {"NCCL_ALGO": "NVLSTree"}),
                                                   ("all_reduce", 64 * MiB, {"NCCL_ALGO": "Tree"}),
                                                   ("all_to_all", 16 * MiB, {})])  # fmt: skip
def test_chunked_steps_on_two_queue_pairs_keep_the_connections_rate(kind: str, size: int, env: dict) -> None:
    """NCCL_IB_QPS_PER_CONNECTION=2 without NCCL_IB_SPLIT_DATA_ON_QPS: a connection's messages take its queue pairs
    in turn (net_ib), and a chunked connection sends its steps one after another, so one message at a time moves
    at the whole connection's rate, and the call keeps the time it has on one queue pair (each queue pair's cap
    reckoned on its own half of the bytes made every step move at half the rate: NVLS-Tree +84%, Tree +68%,
    all-to-all +52%). Coarse runs are unchanged by the queue pairs (a message split over them)."""
    topo = rail_optimized(2, 8, gpu="h100")
    coll = Collective(kind, tuple(range(16)), size, "fp32")
    one = coarse_and_chunked(coll, topo, **env)
    two = coarse_and_chunked(coll, topo, NCCL_IB_QPS_PER_CONNECTION="2", **env)
    assert two[0] == pytest.approx(one[0], rel=1e-3)  # coarse
    assert two[1] == pytest.approx(one[1], rel=5e-3)  # chunked
    assert {f.key >> 56 for f in two[3] if f.key is not None} == {0, 1}  # both queue pairs carry steps


LL128_STEP = 120 * 640 * 8 * 8 // 8 // 128 * 120  # an LL128 step's data bytes (buffer / NCCL_STEPS x 120 / 128)
LL128_GRAIN = 32 * 8 // 16 * 15 * 8  # ncclProtoGrainSize(LL128): 1,920 data bytes, a warp's 8 words a lane
LL_STEP = 8 * 512 * 8 * 16 // 8 // 2  # an LL step's data bytes (half of its 16-byte lines)


def sweeps_of(part: int, chunk: int, sweep: int) -> int:
    """Sweeps a tree half makes of one channel's `part`: one primitive call a chunk (the last what is left), each
    call's warps sweeping it afresh (prims_ll.h / prims_ll128.h `GenericOp`)."""
    return sum(math.ceil(min(chunk, part - at) / sweep) for at in range(0, part, chunk))


@pytest.mark.parametrize(
    ("proto", "size", "cell", "cells", "chunks"),
    [
        ("LL128", 4 * MiB, 16 * KiB, (11, 3), (18 * LL128_GRAIN, 9 * LL128_GRAIN)),
        pytest.param("LL128", 64 * MiB, 16 * KiB, (171, 163), (LL128_STEP // 4,) * 2, marks=pytest.mark.slow),  # ~10 s
        ("LL", MiB, 4 * KiB, (11, 3), (LL_STEP,) * 2),
    ],
)
def test_one_node_tree_forwards_ll_lines_in_sweeps(
    proto: str, size: int, cell: int, cells: tuple[int, int], chunks: tuple[int, int]
) -> None:
    """A tree all-reduce inside one node of 8 H100s (a chain of 7 NVLink hops up, 7 down) under LL / LL128:
    runTreeSplit gives the reduce half 448 of the kernel's 640 threads (70% in whole warps) and the broadcast half
    192; each line carries its flag, so a hop forwards a chunk sweep by sweep: 8 data bytes a thread (LL) or
    8 words x 120/128 a lane (LL128). The flows are the sweeps, and the fill of 13 sweeps is shorter than the
    model's, which is charged once: NCCL's time, latency + fill + bytes / algbw (coarse's), within 5%: the model's
    fill is (stages - 1) chunks, and from NCCL 2.22 the 4 MiB LL128 chunk is 18 whole 1,920 B grains (34,560 B, not
    36,000), which shortens it (35.5 -> 33.7 µs) while the sweeps, smaller than either chunk, stay: 4.4% apart.
    The channels' parts are NCCL 2.30's (enqueue.cc scheduleCollTasksToPlan): the traffic (2 B a byte, x 4 under
    LL) over 24 channels rounded up to 16 B, in whole cells of 32 KiB of traffic (16 KiB of the count; LL 4 KiB):
    4 MiB LL128 and 1 MiB LL have 256 cells and a budget of 349,536 B = 11 cells (23 channels of 11, one of 3);
    64 MiB LL128 4,096 cells and 5,592,416 B = 171 cells (23 of 171, one of 163). Each part's chunk is its own
    (calcCollChunking with one channel and the part's bytes): LL's is a step's data, 32 KiB; LL128's ladder
    (nstepsLL128 = 1.8 on one node of 8: halve while part // chunk < 14.4 and chunk > 128 KiB, then while < 3.6 and
    > 32 KiB) takes 576,000 to 72,000 and 36,000 for a part of 180,224 B (5 chunks of 36,000) and on to 18,000 for
    one of 49,152 B, cut to whole grains: 34,560 and 17,280; a 64 MiB part (2,801,664 or 2,670,592 B) stops at
    144,000 (19 or 18 chunks of it), 75 grains. The last chunk of a part is what is left (64 MiB: 65,664 and
    78,592 B), and each chunk is swept afresh, so its last sweep is short: 64 MiB sends 7 x (23 x (117 + 253) +
    (111 + 241)) = 62,034 sweeps, where sweeping each whole part would make 58,513."""
    from phantora.topology import dgx_host

    topo = dgx_host(gpu="h100")
    coll = Collective("all_reduce", tuple(range(8)), size, "fp32")
    options = opts("chunked", NCCL_ALGO="Tree", NCCL_PROTO=proto)
    t, _, flows = run(coll, options, topo)
    nccl = choose(coll, topo, options)
    assert nccl is not None and nccl.algorithm == "tree"
    per_thread = 8 if proto == "LL" else 8 * 8 * 120 // 128
    up, down = 448 * per_thread, 192 * per_thread
    assert nccl.channels == 24
    parts = [(cells[0] * cell, chunks[0])] * 23 + [(cells[1] * cell, chunks[1])]
    assert sum(part for part, _ in parts) == size
    assert flows == sum(7 * (sweeps_of(part, chunk, up) + sweeps_of(part, chunk, down)) for part, chunk in parts)
    want = nccl.lat_us + nccl.chain_us + nccl.fill_us + size / (1000 * nccl.algbw)
    assert t == pytest.approx(want, rel=0.05)


# One node of 8 H100s, NCCL v2.30.7-1 src/graph/tuning.cc: the tree's 24 channels of 15 GB/s (360 GB/s of NVLink,
# NCCL's units), busBw x 0.92 for a tree all-reduce and its 0.5 ratio of algorithm to bus bandwidth; its latency
# baseLat[TREE][SIMPLE] + 2 x 7 x hwLat[NVLINK][TREE][SIMPLE] (µs)
TREE_CHANNELS, TREE_ALGBW_GBS, TREE_LAT_US = 24, 24 * 15.0 * 0.92 * 0.5, 8.4 + 2 * 7 * 4.0


@pytest.mark.parametrize(("size", "cells"), [(16 * MiB, (43, 35)), (64 * MiB, (171, 163))])
def test_one_node_simple_tree_halves_share_their_channel(size: int, cells: tuple[int, int]) -> None:
    """A Simple tree all-reduce inside one node of 8 H100s (a chain: 7 NVLink hops up, 7 down). runTreeSplit
    (all_reduce.h) runs a channel's reduce half and broadcast half side by side in the channel's one thread
    block: a GPU's sends up and down go one message at a time on one queue at the channel's whole rate, twice
    a connection's (each half has half of it once both run; a half alone, as in the fill, all of it). A chunk
    is one Simple step (512 KiB), posted whole, so the fill is 13 chunk times at the channel's rate beyond the
    first: NCCL's latency + 13 x 512 KiB / (2 x algbw / 24) + S / algbw, the coarse flows' time, to 0.1%. When
    each half had only its connection's rate, 64 MiB took 1347.95 us against coarse's 963.79 (+39.9%).
    NCCL 2.30 deals the channels unequal parts (channel_split: 16 KiB cells, S x 2 / 24 of traffic rounded up to
    16 B, in whole 32 KiB-traffic cells): 16 MiB: 23 channels of 43 cells and one of 35; 64 MiB: 171 and 163.
    Every channel is a CTA of the same kernel: all move at the rate that ends the busiest part in NCCL's time,
    2 x algbw x busiest / S (the smaller part ends sooner), and the time stays NCCL's."""
    from phantora.topology import dgx_host

    topo = dgx_host(gpu="h100")
    coll = Collective("all_reduce", tuple(range(8)), size, "fp32")
    env = {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}
    coarse, chunked, _, flows, choice = coarse_and_chunked(coll, topo, **env)
    assert choice["channels"] == TREE_CHANNELS
    assert choice["model_algbw_gbs"] == pytest.approx(TREE_ALGBW_GBS)
    channel_rate = 2 * TREE_ALGBW_GBS / TREE_CHANNELS  # GB/s: both halves' connections, an even share
    queues: dict[int, list] = {}
    for f in flows:
        queues.setdefault(f.queue, []).append(f)
    assert all(len({f.src for f in q}) == 1 for q in queues.values())  # a queue: one GPU's sends on a channel
    peers = sorted(len({f.dst for f in q}) for q in queues.values())
    assert peers == [1] * 2 * TREE_CHANNELS + [2] * 6 * TREE_CHANNELS  # the chain's ends send one way, the rest both
    middle = {f.rate_bps for q in queues.values() if len({f.dst for f in q}) == 2 for f in q}
    assert max(middle) == pytest.approx(min(middle), rel=1e-5)
    assert min(middle) == pytest.approx(2 * TREE_ALGBW_GBS * cells[0] * 16 * KiB / size * 8e9, rel=1e-5)
    assert cells[0] * 16 * KiB / size > 1 / TREE_CHANNELS > cells[1] * 16 * KiB / size  # above an even share
    fill = 13 * 4 * MiB // 8 / (1000 * channel_rate)
    want = TREE_LAT_US + fill + size / (1000 * TREE_ALGBW_GBS)
    assert chunked == pytest.approx(want, rel=1e-3)
    assert chunked == pytest.approx(coarse, rel=1e-3)
