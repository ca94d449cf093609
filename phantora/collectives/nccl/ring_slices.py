"""The slices of a Simple ring chunk: how NCCL's kernel cuts one chunk into the pieces it posts one by one.

A Simple ring all-reduce, all-gather or reduce-scatter runs ProtoSimple<CHUNKSTEPS, SLICESTEPS> with CHUNKSTEPS =
NCCL_STEPS / 2 and SLICESTEPS = NCCL_STEPS / 4 (collectives.h), so a chunk is SlicePerChunk = 2 slices of 2 slots
each. prims_simple.h `genericOp` (NCCL v2.29.7-1, v2.30.7-1) works a chunk of `nelem` elements slice by slice:
the slice is `max(divUp(nelem, 16 x SlicePerChunk) x 16, stepSize x StepPerSlice / 32)` elements, cut to what is
left; for each it waits for the slice's slots (`waitPeer`), copies it, and posts it (`postPeer`: the tail
downstream, the head upstream) before it starts the next. A slice past the chunk's end is empty but still waits and
posts, so every slice takes its 2 slots.
"""

from __future__ import annotations

from phantora.collectives.nccl import ring_kernel
from phantora.collectives.nccl.proxy import RING_SLICE_STEPS

SLICE_ALIGN = 16  # elements: a slice is a whole number of 16 elements (divUp(nelem, 16 x SlicePerChunk) x 16)
FLOOR_PARTS = 32  # the slice's floor: stepSize x StepPerSlice / 32 elements


def slice_bytes(chunk: int, elem: int, step: int) -> list[int]:
    """The bytes of each of a Simple ring chunk's `ring_kernel.SLICES_PER_CHUNK` slices (the last ones may be
    empty): `chunk` bytes of `elem`-byte elements, `step` the bytes of one of the buffer's steps (stepSize)."""
    if chunk < 0 or elem < 1 or step < 1:
        raise ValueError(f"ring_slices: bad chunk ({chunk} B, {elem} B elements, {step} B step)")
    per = ring_kernel.SLICES_PER_CHUNK
    nelem, odd = divmod(chunk, elem)
    floor = (step // elem) * RING_SLICE_STEPS["Simple"] // FLOOR_PARTS
    size = max(-(-nelem // (SLICE_ALIGN * per)) * SLICE_ALIGN, floor)
    out, offset, last = [], 0, 0
    for q in range(per):
        take = max(0, min(size, nelem - offset))
        out.append(take * elem)
        offset += take
        last = q if take else last
    out[last] += odd  # bytes short of a whole element go with the last data (NCCL's counts are whole elements)
    return out
