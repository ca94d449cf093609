"""NCCL before 2.20 rounds a ring's LL and LL128 chunks up in the kernel, so its busiest chunk sets the pace.

`runRing` (src/collectives/device/all_reduce.h, tags v2.9.9-1 to v2.19.4-1) cuts a loop of the buffer into
nChannels x nranks chunks of `realChunkSize = min(chunkSize, divUp(size, nChannels*nranks*minChunkSize) *
minChunkSize)`: a whole number of the protocol's minimum chunk, `nthreads x 8 B` under LL (one 8-byte data word a
thread) and `nthreads x 60 B / 2` under LL128 (8 words of 15/16 data a lane, halved: "it makes performance much,
much smoother"). The chunks are laid out one after another, so when the rounding makes them larger than an even
share, the last chunks of the loop are short or empty. LL and LL128 forward a chunk line by line, so an
all-reduce's loop is not 2(n-1) times its largest chunk: each rank's call waits for its own previous call and for
its predecessor's call on the same chunk (`ring_pipeline.py`), and the slowest channel sets the time (all_gather.h
and reduce_scatter.h round LL128 the same way over nChannels chunks, one a channel, so there the largest chunk's
channel is the slowest; their LL chunk comes from the host). NCCL 2.20 moved the split to the host (enqueue.cc
`computeCollLastChunkInfo`: the last loop's chunk is its remainder over nranks, aligned), and from then on the
chunks are even.

On an 8-GPU A100 (24 channels, 640 LL128 threads) the minimum LL128 chunk is 19,200 B: a 4 MiB all-reduce's even
share of 21,845 B becomes 38,400 B in chunks 0-108, 8,704 B in chunk 109 and none after, so the slowest channel's
loop takes 10 chunk times for an even 14 shares, 1.26 times as long; a 1 MiB LL all-reduce (512 threads, 4,096 B)
12 of 8,192 B for 14 of 5,461, 1.29 times.
"""

from __future__ import annotations

import math

from phantora.collectives.nccl import ring_pipeline
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.chunking import LL128_WORDS_PER_LANE, step_bytes
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings

EVEN_FROM = (2, 20)  # v2.20.3-1: the host splits the buffer (lastChunkCount), the kernel no longer rounds up
DATA_WORD = 8  # bytes of data a thread moves per LL line
LL128_GRAIN = LL128_WORDS_PER_LANE * DATA_WORD * 15 // 16  # 60 data bytes a lane per sweep
KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def min_chunk_bytes(proto: str, threads: int) -> int:
    """The kernel's minimum chunk (`minChunkSize` in bytes): LL one data word a thread, LL128 half of 60 B a lane."""
    return threads * DATA_WORD if proto == "LL" else threads * LL128_GRAIN // 2


def thread_threshold(algo: str, proto: str, p: Platform) -> int:
    """Bytes a thread must have before NCCL opens another channel or runs more threads (tuning.cc
    `threadThresholds`): the protocol's, x nranks for the ring's LL."""
    return T.THREAD_THRESHOLD[proto] * (p.nranks if algo == "ring" and proto == "LL" else 1)


def run_threads(kind: str, proto: str, p: Platform, nbytes: int, channels: int, algo: str = "ring") -> int:
    """Threads a channel runs (enqueue.cc `topoGetAlgoInfo`, v2.22.3-1 to v2.30.7-1): a ring's protocol's most,
    halved on one channel while the bytes are fewer than threads x its threshold (`thread_threshold`); any other
    algorithm its most ("Tree now uses all threads always", PAT too; NVLS never halves)."""
    threads = T.MAX_THREADS[proto]
    if algo != "ring":
        return threads
    threshold = thread_threshold(algo, proto, p)
    while channels <= 1 and nbytes < threads * threshold and threads % 128 == 0:
        threads //= 2
    return threads


def step_data_bytes(proto: str, st: NcclSettings) -> int:
    """Data bytes of one step of the protocol's buffer, the kernel's largest chunk: half of LL's lines, 15/16 of
    LL128's."""
    step = step_bytes(proto, st)
    return step // 2 if proto == "LL" else step * 15 // 16


def busiest_over_mean(kind: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, channels: int) -> float:
    """How much longer the ring's bytes take than at an even split (1.0: even, or a kernel that does not round):
    an all-reduce's loops streamed (`streamed_over_even`); an all-gather's or reduce-scatter's largest chunk, loop
    by loop, over the buffer's even share."""
    if (
        st.nccl_version >= EVEN_FROM
        or kind not in KINDS
        or proto not in ("LL", "LL128")
        or (proto == "LL" and kind != "all_reduce")
        or nbytes <= 0
    ):
        return 1.0
    nch = max(1, channels)
    slots = nch * (p.nranks if kind == "all_reduce" else 1)
    size = nbytes if kind == "all_reduce" else nbytes / p.nranks
    minimum = min_chunk_bytes(proto, run_threads(kind, proto, p, nbytes, channels))
    chunk = step_data_bytes(proto, st)
    if kind == "all_reduce" and p.nranks > 1:
        return streamed_over_even(nbytes, p.nranks, nch, minimum, chunk)
    full_loops, rest = divmod(size, slots * chunk)
    last = min(chunk, math.ceil(rest / (slots * minimum)) * minimum) if rest else 0
    return (full_loops * chunk + last) / (size / slots)


def loop_chunks(rest: int, nranks: int, channels: int, minimum: int, chunk: int) -> list[list[int]]:
    """The last loop's chunk sizes, channel by channel (runRing's calcOffset: chunk c of channel b starts at
    (c x nChannels + b) x realChunkSize)."""
    real = min(chunk, -(-rest // (channels * nranks * minimum)) * minimum)
    return [[max(0, min(real, rest - (c * channels + b) * real)) for c in range(nranks)] for b in range(channels)]


def streamed_over_even(nbytes: int, nranks: int, channels: int, minimum: int, chunk: int) -> float:
    """A ring all-reduce's time over its time at an even split, its chunks streamed line by line (ring_pipeline):
    full loops run at the pace of their full chunks, the rounded last loop at its slowest channel's."""
    slots = channels * nranks
    full_loops, rest = divmod(nbytes, slots * chunk)
    steps = ring_pipeline.sends(nranks)
    took = full_loops * steps * chunk
    if rest:
        took += ring_pipeline.slowest_loop_time(loop_chunks(rest, nranks, channels, minimum, chunk))
    return took * slots / (steps * nbytes)
