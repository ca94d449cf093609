"""The bytes of each step of a ring collective on one channel, as NCCL 2.22+ lays its chunks out.

From v2.22.3-1 to v2.30.7-1 a channel works on its own contiguous part of the buffer (`ncclCollCbdPart`, device.h;
`channel_split.py`) with a chunk of whole protocol grains (enqueue.cc `calcCollChunking`: `chunkSize / grainSize *
grainSize`; `chunking.whole_grains`). The ring kernels then cut the part as follows (src/device/*.h `runRing`):

- all-reduce (all_reduce.h): loops of nranks x chunk; loop l's chunk j (the one ring position j ends up reducing)
  is `chunk` bytes while a whole loop is left; in the last, shorter loop the chunk becomes
  alignUp(divUp(rest, nranks), 16 B) (`16 / sizeof(T)` elements) and chunk j carries min(chunk, rest - j x chunk),
  so the last chunks of the loop are short and those past the rest are empty (`nelem` <= 0: the step still runs);
- all-gather and reduce-scatter (all_gather.h, reduce_scatter.h): each rank's block of the part in `chunk`-byte
  pieces, the last one short (`min(chunkCount, partCount - elemOffset)`): no realignment.

NCCL 2.20 and 2.21 run the same loops over the host's parts (`host_split.py`) with the call's chunk (not whole
grains) and the host's lastChunkCount, alignUp(divUp(rest, nranks), alignCount), whose alignment is the protocol's
(`host_split.align_bytes`: 4,096 B under Simple) instead of 16 B. Earlier kernels stride the whole buffer
(`ring_round_up.py`): not modelled here. Sizes are bytes: the alignment and grains are whole bytes whatever the
element size.
"""

from __future__ import annotations

from phantora.collectives.nccl.host_split import HOST_SPLIT_FROM

LAST_LOOP_ALIGN = 16  # bytes: alignUp(divUp(remCount, nranks), 16 / sizeof(T)) elements


def applies(version: tuple[int, int]) -> bool:
    """Whether NCCL `version` lays a ring's chunks out as this module does (2.20 on)."""
    return version >= HOST_SPLIT_FROM


def all_reduce_chunks(part: int, nranks: int, chunk: int, align: int = LAST_LOOP_ALIGN) -> list[list[int]]:
    """`out[j][l]`: the bytes of chunk j in loop l of a ring all-reduce over a channel part of `part` bytes (the
    last loop's chunk aligned up to `align` bytes)."""
    if nranks < 1 or chunk < 1 or part < 0:
        raise ValueError(f"ring_loops: bad ring ({part} B, {nranks} ranks, {chunk} B chunk)")
    full, rest = divmod(part, nranks * chunk)
    out = [[chunk] * full for _ in range(nranks)]
    if rest or not full:
        last = -(-rest // (align * nranks)) * align  # alignUp(divUp(rest, nranks), align)
        for j in range(nranks):
            out[j].append(max(0, min(last, rest - j * last)))
    return out


def block_chunks(blocks: list[int], chunk: int) -> list[list[int]]:
    """`out[j][l]`: the bytes of rank block j's l-th piece in an all-gather or reduce-scatter ring (every block
    `chunk`-byte pieces, the last short; a block with fewer pieces than the largest gets empty ones)."""
    if chunk < 1 or not blocks:
        raise ValueError(f"ring_loops: bad ring ({blocks} B blocks, {chunk} B chunk)")
    loops = max(1, -(-max(blocks) // chunk))
    return [[max(0, min(chunk, size - i * chunk)) for i in range(loops)] for size in blocks]


def ring_chunks(kind: str, slices: list[int], chunk: int, align: int = LAST_LOOP_ALIGN) -> list[list[int]]:
    """NCCL 2.20+'s chunks of one channel's ring `kind` whose near-equal `slices` (one a rank) hold the part
    (`align`: the all-reduce's last loop's alignment)."""
    if kind == "all_reduce":
        return all_reduce_chunks(sum(slices), len(slices), chunk, align)
    return block_chunks(slices, chunk)
