"""The loops of NCCL's NVLS all-reduce kernels (one node, and NVLS-Tree's): per channel, per head GPU, the bytes
of each loop.

all_reduce.h (NCCL_ALGO_NVLS, `oneNode`) walks each channel's part in loops of nHeads x chunk; head h's reduce warps
move `min(chunk, channelCount - (elemOffset + h x chunk))` of each. How the last, shorter loop's chunk is cut and
how the parts are laid out changed with the version (the tags read: v2.19.3-1 to v2.30.7-1):

- before 2.20 every channel strides the whole buffer: a loop covers nChannels x nHeads x chunk, channel `bid`
  taking its nHeads chunks of it in order (`offset = gridOffset + bid x nHeads x chunk`), so every chunk is whole
  but the call's last, what is left (`grid_loops`);
- 2.20 and 2.21: the host's parts (`host_split`) with the call's chunk; the last loop's chunk is the host's
  lastChunkCount, alignUp(divUp(rest, nHeads), alignCount) (enqueue.cc `computeCollLastChunkInfo`; Simple's
  alignCount is NCCL_SIMPLE_ALIGNMENT, 4,096 B);
- 2.22: one part a channel (`channel_split`), each with its own chunk (`calcCollChunking` on the part); the kernel
  aligns the last loop's chunk up to 16 B (`alignUp(divUp(remCount, nHeads), 16 / sizeof(T))`);
- from 2.23: the same, aligned up to 16 KiB (`16384 / sizeof(T)`), so a short last loop runs on fewer heads, each
  with a bigger chunk (the heads past the rest move nothing).

NVLS-Tree's kernel (NCCL_ALGO_NVLS_TREE) walks its loops the same way in every version (grid-strided before 2.20,
the host's lastChunkCount in 2.20-2.21), but aligns its last loop to 16 B from 2.22 on.
"""

from __future__ import annotations

from phantora.collectives.nccl.channel_split import SPLIT_FROM
from phantora.collectives.nccl.host_split import HOST_SPLIT_FROM, SIMPLE_ALIGN
from phantora.collectives.nccl.nvls_tree_loops import ALIGN_BYTES, head_loops

BIG_ALIGN_FROM = (2, 23)  # v2.23.4-1: the last loop's chunk aligned to 16 KiB
BIG_ALIGN = 16 * 1024


def last_loop_align(version: tuple[int, int], algo: str = "nvls") -> int:
    """The bytes the last-loop chunk of the one-node NVLS kernel (`algo` "nvls") or of NVLS-Tree's ("nvls_tree",
    16 B from 2.22 in every version read) is aligned up to under NCCL `version` (2.20 on)."""
    if version < SPLIT_FROM:
        return SIMPLE_ALIGN
    return BIG_ALIGN if algo == "nvls" and version >= BIG_ALIGN_FROM else ALIGN_BYTES


def grid_loops(nbytes: int, channels: int, heads: int, chunk: int) -> list[list[list[int]]]:
    """Before 2.20: per channel, per head, the bytes of each loop of a call of `nbytes` strided over `channels` (a
    loop: every channel's `heads` chunks of `chunk` bytes, in channel then head order; the last what is left)."""
    if nbytes < 0 or channels < 1 or heads < 1 or chunk < 1:
        raise ValueError(f"nvls_loops: bad call ({nbytes} B, {channels} channels, {heads} heads, {chunk} B chunk)")
    loops = -(-nbytes // (channels * heads * chunk))
    return [
        [
            [max(0, min(chunk, nbytes - ((k * channels + c) * heads + h) * chunk)) for k in range(loops)]
            for h in range(heads)
        ]
        for c in range(channels)
    ]


def part_loops(
    version: tuple[int, int], parts: list[int], chunks: list[int], heads: int, algo: str = "nvls"
) -> list[list[list[int]]]:
    """From 2.20: per channel part (`parts`, each with its chunk `chunks`), per head, the bytes of each loop of
    `algo` ("nvls" one node, "nvls_tree")."""
    align = last_loop_align(version, algo)
    if version < HOST_SPLIT_FROM:
        raise ValueError(f"nvls_loops: NCCL {version} strides the buffer (grid_loops), it has no parts")
    return [head_loops(part, chunk, heads, align) for part, chunk in zip(parts, chunks, strict=True)]
