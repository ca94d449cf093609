"""One loop of a ring all-reduce as LL and LL128 stream it, line by line, when its chunks are uneven.

`runRing` (src/collectives/device/all_reduce.h, v2.18.5-1) runs 2n-1 primitive calls a loop on each channel: rank
x (its ring index) at call s = 0 .. 2n-2 handles chunk (x - s - 1) mod n, sending at calls 0 .. 2n-3 and receiving
at 1 .. 2n-2, so its call s receives what its ring predecessor sent at call s-1, on the same chunk. Under LL and
LL128 (prims_ll.h, prims_ll128.h) a receiver polls each line's flag and forwards the line as soon as it lands, so a
call ends when its own bytes are through and the predecessor's call on that chunk has ended (a barrier closes each
call); a call on an empty chunk reads no line and waits for nobody. The final receive only copies the lines
that have landed out of the buffer: it crosses no link and costs nothing of its own here. A sender may run at most
NCCL_STEPS steps ahead of its receiver (`waitSend`: the receiver's head plus NCCL_STEPS must pass the next step).

Times are in bytes at one channel's rate, so they are exact integers; latency is charged elsewhere (0 here).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from phantora.collectives.nccl import tables as T


def calls(nranks: int) -> int:
    """Primitive calls a rank makes in one loop of the ring all-reduce: 2(n-1) sends and a final receive."""
    return 2 * nranks - 1


def sends(nranks: int) -> int:
    """Calls of one loop that cross the link, each a chunk's time at an even split."""
    return 2 * (nranks - 1)


def chunk_at(rank: int, call: int, nranks: int) -> int:
    """The chunk rank `rank` (ring index) handles at call `call` of runRing."""
    return (rank - call - 1) % nranks


@lru_cache(maxsize=4096)
def loop_time(sizes: tuple[int, ...], steps_ahead: int = T.NCCL_STEPS) -> int:
    """When the last rank of one channel ends the loop, from all ranks starting together at 0.

    `sizes[c]` is chunk c's bytes on this channel; the ring has len(sizes) ranks."""
    n = len(sizes)
    if n < 2 or steps_ahead < 2:
        raise ValueError(f"ring_pipeline: needs 2 ranks or more and 2 steps of buffer or more, got {n}, {steps_ahead}")
    last = calls(n) - 1
    ends: list[list[int]] = [[0] * n for _ in range(last + 1)]  # ends[s][x]: rank x's call s ends
    for s in range(last + 1):
        for x in range(n):
            start = ends[s - 1][x] if s else 0
            if s < last and s >= steps_ahead:  # the send waits for its receiver to free a step of its buffer
                start = max(start, ends[s - steps_ahead + 1][(x + 1) % n])
            size = sizes[chunk_at(x, s, n)]
            end = start + (size if s < last else 0)  # the final receive crosses no link: it only copies out
            if s and size:  # the lines arrive no sooner than the predecessor sends them
                end = max(end, ends[s - 1][(x - 1) % n])
            ends[s][x] = end
    return max(ends[last])


def slowest_loop_time(per_channel: Sequence[Sequence[int]]) -> int:
    """The loop's time over all channels: the slowest channel's."""
    return max(loop_time(tuple(sizes)) for sizes in per_channel)
