"""NCCL inside one NVLink host: the channels NCCL's enqueue runs an A100's ring on at small sizes, written out from
NCCL's thresholds, and the protocols' and the tree's rates against a published forced-protocol / forced-tree sweep
on 4 H100s (tests/data/nccl_tests/SOURCES.md: waynehacking8 sweep, NCCL 2.29.2)."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import platform_of, proto_rate
from phantora.collectives.nccl.published import tables
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.collectives.nccl.tuning import comm_channels, ring_graph, select
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host
from tests.test_nccl_published import loop_busbw

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BY_NAME = {t.name: t for t in tables()}


def a100_ring(proto: str, nbytes: int):
    """NCCL's choice for an 8-A100 ring all-reduce of `nbytes` with `proto` forced."""
    p = platform_of(dgx_host(gpu="a100"), tuple(range(8)))
    c = select("all_reduce", p, settings_from_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": proto}), nbytes)
    assert c is not None and (c.algorithm, c.protocol) == ("ring", proto)
    return p, c


def test_a100_search_gives_12_channels_of_20_and_the_communicator_24():
    """12 NVLinks x 20 GB/s (SM80_NVLINK_BW) = 240: the search's first speed, 40, fills it with 6 channels, which
    ncclTopoDupChannels doubles at half the speed (40 >= 25), and connectRings doubles again: 24."""
    p, _ = a100_ring("Simple", GiB)
    g = ring_graph(p)
    assert (g.nchannels, g.bw_intra) == (12, 20.0)
    assert comm_channels(p, g, settings_from_env({})) == 24


@pytest.mark.parametrize(
    ("proto", "nbytes", "channels"),
    [
        ("LL", 1 * MiB, 24),  # 1 MiB >= 24 x 512 threads x (8 B x 8 ranks) = 768 KiB
        ("LL", 512 * KiB, 16),  # 512 KiB / 32 KiB a channel
        ("LL", 288 * KiB - 1, 8),  # a byte short of 9 channels' worth: floor(nBytes / 32 KiB)
        ("LL128", 96 * KiB, 19),  # 640 threads x 8 B = 5 KiB a channel: 96 KiB < 20 x 5 KiB
        ("LL128", 120 * KiB, 24),
        ("Simple", 128 * KiB, 4),  # 512 threads x 64 B = 32 KiB a channel
    ],
)
def test_channels_nccl_runs_at_small_sizes(proto, nbytes, channels):
    """enqueue.cc: while nBytes < nc x nThreads x threadThreshold, nc -= 1 (the ring LL threshold times nRanks).
    From 1 MiB every protocol runs all 24 of an A100's channels: the A100's slow 1-16 MiB is not fewer channels."""
    _, c = a100_ring(proto, nbytes)
    assert c.channels == channels


FORCED = (
    ("h100_4gpu_1node_slice4of8_protoll_all_reduce_waynehacking8sweep", 0.05),
    ("h100_4gpu_1node_slice4of8_protoll128_all_reduce_waynehacking8sweep", 0.05),
    ("h100_4gpu_1node_slice4of8_protosimple_all_reduce_waynehacking8sweep", 0.05),
)


@pytest.mark.parametrize(("name", "rel"), FORCED)
def test_each_protocol_at_256_mib_runs_at_nccls_rating_on_h100(name, rel):
    """NCCL_PROTO=LL / LL128 / Simple, 256 MiB on 4 H100s: 146.9 / 312.5 / 340.8 GB/s published; NCCL rates the
    ring LL at min(141, 360 / 2) and LL128 at min(0.92 x 360, 12 x 36.7) GB/s busbw, within 5%."""
    table = BY_NAME[name]
    ((size, published),) = table.rows
    assert loop_busbw(table, size) == pytest.approx(published, rel=rel)


def test_forced_tree_on_one_host_within_10_percent():
    """NCCL_ALGO=Tree on 4 H100s: a chain per channel, NCCL's 0.92 x 360 x 0.5 GB/s algbw plus 5 chunk times of
    fill beyond NCCL's tree correction; every size within 10%."""
    table = BY_NAME["h100_4gpu_1node_slice4of8_treealgo_all_reduce_waynehacking8sweep"]
    for size, published in table.rows:
        assert loop_busbw(table, size) == pytest.approx(published, rel=0.10), size


def h100_tree(nbytes: int):
    """NCCL's choice for a 4-H100 all-reduce with NCCL_ALGO=Tree, NCCL_PROTO=Simple."""
    p = platform_of(dgx_host(gpu="h100"), tuple(range(4)))
    c = select("all_reduce", p, settings_from_env({"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}), nbytes)
    assert c is not None and (c.algorithm, c.protocol, c.channels) == ("tree", "Simple", 24)
    return c


# The tree's fill on 4 H100s, written out: a 512 KiB chunk (4 MiB / 8 steps) crosses 2 x 3 chain hops, i.e. 5 chunk
# times after the first, each at one of 24 channels' share of twice NCCL's 165.6 GB/s algbw (0.92 x 12 x 30 x 0.5).
TREE_FILL_US = 5 * 512 * KiB / (2 * 165.6e3 / 24)


def test_tree_fill_counted_only_beyond_nccls_tree_correction():
    """NCCL's treeCorrectionFactor (0.9 for Simple at log2(256 MiB / 64) = 22) is fitted on measured trees, so the
    fill is charged only where it exceeds the correction's extra time; from 512 MiB (no correction) in full."""
    corrected = 256 * MiB / 165.6e3 * (1 / 0.9 - 1)  # µs the correction adds at 256 MiB
    assert TREE_FILL_US == pytest.approx(189.96, abs=0.01)
    assert h100_tree(256 * MiB).fill_us == pytest.approx(TREE_FILL_US - corrected, rel=1e-6)
    assert h100_tree(GiB).fill_us == pytest.approx(TREE_FILL_US, rel=1e-6)


@pytest.mark.parametrize(
    ("proto", "nbytes", "lat_us", "rating"),
    [
        # LL: NCCL's Ampere one-node ceiling binds: min(87.7, 0.5 x 12 x 20) = 87.7 GB/s busbw
        ("LL", 1 * MiB, 6.6 + 14 * 0.6, min(87.7, 0.5 * 240)),
        # LL128: min(0.92 x 240, 12 channels x 20 GB/s per channel) = 220.8
        ("LL128", 8 * MiB, 14.0 + 14 * 1.9, min(0.92 * 240, 12 * 20.0)),
    ],
)
def test_a100_ll_and_ll128_caps_are_charged_in_the_time(proto, nbytes, lat_us, rating):
    """The per-arch LL ceiling and LL128 rating bound the rate the flows run at, not only what the choice compares:
    an 8-A100 all-reduce through the flow engine takes NCCL's latency plus the bytes at the capped busbw x 8/14,
    or at the A100 kernel's lower achieved rate where one is recorded (proto_rate.py)."""
    achieved = proto_rate.achieved_busbw("ampere", proto)
    busbw = min(rating, achieved) if achieved else rating
    topo = dgx_host(gpu="a100")
    env = nccl_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": proto})
    dag = decompose(Collective("all_reduce", tuple(range(8)), nbytes, "fp32"), topo, AlgoOptions(nccl_env=env))
    engine = FlowSimulator(topo)
    engine.submit(dag.flows, at=0)
    t_us = max(c.end_ns for c in engine.drain()) / 1e3
    assert (dag.choice["protocol"], dag.choice["channels"]) == (proto, 24)
    assert t_us == pytest.approx(lat_us + nbytes / (1000 * busbw * 8 / 14), rel=0.01)
