"""NVLS-Tree with one chunk per operation (phantora/collectives/nccl/nvls_tree.py): no pipeline forms, so the fill
is the chunk's own crossing of NVLS reduce, the tree of nodes and NVLS multicast, each at its hardware's rate."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.nccl import choose, platform_of
from phantora.collectives.nccl.nvls_tree import loops, path_shares
from phantora.collectives.nccl.settings import NcclSettings, nccl_env
from phantora.topology import rail_optimized

MiB = 1 << 20
NVLS_LINK = 18 * 20.6 * 0.85  # GB/s: an H100's NVLink as NCCL counts it, times Hopper's nvlsEfficiency
NIC = 400 / 8  # GB/s: one 400G NIC per GPU
ALGBW_2 = 8 * 57.7 * 16 / 30  # NCCL's two-host NVLS-Tree: 8 x min(59.5, 100, 57.7) x nRanks / nSteps


def _two_hosts():
    return rail_optimized(2, 8, spines=8, nic_rate="400Gbps", gpu="h100")


def _choice(size: int, hosts: int = 2, **env: str):
    topo = _two_hosts() if hosts == 2 else rail_optimized(hosts, 8, spines=8, nic_rate="400Gbps", gpu="h100")
    coll = Collective("all_reduce", tuple(range(8 * hosts)), size, "bf16")
    return choose(coll, topo, AlgoOptions(nccl_env=nccl_env(env)))


@pytest.mark.parametrize("nodes, shares", [(1, 0), (2, 2), (4, 6), (8, 10)])
def test_the_deepest_chunk_crosses_nccls_tree_of_nodes(nodes, shares):
    """NCCL's btree (trees.cc): two nodes, one edge into a parent of one child, up and down: 2; four, a leaf under a
    parent of two children under the root (one child): 2 x (2 + 1); eight: 2 x (2 + 2 + 1)."""
    assert path_shares(nodes) == shares


def test_loops_follow_the_nvls_tree_chunk_ladder():
    """128 operations (16 CTAs x 8 heads): 4 MiB takes 32 KiB chunks (< 1 x 128 x 64 KiB), 8 MiB 64 KiB (not
    < 8 MiB), each one chunk per operation; 16 MiB two 64 KiB chunks."""
    p = platform_of(_two_hosts(), tuple(range(16)))
    st = NcclSettings()
    assert [loops(p, st, s * MiB, 16) for s in (4, 8, 16, 32)] == [1, 1, 2, 4]


@pytest.mark.parametrize("size, chunk", [(4 * MiB, 32 * 1024), (8 * MiB, 64 * 1024)])
def test_one_chunk_per_operation_crosses_each_stage_alone(size, chunk):
    """Two hosts, one chunk per operation: NVLS reduce and multicast each move the GPU's bytes over its NVLink, and
    the chunk crosses the network up and down with the 8 channels of its tree on the head's NIC; less the one chunk
    interval that bytes over NCCL's bandwidth counts."""
    c = _choice(size)
    assert (c.algorithm, c.channels) == ("nvls_tree", 16)
    crossing = 2 * size / (NVLS_LINK * 1000) + 2 * 8 * chunk / (NIC * 1000)
    assert c.fill_us == pytest.approx(crossing - size / (ALGBW_2 * 1000), rel=1e-6)
    assert c.fill_us < 2 * chunk * 128 / (ALGBW_2 * 1000)  # below the pipelined two chunk times


def test_two_chunks_per_operation_keep_the_pipelined_fill():
    """16 MiB: two 64 KiB chunks per operation overlap their stages: the fill stays (3 - 1) chunk times at NCCL's
    rate per operation."""
    c = _choice(16 * MiB)
    assert c.fill_us == pytest.approx(2 * 64 * 1024 * 128 / (ALGBW_2 * 1000), rel=1e-6)


def test_four_hosts_forced_at_one_chunk_cross_six_nic_shares():
    """Four hosts, NVLS-Tree forced at 4 MiB (one 32 KiB chunk per operation): the chunk crosses 2 x (2 + 1) NIC
    shares of 8 chunks; NCCL's bandwidth there is 8 x min(59.5, 48, 45.5) x 32/62."""
    c = _choice(4 * MiB, hosts=4, NCCL_ALGO="NVLSTree")
    per_op = 4 * MiB // 128
    algbw = 8 * 45.5 * 32 / 62
    crossing = 2 * 4 * MiB / (NVLS_LINK * 1000) + 6 * 8 * per_op / (NIC * 1000)
    assert c.fill_us == pytest.approx(crossing - 4 * MiB / (algbw * 1000), rel=1e-6)


def test_twenty_four_ctas_on_eight_hosts_keep_the_64_kib_chunk_and_lengthen_the_fill_by_half():
    """NCCL_MIN_CTAS=24 (nvls.cc: 24 NVLS channels, 192 operations): from 4 nodes the chunk is 64 KiB whatever the
    CTAs (enqueue.cc, NVLSTREE_MAX_CHUNKSIZE), so 64 MiB runs ceil(64 MiB / (192 x 64 KiB)) = 6 loops (16 CTAs: 8).
    The fill is (3 - 1) chunk times at NCCL's rate per operation, 8 x min(59.5, 48, 45.5) x 64/126, plus the deeper
    tree's 4 extra hops, each a 64 KiB chunk over the NIC's share per channel: both grow with the channels, so 24
    CTAs fill 1.5 times as long as 16; nothing else in the choice changes."""
    p = platform_of(rail_optimized(8, 8, spines=8, nic_rate="400Gbps", gpu="h100"), tuple(range(64)))
    assert [loops(p, NcclSettings(), 64 * MiB, ch) for ch in (16, 24)] == [8, 6]
    algbw = 8 * 45.5 * 64 / 126
    c16, c24 = _choice(64 * MiB, hosts=8), _choice(64 * MiB, hosts=8, NCCL_MIN_CTAS="24")
    for c, ch in ((c16, 16), (c24, 24)):
        assert (c.algorithm, c.channels) == ("nvls_tree", ch)
        chunk_time = 64 * 1024 * ch * 8 / (algbw * 1000)
        assert c.fill_us == pytest.approx(2 * chunk_time + 4 * 64 * 1024 / (NIC * 1000 / ch), rel=1e-6)
    assert c24.fill_us == pytest.approx(1.5 * c16.fill_us, rel=1e-9)
    assert (c24.lat_us, c24.algbw) == (c16.lat_us, c16.algbw)
