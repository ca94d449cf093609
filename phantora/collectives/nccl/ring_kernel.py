"""The Simple ring inside one node as its kernel runs: the GPU's NVLink rate, one slice of fill, a cost per pass.

NCCL 2.30 gives each channel one contiguous part of the buffer (`ncclCollCbdPart`, src/include/device.h) and the
ring kernel (`runRing` in src/device/all_reduce.h, all_gather.h, reduce_scatter.h) walks that part in passes of
nranks chunks; a chunk is ALLREDUCE_CHUNKSTEPS = 4 steps of the Simple buffer (2 MiB by default), a pass of one
channel moves one chunk per ring step (2(n-1) steps for all-reduce, n-1 for all-gather and reduce-scatter), and a
part shorter than a pass runs one pass of smaller chunks (`chunkCount = divUp(remCount, nranks)`). NCCL 2.18's
loop, which strides all channels through the buffer together (`loopSize = nChannels*nranks*chunkSize`), gives a
channel the same count of passes, ceil(bytes / (channels x nranks x chunk)). Each chunk
moves as SlicePerChunk = 2 slices (prims_simple.h `genericOp`: wait for the peer, copy, barrier, post, per slice).
What NCCL's model (latency plus bytes over its rated bandwidth) leaves out, and this adds:

- *Rate*: the bytes move at the GPU's NVLink bandwidth in NCCL's own units (18 x 20.6 = 370.8 GB/s on H100,
  12 x 20 = 240 on A100), not at the search's quantised per-channel speed times its channels (24 x 15 = 360 on
  H100). NCCL's rating still makes the choice, as for NVLS (`nvls_kernel.py`). Each channel moves its share of
  that NVLink rate (fewer channels than NCCL's own: their share, `tuning.channel_limit`), and an all-reduce moves
  no more in all than its GPU generation's all-reduce ceiling, where one is published
  (`tables.RING_REDUCE_BUSBW_MAX`: about 230 GB/s on an A100, below its 240 of NVLink; none on H100, whose ring
  all-reduce outruns its all-gather). The ceiling is the whole GPU's, so it binds the channels' sum:
  min(channels x their share, ceiling), as NCCL 2.9-2.17's tuner capped sm80 (tuning.cc `busBw = std::min(busBw,
  235.0f)` after `nChannels * bw`). Only all-reduce: its sources (nccl-tests#149, the NDmv4 and #175 tables) are
  all-reduce figures, and no published A100 reduce-scatter table was found to show it there.
- *Fill*: one slice of the first pass at one channel's share of that rate (`SLICES_PER_CHUNK`). Measured, not
  derived: an ideal ring in lockstep, every rank sending from its first step, has none; which part of the kernel
  makes it is not known.
- *Passes*: a fixed cost per pass of a channel, the channels side by side. It is SM work (the loop's set-up,
  the slices' barriers and flag polls), so it is counted in SM clock cycles (`RING_PASS_COST_CYCLES`: 9 µs at
  the H100 SXM's 1.98 GHz, where it was fitted) and takes 12.6 µs on an A100 at 1.41 GHz.

Checked against every published one-host ring table that ran Simple (docs/validation.md): the time the H100
tables (2, 4, 6 and 8 GPUs; all-reduce, all-gather, reduce-scatter; 120 sizes from 4 MiB to 8 GiB) take over
NCCL's latency plus bytes at 370.8 GB/s grows with the first pass's chunk while there is one pass (8 GPUs: 12-20 µs
at 0.17-0.33 MiB chunks, 33-45 at 0.67, 54-73 at 1.33), then by a near-constant amount per pass. With the slice
and 9 µs a pass, their median |error| goes from 4.0% to 2.0% and the sizes more than 10% off from 20 to 2
(`bench/bench_nccl_tests.py`); the A100 ring sizes that ran Simple (27), from 6.1% to 3.3%.
"""

from __future__ import annotations

import math

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.platform import Platform

REFERENCE_CLOCK_GHZ = 1.98  # H100 SXM boost clock, the GPU of the tables the pass cost was fitted on
RING_PASS_COST_CYCLES = 9.0 * 1000 * REFERENCE_CLOCK_GHZ  # one pass of one channel: 9 µs on H100 = 17,820 cycles
RING_CHUNK_STEPS = 4  # ALLREDUCE/ALLGATHER/REDUCESCATTER_CHUNKSTEPS = NCCL_STEPS / 2
SLICES_PER_CHUNK = 2  # ALLREDUCE_CHUNKSTEPS / ALLREDUCE_SLICESTEPS
PASSED_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
REDUCING_KINDS = ("all_reduce", "reduce_scatter")  # the ring kernels that reduce what they receive
CEILING_KINDS = ("all_reduce",)  # the kinds `tables.RING_REDUCE_BUSBW_MAX` was measured on


def applies(kind: str, algo: str, proto: str, p: Platform) -> bool:
    """Whether this is a Simple ring of all-reduce, all-gather or reduce-scatter inside one NVLink node."""
    return algo == "ring" and proto == "Simple" and kind in PASSED_KINDS and p.nnodes == 1 and p.intra == "nvlink"


def kernel_busbw(p: Platform, kind: str, share: float = 1.0) -> float:
    """Bus bandwidth (GB/s) of the ring kernel on `share` of NCCL's own channels: that share of the GPU's NVLink in
    NCCL's units, and for an all-reduce no more in all than the generation's ceiling
    (`tables.RING_REDUCE_BUSBW_MAX`; none: the NVLink's share)."""
    rate = p.gpu_intra_bw * share
    ceiling = T.RING_REDUCE_BUSBW_MAX.get(p.arch) if kind in CEILING_KINDS else None
    return min(rate, ceiling) if ceiling else rate


def passes(p: Platform, nbytes: int, channels: int, chunk: int) -> int:
    """Passes of one channel: its part (nbytes / channels) in passes of nranks chunks (nccl-tests' size: the whole
    buffer of all-reduce, the gathered output of all-gather, the input of reduce-scatter)."""
    if nbytes <= 0:
        return 0
    return math.ceil(nbytes / (max(1, channels) * p.nranks * chunk))


def first_chunk(p: Platform, nbytes: int, channels: int, chunk: int) -> float:
    """Bytes of one chunk of the first pass: the full chunk, or a part's share of nranks when one pass holds it."""
    return min(float(chunk), nbytes / (max(1, channels) * p.nranks))


def fill_us(p: Platform, kind: str, nbytes: int, channels: int, chunk: int, share: float = 1.0) -> float:
    """One slice of the first pass at one channel's share of the kernel's rate on `share` of NCCL's channels (µs)."""
    per_channel = kernel_busbw(p, kind, share) * 1000.0 / max(1, channels)  # bytes per µs
    return first_chunk(p, nbytes, channels, chunk) / SLICES_PER_CHUNK / per_channel


def pass_cost_us(p: Platform) -> float:
    """One pass's fixed cost (µs) on this GPU: `RING_PASS_COST_CYCLES` at its SM clock (H100's when unknown)."""
    return RING_PASS_COST_CYCLES / (1000.0 * (p.sm_clock_ghz or REFERENCE_CLOCK_GHZ))


def pass_overhead_us(p: Platform, nbytes: int, channels: int, chunk: int) -> float:
    """The passes' fixed cost (µs): one channel's passes times `pass_cost_us`."""
    return passes(p, nbytes, channels, chunk) * pass_cost_us(p)
