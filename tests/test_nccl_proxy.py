"""The proxy's turns on every network step (proxy.py): NCCL's double binary tree written out by hand from
graph/trees.cc, the connections and steps a GPU's proxy serves from NCCL's constants (NCCL_STEPS, the LL128
buffer, calcCollChunking's tree ladder), and the time the flow engine adds for them."""

from __future__ import annotations

import math

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import platform_of, proxy, tuning
from phantora.collectives.nccl.chunking import step_bytes
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.collectives.nccl.shape import propagation_ns
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.topology import rail_optimized
from phantora.topology.model import Topology

MiB = 1 << 20
LL128_STEP_DATA = 120 * 640 * 8 * 8 // 8 // 16 * 15  # NCCL_LL128 buffer / NCCL_STEPS, 120 of 128 bytes a line


def _hosts(nodes: int) -> tuple[Topology, tuple[int, ...]]:
    topo = rail_optimized(nodes, 8, spines=8, nic_rate="400Gbps", gpu="h100")
    return topo, tuple(range(8 * nodes))


def test_binary_trees_are_nccls() -> None:
    """ncclGetBtree on 4 and 8 nodes: 0 <- 2 <- {1, 3}; 0 <- 4 <- {2 <- {1, 3}, 6 <- {5, 7}}. ncclGetDtree mirrors
    it for an even count, so node 1 of 4 is tree 1's inner node; an odd count shifts it by one."""
    assert proxy.btree_parents(4) == [-1, 2, 0, 2]
    assert proxy.btree_parents(8) == [-1, 2, 4, 2, 0, 6, 4, 6]
    e0, e1 = proxy.dtree_edges(4)
    assert e0 == [1, 1, 3, 1] and e1 == [1, 3, 1, 1]
    e0, e1 = proxy.dtree_edges(3)  # 0 <- 2 <- 1; shifted: 1 <- 0 <- 2
    assert e0 == [1, 1, 2] and e1 == [2, 1, 1]
    assert proxy.dtree_edges(2) == ([1, 1], [1, 1])


def test_connections_a_gpu_serves() -> None:
    """16 channels on 8 NICs: a ring has a send and a receive per channel and node, 32 over 8 GPUs = 4; 24
    channels (NCCL_MIN_CTAS=24) 6. A tree: channels 0-7 on tree 0, 8-15 on tree 1; on 8 nodes an inner node of one
    tree (3 edges) is a leaf of the other (1): 2 x (8 x 3 + 8 x 1) / 8 = 8; 24 channels repeat 0-7 on tree 0:
    2 x (16 x 3 + 8 x 1) / 8 = 14. Two nodes: every node has one edge in each tree, 2 x 16 / 8 = 4.
    NCCL_MAX_NCHANNELS=12 NCCL_MIN_NCHANNELS=16 (connect.cc: cut to 0-11, then 12-15 copy 0-3): tree 1 has only
    8-11, so 12 channels on tree 0 and 4 on tree 1, 2 x (12 x 3 + 4 x 1) / 8 = 10 (tree c mod 16 >= 8 gave 8)."""
    p8 = platform_of(*_hosts(8))
    p2 = platform_of(*_hosts(2))
    st, st24 = settings_from_env({}), settings_from_env({"NCCL_MIN_CTAS": "24"})
    assert proxy.connections_per_gpu("ring", p2, st, 16) == 4
    assert proxy.connections_per_gpu("ring", p2, st24, 24) == 6
    assert proxy.connections_per_gpu("tree", p8, st, 16) == 8
    assert proxy.connections_per_gpu("tree", p8, st24, 24) == 14
    assert proxy.connections_per_gpu("tree", p2, st, 16) == 4
    cut = settings_from_env({"NCCL_MAX_NCHANNELS": "12", "NCCL_MIN_NCHANNELS": "16"})
    assert proxy.connections_per_gpu("tree", p8, cut, 16) == 10


def test_steps_per_connection_follow_ncclproxyop_nsteps() -> None:
    """A ring LL128 all-reduce of 1 MiB on 16 ranks and 24 channels fits one loop (24 x 16 x 576,000 bytes):
    2 x 15 = 30 steps. A tree LL128 of 1 MiB on 8 nodes and 16 channels: the ladder halves 576,000 to 18,000
    bytes (1 MiB / (16 x 72,000) < (1 + 3 + 0.8) x 16 / 8, twice), ceil(1 MiB / (16 x 18,000)) = 4 steps."""
    st = settings_from_env({})
    p2 = platform_of(*_hosts(2))
    p8 = platform_of(*_hosts(8))
    assert LL128_STEP_DATA == 576_000
    assert proxy.steps_per_connection("all_reduce", "ring", "LL128", p2, st, MiB, 24) == 30
    assert proxy.steps_per_connection("all_gather", "ring", "LL128", p2, st, MiB, 16) == 15
    assert proxy.steps_per_connection("all_reduce", "tree", "LL128", p8, st, MiB, 16) == math.ceil(MiB / (16 * 18_000))
    many = 16 * 16 * LL128_STEP_DATA * 3  # three loops of the ring on every channel, strided as NCCL 2.21 runs it
    old = settings_from_env({"PHANTORA_NCCL_VERSION": "2.21"})
    assert proxy.steps_per_connection("all_reduce", "ring", "LL128", p2, old, many, 16) == 3 * 30
    # NCCL 2.30 splits it in cells of 16 KiB (32 KiB of traffic): budget 884,736,000 / 16 = 55,296,000, so
    # ceil(55,296,000 / 32,768) = 1,688 cells on 15 channels and 1,680 on the last; 1,688 x 16,384 = 27,656,192 B
    # is 8,192 B over three loops (16 x 576,000 x 3 = 27,648,000): the busiest channels run a fourth
    assert proxy.steps_per_connection("all_reduce", "ring", "LL128", p2, st, many, 16) == 4 * 30


def test_broadcast_steps_are_one_step_chunks() -> None:
    """Broadcast's ring chunk is one buffer step (BROADCAST_CHUNKSTEPS = SLICESTEPS = 1, collectives.h v2.30.7-1),
    not an all-reduce's 4-step chunk of 2-step slices: 16 MiB over 2 channels of 512 KiB Simple steps (4 MiB
    buffer / NCCL_STEPS 8) is 16 steps a connection; an all-gather of the same bytes on 16 ranks fits one loop of
    16 x 2 MiB chunks per channel: 15 x 4 / 2 = 30 slices."""
    st = settings_from_env({})
    p2 = platform_of(*_hosts(2))
    step = step_bytes("Simple", st)
    assert step == 512 * 1024
    assert proxy.steps_per_connection("broadcast", "ring", "Simple", p2, st, 16 * MiB, 2) == 16 * MiB // (2 * step)
    assert proxy.steps_per_connection("all_gather", "ring", "Simple", p2, st, 16 * MiB, 2) == 30


def test_the_bound_charges_what_the_turns_exceed_the_transfer_by() -> None:
    """The proxy is a server in a pipeline of NCCL_STEPS = 8 steps in flight: 100 µs of turns over a 40 µs
    transfer leave 60 µs; over a 250 µs transfer, none."""
    assert proxy.excess_us(100.0, 40.0) == pytest.approx(60.0)
    assert proxy.excess_us(100.0, 250.0) == 0.0
    assert proxy.excess_us(0.0, 0.0) == 0.0


def test_the_choice_carries_the_turns_the_transfer_does_not_hide() -> None:
    """gj-aion's forced ring (NCCL_ALGO=Ring, NCCL_MIN_CTAS=24) at 1 MiB: 6 connections x 30 steps x 0.6 µs =
    108 µs of turns, less the 1 MiB's transfer at the model's bandwidth; at 32 MiB (still LL128, one loop of
    24 x 16 x 576,000 bytes: again 30 steps) the same 108 µs hide under the transfer (a host's 8 NICs, 400 GB/s,
    carry a ring's bus bandwidth, 2 x 15 / 16 of the bytes: at most 213 GB/s of algorithm bandwidth, over
    150 µs), so nothing. The default tree
    on 8 hosts at 1 MiB: 8 x 4 x 0.6 = 19.2 µs less its transfer. Simple and one host: nothing."""
    step = proxy.PROXY_STEP_US
    assert step == 0.6
    st = settings_from_env({"NCCL_ALGO": "Ring", "NCCL_MIN_CTAS": "24"})
    ring = tuning.select("all_reduce", platform_of(*_hosts(2)), st, MiB)
    assert ring is not None and (ring.algorithm, ring.protocol, ring.channels) == ("ring", "LL128", 24)
    transfer = MiB / (1000 * ring.algbw)
    assert 6 * 30 * step > transfer
    assert ring.proxy_us == pytest.approx(6 * 30 * step - transfer)
    big = tuning.select("all_reduce", platform_of(*_hosts(2)), st, 32 * MiB)
    assert big is not None and (big.algorithm, big.protocol) == ("ring", "LL128")
    assert big.algbw <= 400 * 16 / 30 and 32 * MiB / (1000 * 400 * 16 / 30) > 150 > 6 * 30 * step
    assert big.proxy_us == 0.0
    tree = tuning.select("all_reduce", platform_of(*_hosts(8)), settings_from_env({}), MiB)
    assert tree is not None and (tree.algorithm, tree.protocol, tree.channels) == ("tree", "LL128", 16)
    assert tree.proxy_us == pytest.approx(max(0.0, 8 * 4 * step - MiB / (1000 * tree.algbw)))
    simple = tuning.select("all_reduce", platform_of(*_hosts(2)), settings_from_env({"NCCL_PROTO": "Simple"}), MiB)
    one = tuning.select("all_reduce", platform_of(rail_optimized(1, 8, gpu="h100"), tuple(range(8))), st, MiB)
    assert simple is not None and simple.proxy_us == 0.0
    assert one is not None and one.proxy_us == 0.0


def _run(env: dict[str, str], nodes: int, nbytes: int) -> tuple[float, float, float]:
    """(end of the call, its first flow's start, its flows' longest path propagation), µs, on the flow network."""
    topo, ranks = _hosts(nodes)
    dag = decompose(Collective("all_reduce", ranks, nbytes, "fp32"), topo, AlgoOptions(nccl_env=nccl_env(env)))
    engine = make_engine(EngineSpec(network="flow"), topo)
    try:
        engine.submit(dag.flows, at=0)
        done = engine.drain()
    finally:
        engine.close()
    prop = propagation_ns(dag.flows, topo)
    return max(c.end_ns for c in done) / 1000.0, min(c.start_ns for c in done) / 1000.0, prop / 1000.0


def test_the_flow_engine_charges_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's turns overlap the transfer the network simulates, not the model's: the call ends at its delay
    plus max(turns, the simulated transfer) (plus the propagation), so with the turns it ends max(0, turns -
    transfer) later than without, where the transfer is what the flows take without them. On the ring and on the
    tree at 1 MiB the turns exceed it, and the flows then span exactly the turns."""
    for env, nodes in (({"NCCL_ALGO": "Ring", "NCCL_MIN_CTAS": "24"}, 2), ({}, 8)):
        tuning.select.cache_clear()
        with_proxy, start, prop = _run(env, nodes, MiB)
        choice = tuning.select("all_reduce", platform_of(*_hosts(nodes)), settings_from_env(env), MiB)
        assert choice is not None and choice.proxy_floor_us > 5.0
        step = proxy.PROXY_STEP_US
        monkeypatch.setattr(proxy, "PROXY_STEP_US", 0.0)
        tuning.select.cache_clear()
        without, start0, _ = _run(env, nodes, MiB)
        monkeypatch.setattr(proxy, "PROXY_STEP_US", step)
        tuning.select.cache_clear()
        assert start == pytest.approx(start0, abs=0.001)  # the turns are no delay
        transfer = without - start0 - prop  # what the network's own transfer takes
        assert choice.proxy_floor_us > transfer
        assert with_proxy - start - prop == pytest.approx(choice.proxy_floor_us, abs=0.002)
        assert with_proxy - without == pytest.approx(choice.proxy_floor_us - transfer, abs=0.002)
