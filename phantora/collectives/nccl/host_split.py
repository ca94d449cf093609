"""How NCCL 2.20 and 2.21 split one collective's count over its channels, on the host (enqueue.cc
`scheduleCollTasksToPlan` / `computeColl`, v2.20.3-1 to v2.21.5-1).

Each channel gets one contiguous part: countPerChannels = alignUp(divUp(count, nChannels), alignCount), the
channels used then divUp(count, countPerChannels), the last one what is left. alignCount (`computeCollAlignCount`)
is NCCL_SIMPLE_ALIGNMENT (32 x 8 x 16 = 4,096 B) under Simple, NCCL_LL128_ALIGNMENT_PER_WARP (480 B) a warp under
LL128, NCCL_LL_ALIGNMENT_PER_THREAD (8 B) a thread under LL. The ring all-reduce's last, shorter loop takes a chunk
of alignUp(divUp(rest, nranks), alignCount) (`computeCollLastChunkInfo`; `ring_loops.all_reduce_chunks`), and the
chunk is the call's, sized from all its bytes (no grain rounding before 2.22). From 2.22 the split is by cells
(`channel_split.py`). Sizes are bytes, the alignment whole bytes whatever the element size.
"""

from __future__ import annotations

from phantora.collectives.nccl.channel_split import SPLIT_FROM, div_up

HOST_SPLIT_FROM = (2, 20)  # v2.20.3-1: workOffset / workCount per channel, lastChunkCount from the host
SIMPLE_ALIGN = 32 * 8 * 16  # NCCL_SIMPLE_ALIGNMENT (enqueue.h): WARP_SIZE x 8 x 16 bytes
LL128_ALIGN_PER_WARP = 480  # NCCL_LL128_ALIGNMENT_PER_WARP
LL_ALIGN_PER_THREAD = 8  # NCCL_LL_ALIGNMENT_PER_THREAD: sizeof(uint64_t)
WARP = 32


def applies(version: tuple[int, int]) -> bool:
    """Whether NCCL `version` splits on the host as this module does (2.20 and 2.21)."""
    return HOST_SPLIT_FROM <= version < SPLIT_FROM


def align_bytes(proto: str, threads: int) -> int:
    """`computeCollAlignCount` in bytes for `proto` on a channel of `threads` threads."""
    if proto == "Simple":
        return SIMPLE_ALIGN
    if proto == "LL128":
        return LL128_ALIGN_PER_WARP * max(1, threads // WARP)
    return LL_ALIGN_PER_THREAD * max(1, threads)


def split(count: int, channels: int, align: int) -> tuple[int, ...]:
    """Each channel's part (bytes of the count, channel 0 first) of `count` bytes over at most `channels`."""
    if channels < 1 or align < 1 or count < 0:
        raise ValueError(f"host_split: bad split ({count} B, {channels} channels, {align} B alignment)")
    if count == 0:
        return (0,)
    per = div_up(div_up(count, channels), align) * align
    used = div_up(count, per)
    return (per,) * (used - 1) + (count - (used - 1) * per,)
