"""The one-node NVLS all-reduce's loops as NCCL's kernel walks them, by version.

all_reduce.h (NCCL_ALGO_NVLS, oneNode; v2.19.3-1 .. v2.30.7-1 read): a channel's part goes in loops of nHeads x
chunk, head h moving `min(chunk, channelCount - (elemOffset + h x chunk))` of each; the last, shorter loop's chunk
is alignUp(divUp(rest, nHeads), A): A the host's 4,096 B (Simple's NCCL_SIMPLE_ALIGNMENT, enqueue.cc
`computeCollLastChunkInfo`) in 2.20-2.21, 16 B in 2.22, 16 KiB from 2.23 (`16384 / sizeof(T)`); before 2.20 the
channels stride the whole buffer (a loop: nChannels x nHeads chunks). The figures are written out here.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.nvls_loops import grid_loops, last_loop_align, part_loops
from phantora.collectives.nccl.settings import nccl_env
from phantora.topology import dgx_host

KiB, MiB = 1 << 10, 1 << 20
HEADS = 8


@pytest.mark.parametrize(
    ("version", "align", "last"),
    [
        # 1 MiB + 40 KiB with a 64 KiB chunk: two whole loops of 8 x 64 KiB, then 40 KiB, divUp(40 KiB, 8) = 5 KiB
        ((2, 29), 16 * KiB, [16 * KiB, 16 * KiB, 8 * KiB] + [0] * 5),  # up to 16 KiB: three heads
        ((2, 23), 16 * KiB, [16 * KiB, 16 * KiB, 8 * KiB] + [0] * 5),
        ((2, 22), 16, [5 * KiB] * 8),  # 5,120 is 16-aligned: every head
        ((2, 21), 4096, [8 * KiB] * 5 + [0] * 3),  # up to 8 KiB: five heads
    ],
)
def test_the_last_loop_is_aligned_by_version(version: tuple[int, int], align: int, last: list[int]) -> None:
    assert last_loop_align(version) == align
    (loops,) = part_loops(version, [MiB + 40 * KiB], [64 * KiB], HEADS)
    assert loops == [[64 * KiB, 64 * KiB, size] for size in last]


def test_before_2_20_the_channels_stride_the_buffer() -> None:
    """2.19: 2 channels, 8 heads, 32 KiB chunks: a loop covers 2 x 8 x 32 KiB = 512 KiB of the call; 1 MiB + 40 KiB
    runs 3 loops, the last's 40 KiB in channel 0's first chunks (32 KiB, 8 KiB), channel 1 moving nothing."""
    loops = grid_loops(MiB + 40 * KiB, 2, HEADS, 32 * KiB)
    assert [len(per_head[0]) for per_head in loops] == [3, 3]
    assert [pieces[2] for pieces in loops[0]] == [32 * KiB, 8 * KiB] + [0] * 6
    assert [pieces[2] for pieces in loops[1]] == [0] * 8
    assert all(pieces[:2] == [32 * KiB, 32 * KiB] for per_head in loops for pieces in per_head)


@pytest.mark.parametrize(
    ("version", "last"),
    [
        # 3 MiB + 40 KiB on one NVLS channel (NCCL_NVLS_NCHANNELS=1: the part is the call), 8 heads; chunk 32 KiB
        # (calcCollChunking: 128 KiB, 64 KiB below 64 x 8 x 128 KiB, 32 KiB below 8 x 8 x 64 KiB): 12 whole loops of
        # 256 KiB, then 40 KiB
        ("2.29.7", [16 * KiB, 16 * KiB, 8 * KiB] + [0] * 5),
        ("2.23.4", [16 * KiB, 16 * KiB, 8 * KiB] + [0] * 5),
        ("2.22.3", [5 * KiB] * 8),
        ("2.21.5", [8 * KiB] * 5 + [0] * 3),
        ("2.19.3", [32 * KiB, 8 * KiB] + [0] * 6),  # the grid's last loop: whole chunks, in head order
    ],
)
def test_chunked_nvls_runs_nccls_loops(version: str, last: list[int]) -> None:
    """Each GPU's flow carries, per loop, the loop's data (every GPU's copy goes up to the switch) and its own
    head's chunks (it stores its sums once): 13 loops, 256 + 32 KiB each while whole, the last 40 KiB + head i's
    share of it. Split evenly (before), every loop carried (3 MiB + 40 KiB) x 9/8 / 13."""
    env = {"PHANTORA_NCCL_VERSION": version, "NCCL_NVLS_NCHANNELS": "1", "NCCL_ALGO": "NVLS"}
    size = 3 * MiB + 40 * KiB
    dag = decompose(
        Collective("all_reduce", tuple(range(8)), size, "fp32"),
        dgx_host(gpu="h100"),
        AlgoOptions(granularity="chunked", nccl_env=nccl_env(env)),
    )
    assert ((dag.choice or {})["algorithm"], (dag.choice or {})["channels"]) == ("NVLS", 1)
    flows = [f for f in dag.flows if f.size and f.src != f.dst]
    for i, src in enumerate(sorted({f.src for f in flows})):
        sizes = [f.size for f in flows if f.src == src]
        assert sizes == [288 * KiB] * 12 + [40 * KiB + last[i]]


@pytest.mark.parametrize(
    ("version", "first", "others"),
    [
        # 3 MiB + 40 KiB on 2 x 8 H100s, NVLS-Tree on 2 channels of 8 heads, 64 KiB chunks. 2.19 strides the buffer
        # in loops of 2 x 8 x 64 KiB: three whole, then 40 KiB, all of it channel 0's head 0's chunk
        ("2.19.3", {(0, 0): [64 * KiB] * 3 + [40 * KiB]}, [64 * KiB] * 3),
        # 2.21: the host's parts, 1.5 MiB + 20 KiB each: three loops of 8 x 64 KiB, then 20 KiB in chunks of
        # alignUp(2,560, 4,096) = 4 KiB on heads 0-4
        ("2.21.5", {(h, c): [64 * KiB] * 3 + [4 * KiB] for h in range(5) for c in range(2)}, [64 * KiB] * 3),
        # 2.22: NCCL's parts (the same two here), the last 20 KiB in 2,560 B chunks on every head
        ("2.22.3", {}, [64 * KiB] * 3 + [2560]),
    ],
)
def test_chunked_nvls_tree_runs_nccls_loops(version: str, first: dict, others: list[int]) -> None:
    """Each head's and channel's tree steps up (their nonzero bytes): NVLS-Tree's kernel walks NCCL's loops as the
    one-node kernel does, its last loop's chunk 16-byte aligned from 2.22 (before, split evenly over the channels,
    every version ran 2.22's)."""
    from phantora.topology import rail_optimized

    env = {"PHANTORA_NCCL_VERSION": version, "NCCL_NVLS_NCHANNELS": "2", "NCCL_ALGO": "NVLSTree"}
    dag = decompose(
        Collective("all_reduce", tuple(range(16)), 3 * MiB + 40 * KiB, "fp32"),
        rail_optimized(2, 8, gpu="h100"),
        AlgoOptions(granularity="chunked", nccl_env=nccl_env(env)),
    )
    assert ((dag.choice or {})["algorithm"], (dag.choice or {})["channels"]) == ("NVLSTree", 2)
    steps: dict[tuple[int, int], list[int]] = {}
    for f in dag.flows:  # nvls_tree/inter{head}/t{tree}/ch{channel}/up/chunk{loop}, in loop order
        parts = f.tag.split("/")
        if f.size and parts[0] == "nvls_tree" and parts[1].startswith("inter") and parts[4:5] == ["up"]:
            key = (int(parts[1][5:]), int(parts[3][2:]))
            steps.setdefault(key, []).append(f.size)
    assert len(steps) == 16
    for key, sizes in steps.items():
        assert sizes == first.get(key, others), key


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize(
    ("version", "channels", "loops"),
    [
        # a rank's block of 1 MiB + 40 KiB on 8 H100s, NVLS chunk 64 KiB (calcCollChunking on the part's 8.3 MiB
        # over 8 heads: 128 KiB, 64 KiB below 64 x 8 x 128 KiB, not below 8 x 8 x 64 KiB = 4 MiB). One channel: 16
        # whole chunks, then 40 KiB
        ("2.29.7", "1", [64 * KiB] * 16 + [40 * KiB]),
        # two channels: 2.19 strides the block in loops of 2 x 64 KiB (the last 40 KiB channel 0's); 2.21 splits it
        # in two parts of 532 KiB, 8 whole chunks each and 20 KiB: 8 loops of 128 KiB, then 40 KiB either way
        ("2.19.3", "2", [128 * KiB] * 8 + [40 * KiB]),
        ("2.21.5", "2", [128 * KiB] * 8 + [40 * KiB]),
    ],
)
def test_chunked_nvls_all_gather_and_reduce_scatter_run_nccls_loops(
    kind: str, version: str, channels: str, loops: list[int]
) -> None:
    """all_gather.h / reduce_scatter.h (NCCL_ALGO_NVLS, oneNode) walk a channel's part of a rank's block in whole
    chunks, the last what is left (v2.20.3-1 to v2.30.7-1; before 2.20 strided over the channels): each GPU's flow
    carries m - 1 = 7 ranks' blocks of each loop (split evenly, before, 17 loops of 7 x 1,064 KiB / 17 each)."""
    env = {"PHANTORA_NCCL_VERSION": version, "NCCL_NVLS_NCHANNELS": channels, "NCCL_ALGO": "NVLS"}
    dag = decompose(
        Collective(kind, tuple(range(8)), 8 * (MiB + 40 * KiB), "fp32"),
        dgx_host(gpu="h100"),
        AlgoOptions(granularity="chunked", nccl_env=nccl_env(env)),
    )
    assert ((dag.choice or {})["algorithm"], (dag.choice or {})["channels"]) == ("NVLS", int(channels))
    flows = [f for f in dag.flows if f.size and f.src != f.dst]
    for src in sorted({f.src for f in flows}):
        assert [f.size for f in flows if f.src == src] == [7 * size for size in loops]
