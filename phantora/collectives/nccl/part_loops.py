"""The bytes of each step of a tree all-reduce, or of a broadcast's or reduce's chain, on one channel, as NCCL
2.22+ lays them out.

From v2.22.3-1 to v2.30.7-1 a channel works on its own contiguous part of the buffer (`ncclCollCbdPart`, device.h;
`channel_split.py`) with a chunk of whole protocol grains sized from that part alone (enqueue.cc
`scheduleCollTasksToPlan` calls `calcCollChunking` per part with nChannels = 1; `chunking.chunk_bytes`). The tree
kernels (all_reduce.h `runTreeUpDown`, `runTreeSplit`) and the broadcast and reduce rings (broadcast.h, reduce.h
`runRing`) then walk the part in one loop: `for (elemOffset = 0; elemOffset < channelCount; elemOffset +=
chunkCount)`, each primitive call `nelem = min(chunkCount, channelCount - elemOffset)`. So every chunk is whole but
the last, which is what is left; there is no 16-byte realignment (the ring all-reduce's last loop has one:
`ring_loops.py`) and no empty chunk. A part of 0 bytes runs no call (one empty step stands for it here).

NCCL 2.20 and 2.21 run the same loops (all_reduce.h, broadcast.h, reduce.h at v2.20.3-1 and v2.21.5-1:
`args->workCount`, `args->chunkCount`) over the host's parts (`host_split.py`) with the call's one chunk, sized
from all its bytes. Before 2.20 every channel strides the whole buffer: not this module's layout.
"""

from __future__ import annotations

from phantora.collectives.nccl.host_split import HOST_SPLIT_FROM


def applies(version: tuple[int, int]) -> bool:
    """Whether NCCL `version` walks a tree's or chain's channel part as this module does (2.20 on)."""
    return version >= HOST_SPLIT_FROM


def part_chunks(part: int, chunk: int) -> list[int]:
    """The bytes of each primitive call on a channel part of `part` bytes with a `chunk`-byte chunk: whole chunks,
    then what is left ([0] for an empty part)."""
    if chunk < 1 or part < 0:
        raise ValueError(f"part_loops: bad part ({part} B, {chunk} B chunk)")
    full, rest = divmod(part, chunk)
    return [chunk] * full + ([rest] if rest or not full else [])
