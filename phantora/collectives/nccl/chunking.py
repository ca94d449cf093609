"""The chunk NCCL moves per step, for each algorithm and protocol (src/enqueue.cc `calcCollChunking`, and
`addP2pToPlan` for send/recv and all-to-all).

A collective's chunk starts at the protocol's step (its buffer over NCCL_STEPS; LL's data is half its lines,
LL128's 15/16) and shrinks for mid-size messages so that every concurrent operation keeps several chunks in flight
(the NVLS, NVLS-Tree, LL128 tree and PAT ladders); from NCCL 2.22 it is then cut down to whole grains of its
protocol (`chunkSize / grainSize * grainSize`). A p2p transfer's step is the communicator's p2p chunk
(NCCL_P2P_NET_CHUNKSIZE once it spans nodes, else NCCL_P2P_NVL_CHUNKSIZE; at most the Simple buffer over
NCCL_STEPS: init.cc), halved or quartered for small transfers to a peer on another node.
"""

from __future__ import annotations

import struct

from phantora.collectives.nccl import channel_split
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.channels import nvls_heads, plan_channels, sm100_nvls_tree
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings
from phantora.errors import InputError

KiB = 1024
GRAINS_FROM = (2, 22)  # v2.22.3-1 brought ncclProtoGrainSize (device.h) and the grain rounding in calcCollChunking
# ncclProtoGrainSize: LL 16 B (one line); LL128 one warp's lines, 32 lanes x 8 words / 16 words a line x 15 data words
# x 8 bytes = 1,920 B; Simple 512 B
GRAIN_BYTES = {"LL": 16, "LL128": 32 * 8 // 16 * 15 * 8, "Simple": 512}


def _shrink(nbytes: int, ops: int, chunk: int, rules: tuple[tuple[int, int], ...]) -> int:
    """NCCL's rule ladder: for each (factor, size), if nbytes < factor x ops x chunk and chunk > size: chunk = size."""
    for factor, size in rules:
        if nbytes < factor * ops * chunk and chunk > size:
            chunk = size
    return chunk


def _f32(x: float) -> float:
    """`x` rounded to a C float (IEEE single precision), as NCCL's float arithmetic stores it."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _tree_ll128(p: Platform, nbytes: int, ops: int, chunk: int) -> int:
    """calcCollChunking's LL128 tree ladder in NCCL's arithmetic: bytes over (channels x chunk) in integers (a
    size_t over an int), against float thresholds from nstepsLL128 = 1 + log2i(nodes) + 0.1 x ppn, where ppn is
    the ranks over the nodes as a float and log2i rounds down."""
    ppn = _f32(p.nranks / p.nnodes)
    nsteps = _f32(1 + (p.nnodes.bit_length() - 1) + 0.1 * ppn)
    big, small = _f32(_f32(nsteps * 64) / ppn), _f32(_f32(nsteps * 16) / ppn)
    while nbytes // (ops * chunk) < big and chunk > 128 * KiB:
        chunk //= 2
    while nbytes // (ops * chunk) < small and chunk > 32 * KiB:
        chunk //= 2
    return chunk


def whole_grains(proto: str, version: tuple[int, int], chunk: int) -> int:
    """`chunk` rounded down to whole grains of `proto` as NCCL `version` does from 2.22 on; unchanged before it."""
    if version < GRAINS_FROM:
        return chunk
    grain = GRAIN_BYTES[proto]
    return chunk // grain * grain


BUFF_VARS = {"LL": "NCCL_LL_BUFFSIZE", "LL128": "NCCL_LL128_BUFFSIZE", "Simple": "NCCL_BUFFSIZE"}


def buffer_bytes(proto: str, st: NcclSettings) -> int:
    """The protocol's buffer: NCCL_LL_BUFFSIZE, NCCL_LL128_BUFFSIZE or NCCL_BUFFSIZE if set, else NCCL's."""
    own = {"LL": st.ll_buffsize, "LL128": st.ll128_buffsize, "Simple": st.buffsize}[proto]
    return own or T.DEFAULT_BUFFSIZE[proto]


def step_bytes(proto: str, st: NcclSettings) -> int:
    """One step of the protocol's buffer: its buffer over NCCL_STEPS (stepSize, enqueue.cc)."""
    return buffer_bytes(proto, st) // T.NCCL_STEPS


def refuse_empty_chunk(chunk: int, what: str, proto: str, st: NcclSettings) -> None:
    """A one-line error where the protocol's buffer leaves `what` (a collective's or a p2p transfer's NCCL chunk)
    `chunk` = 0 bytes: NCCL takes any buffer size (init.cc `computeBuffSizes`), then calcCollChunking divides the
    bytes by its zero loop (enqueue.cc `DIVUP(nBytes, loopSize)`) and a send's loop never advances (sendrecv.h)."""
    if chunk != 0:
        return
    var = BUFF_VARS[proto]
    raise InputError(
        f"{var}={buffer_bytes(proto, st)}: a step of {step_bytes(proto, st)} bytes (the buffer over NCCL_STEPS = "
        f"{T.NCCL_STEPS}) leaves {what} at 0 bytes ({proto} moves whole {GRAIN_BYTES[proto]}-byte grains); NCCL "
        "divides by it (enqueue.cc)",
        field=var,
    )


def collective_chunk(kind: str, algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, ch: int) -> int:
    """The chunk calcCollChunking gives the chosen `algo` / `proto` (a ring's: chunkSteps of the step, cut to the
    protocol's data and whole grains; the others' through their ladders, `chunk_bytes`); NVLS-Tree's, from its
    NVLS chunk and not the buffer, is refused where it overruns the buffer's step (`nvls_tree_chunk`)."""
    if algo == "nvls_tree":
        return nvls_tree_chunk(kind, p, st, nbytes, ch)
    if algo != "ring":
        heads = nvls_heads(p) if algo == "nvls" else 1
        return chunk_bytes(algo, proto, p, st, nbytes, max(1, ch) * heads, kind)
    steps = RING_SIMPLE_CHUNK_STEPS if proto == "Simple" and kind in RING_STEPPED_KINDS else 1
    chunk = step_bytes(proto, st) * steps
    chunk = chunk // 2 if proto == "LL" else chunk // 16 * 15 if proto == "LL128" else chunk
    return whole_grains(proto, st.nccl_version, chunk)


def nvls_tree_chunk(kind: str, p: Platform, st: NcclSettings, nbytes: int, ch: int) -> int:
    """NVLS-Tree's chunk (calcCollChunking: the NVLS chunk down its ladder, not the buffer), refused in one line
    naming NCCL_BUFFSIZE where it is larger than a Simple step: the tree's network connections are net transport
    connections with the Simple buffer (net.cc: stepSize = buffSize / NCCL_STEPS), and the kernel sends each chunk
    as one step into one slot (all_reduce.h's NVLS-Tree path: ProtoSimple<1, 1>, one slice a chunk), while the
    receiving proxy posts one step (recvProxyProgress: stepSize x sliceSteps). NCCL checks none of it: its IB
    transport cuts the chunk to the posted size (net_ib.cc isend) and the socket transport fails ("message
    truncated"), v2.26.5-1 to v2.30.7-1, so the call cannot run as NCCL means it at any cost."""
    chunk = chunk_bytes("nvls_tree", "Simple", p, st, nbytes, max(1, ch) * nvls_heads(p), kind)
    step = step_bytes("Simple", st)
    if p.nnodes > 1 and chunk > step:
        raise InputError(
            f"NCCL_BUFFSIZE={buffer_bytes('Simple', st)}: a step of {step} bytes (the buffer over NCCL_STEPS = "
            f"{T.NCCL_STEPS}) is smaller than NCCL's NVLS-Tree {kind} chunk of {chunk} bytes (its NVLS chunk, not the "
            "buffer), which the tree's network connections send as one step into one slot of that buffer: NCCL's IB "
            "transport cuts it to the step and its socket transport fails (net.cc, net_ib.cc); a buffer of at least "
            f"{T.NCCL_STEPS} x {chunk} bytes runs it",
            field="NCCL_BUFFSIZE",
        )
    return chunk


RING_SIMPLE_CHUNK_STEPS = 4  # ALLREDUCE/ALLGATHER/REDUCESCATTER_CHUNKSTEPS = NCCL_STEPS / 2 (collectives.h)
RING_STEPPED_KINDS = ("all_reduce", "all_gather", "reduce_scatter")  # broadcast and reduce: one step a chunk


def ring_simple_chunk(st: NcclSettings, steps: int) -> int:
    """A Simple ring's chunk: `steps` steps of its buffer (ALLREDUCE / ALLGATHER / REDUCESCATTER_CHUNKSTEPS), cut to
    whole grains from NCCL 2.22: calcCollChunking rounds the chunk, not its step (the ring has no ladder)."""
    return whole_grains("Simple", st.nccl_version, step_bytes("Simple", st) * steps)


def chunk_bytes(
    algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, ops: int, kind: str = "all_reduce"
) -> int:
    """The chunk NCCL moves per step for this algorithm and protocol (`calcCollChunking`), `ops` its concurrent
    operations (channels, x the NVLS heads for NVLS and NVLS-Tree); `kind` matters to PAT (all-gather halves down
    to 32 chunks a channel, reduce-scatter to 16) and, from NCCL 2.22, to the channel split. Before 2.22 the
    ladder sees the collective's bytes over all its operations; from 2.22 each channel's own part over its heads
    (`channel_split`: the busiest channel's, whose chunks set the pace; dealt by the algorithm's channels onto the
    communicator's, `channels.plan_channels`), and the result is cut down to whole grains of the protocol
    (`whole_grains`)."""
    heads = nvls_heads(p) if algo in ("nvls", "nvls_tree") else 1
    comm = plan_channels(algo, p, st)
    part = channel_split.busiest(st.nccl_version, kind, proto, p.nranks, nbytes, max(1, ops // heads), comm)
    if part is not None:
        nbytes, ops = part[0], heads
    return whole_grains(proto, st.nccl_version, _ladder(algo, proto, p, st, nbytes, ops, kind))


def nvls_chunk_of(p: Platform, st: NcclSettings) -> int:
    """comm->nvlsChunkSize (nvls.cc): NCCL_NVLS_CHUNKSIZE if set, else 128 KiB, or the SM100 NVLS-Tree tuning's
    chunk for Blackwell across nodes from v2.30.3-1 (`channels.sm100_nvls_tree`)."""
    if st.nvls_chunk:
        return st.nvls_chunk
    tuned = sm100_nvls_tree(p, st.nccl_version)
    return tuned[1] if tuned else T.NVLS_CHUNK


def nvls_tree_max_of(p: Platform, st: NcclSettings) -> int:
    """NVLS-Tree's largest chunk (nvls.cc): NCCL_NVLSTREE_MAX_CHUNKSIZE if set, else the SM100 tuning's (Blackwell
    across nodes, v2.30.3-1 on), else 64 KiB from 4 nodes and the NVLS chunk below."""
    if st.nvls_tree_max_chunk:
        return st.nvls_tree_max_chunk
    tuned = sm100_nvls_tree(p, st.nccl_version)
    if tuned:
        return tuned[2]
    return 64 * KiB if p.nnodes >= 4 else nvls_chunk_of(p, st)


def _ladder(algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, ops: int, kind: str) -> int:
    """calcCollChunking before the grain rounding: the protocol's step and each algorithm's ladder."""
    chunk = step_bytes(proto, st)
    if proto == "LL":
        chunk //= 2
    elif proto == "LL128":
        chunk = chunk // 16 * 15
    if algo == "nvls":
        chunk = min(chunk, nvls_chunk_of(p, st))
        return _shrink(nbytes, ops, chunk, ((64, 64 * KiB), (8, 32 * KiB), (2, 16 * KiB)))
    if algo == "nvls_tree":
        chunk = min(nvls_chunk_of(p, st), nvls_tree_max_of(p, st))
        return _shrink(nbytes, ops, chunk, ((32, 256 * KiB), (16, 128 * KiB), (4, 64 * KiB), (1, 32 * KiB)))
    if algo == "tree" and proto == "LL128":
        return _tree_ll128(p, nbytes, ops, chunk)
    if algo == "pat":
        per_channel = 32 if kind == "all_gather" else 16
        while chunk * ops * per_channel > nbytes and chunk > 64 * KiB:
            chunk //= 2
    return chunk


def comm_p2p_chunk(comm: Platform, st: NcclSettings) -> int:
    """The communicator's p2p step (init.cc `computeBuffSizes`): the net chunk once it spans nodes, the NVLink chunk
    inside an NVLink node (else the net chunk's default, NCCL's PCI chunk), never more than the Simple buffer over
    NCCL_STEPS. From NCCL 2.29 the net chunk (NCCL_P2P_NET_CHUNKSIZE, set or not) is doubled on arm hosts of
    Blackwell GPUs (cpuArch ARM, minCompCap >= 100: "GBx platforms only have 4 GPUs per host, which reduces the
    aggregation factor", v2.29.2-1 to v2.30.7-1)."""
    if comm.nnodes == 1 and comm.intra == "nvlink":
        chunk = st.p2p_nvl_chunk
    else:
        chunk = st.p2p_net_chunk * (2 if comm.nnodes > 1 and gbx_net_chunk(comm, st.nccl_version) else 1)
    return min(chunk, step_bytes("Simple", st))


def gbx_net_chunk(comm: Platform, version: tuple[int, int]) -> bool:
    """Whether NCCL `version` doubles the net p2p chunk on `comm`'s hosts: arm CPUs, Blackwell GPUs, 2.29 on."""
    return comm.cpu == "arm" and comm.compcap >= 100 and version >= T.P2P_NET_CHUNK_ARM_FROM


def p2p_chunk_bytes(proto: str, comm: Platform, st: NcclSettings, nbytes: int, network: bool) -> int:
    """The data bytes per step of one p2p transfer of `nbytes` to one peer (`addP2pToPlan`): Simple's step is the
    communicator's p2p chunk, LL's its buffer step (half of it data); to a peer over the `network`, a Simple
    transfer smaller than a step takes a quarter of it, one smaller than 8 steps half."""
    step = comm_p2p_chunk(comm, st) if proto == "Simple" else step_bytes(proto, st)
    chunk = step
    if network:
        if proto == "Simple" and nbytes < step:
            chunk //= 4
        elif nbytes < 8 * step:
            chunk //= 2
    return max(1, chunk // 2 if proto == "LL" else chunk)


TREE_THREADS = 640  # enqueue.cc: the tree kernel always runs NCCL_MAX_NTHREADS
WARP = 32
LL128_WORDS_PER_LANE = 8  # NCCL_LL128_SHMEM_ELEMS_PER_THREAD: 8-byte words a lane moves per sweep


def tree_line_sweeps(proto: str) -> tuple[int, int] | None:
    """Payload bytes a tree's reduce half and broadcast half forward per sweep of their lines under LL or LL128
    (None under Simple, whose step is posted whole). `runTreeSplit` (all_reduce.h) gives the reduce half 70% of
    the threads in whole warps and the broadcast half the rest; each line carries its own flag (prims_ll.h,
    prims_ll128.h), so the next GPU's warps take the lines as they land and a chunk crosses an NVLink hop sweep by
    sweep. A sweep: one 16-byte line (8 data bytes) a thread under LL; 8 words a lane, 120 data bytes of each
    128-byte line, under LL128."""
    up = TREE_THREADS * 7 // (10 * WARP) * WARP
    per_thread = {"LL": 8, "LL128": LL128_WORDS_PER_LANE * 8 * 120 // 128}.get(proto)
    return None if per_thread is None else (up * per_thread, (TREE_THREADS - up) * per_thread)
