"""The chunks NVLS-Tree's tree moves between hosts: per channel, per head GPU and per loop, as NCCL's kernel walks them.

NCCL's NVLS-Tree kernel (src/device/all_reduce.h, NCCL_ALGO_NVLS_TREE, v2.29.7-1) runs on each channel over the
channel's part of the buffer (`ncclCollCbdPart`; from 2.22 one contiguous part a channel, `channel_split.py`, each
with the chunk `calcCollChunking` gives the part alone with nHeads concurrent operations). A loop covers nHeads x
chunkCount elements; in the last loop, where less is left, chunkCount becomes `alignUp(divUp(rest, nHeads), 16 /
sizeof(T))`. The head GPU of index h (`nvls.headRank`) moves `nelem = min(chunkCount, channelCount - (elemOffset +
h x chunkCount))` of each loop up channel c's tree of hosts and back down (its reduce warps `directRecvDirectSend`
to `treeUp`, its broadcast warps from it), one primitive call and so one step a loop; channel c runs tree c % 2 of
NCCL's double binary tree (connect.cc: `channel->nvls.treeUp = treeUp[c%2]`), each on its own connections.
"""

from __future__ import annotations

ALIGN_BYTES = 16  # the last loop's chunk: alignUp(..., 16 / sizeof(T)) elements, 16 bytes


def head_loops(part: int, chunk: int, heads: int, align: int = ALIGN_BYTES) -> list[list[int]]:
    """For each of `heads` head GPUs, the bytes it moves in each loop over a channel's `part` bytes with NCCL's
    `chunk` (whole loops of heads x chunk; in the last one each head's share of the rest, rounded up to `align`
    bytes, the heads past its end moving 0). No loop for an empty part."""
    if part < 0 or chunk < 1 or heads < 1 or align < 1:
        raise ValueError(f"nvls_tree_loops: bad part ({part} B, {chunk} B chunk, {heads} heads, {align} B align)")
    out: list[list[int]] = [[] for _ in range(heads)]
    at = 0
    while at < part:
        count = chunk
        if part - at < heads * chunk:
            share = -(-(part - at) // heads)  # divUp(rest, nHeads)
            count = -(-share // align) * align  # alignUp(.., 16 B; the one-node NVLS kernel's 16 KiB from 2.23)
        for h in range(heads):
            out[h].append(max(0, min(count, part - (at + h * count))))
        at += heads * count
    return out
