"""NCCL's symmetric kernels (`-R 2`, `nccl/sym_kernels.py`) as flows: the bytes each GPU's NVLink carries as the
kernel moves them, inside one NVLink domain.

The unicast kernels reach every peer's buffer directly (loads and stores through the symmetric window), so they
are a mesh, one flow per ordered pair: all-reduce `AGxLL_R` sends the whole buffer S to every peer (LL lines, so
2S on the wire: `shape.wire_bytes`) and reduces locally; `RSxLD_AGxST` loads each peer's part of its slice and
stores its reduced slice to every peer, 2S/n a pair; all-gather `LL` / `ST` store a rank's part s = S/n to every
peer; reduce-scatter `LL` / `LD` move each peer's part of a slice, s a pair. Each GPU then carries (n - 1) pairs
each way. The multicast kernels (NVLS) go through the switch: a GPU stores or load-reduces once and the switch
replicates or reduces, so, as `nvls.py` writes NVLS, they are n flows GPU i -> i + 1 carrying the bounding
direction's bytes: `RSxLDMC_AGxSTMC` S (n + 1) / n, `AGxLLMC_R` (n - 1) S (received), all-gather `LLMC` / `STMC`
and reduce-scatter `LDMC` (n - 1) s.

The GIN kernels across hosts (2.29.7+, `nccl/sym_gin.py`) run on H hosts of L GPUs, a rail being the GPUs of one
local index: `AllGather_RailRing_LsaSTMC` passes every rank's part s around its rail's ring, (H - 1) s out of each
GPU to the same GPU of the next host, and each GPU multicasts the H parts it ends with into its host, written as
above, (L - 1) H s GPU i -> i + 1 of each host; `ReduceScatter_RailA2A_LsaLD` has each GPU load from each host
peer its copies of the H parts of its rail (H s a pair, a mesh) and put the reduced part of each rail peer to that
peer, s a pair across hosts; `_LsaLDMC` loads through the switch, (L - 1) H s GPU i -> i + 1.
"""

from __future__ import annotations

from phantora.collectives.dag import DagBuilder
from phantora.collectives.nccl import tables as T
from phantora.errors import InputError

HIER_CHUNK = 64 << 20  # ce_coll.cc HIER_COLL_MAX_CHUNK_SIZE
HIER_ALIGN = 8 << 10  # ncclHierCollBuildChunk's alignment of a uniform chunk
HOST_SYNC_NS = round(1000 * T.HW_LAT["nvlink"]["ring"][T.PROTOCOLS.index("Simple")])  # ncclMemOpSync (ce_coll.py)


def hier_chunks(nbytes: int) -> list[int]:
    """`ncclHierCollBuildChunk`: one peer's bytes as the RMA proxy's puts: one if at most 64 MiB, else
    ceil(nbytes / 64 MiB) chunks of a uniform size (rounded down to 8 KiB, at least 8 KiB), the last one the rest."""
    if nbytes <= HIER_CHUNK:
        return [nbytes]
    k = -(-nbytes // HIER_CHUNK)
    uniform = max(HIER_ALIGN, nbytes // k // HIER_ALIGN * HIER_ALIGN)
    return [uniform] * (k - 1) + [nbytes - uniform * (k - 1)]


MULTICAST = ("AllReduce_AGxLLMC_R", "AllReduce_RSxLDMC_AGxSTMC", "AllGather_LLMC", "AllGather_STMC")
MULTICAST_RS = ("ReduceScatter_LDMC",)


def pair_bytes(kind: str, kernel: str, nbytes: int, n: int) -> int:
    """Payload bytes of one flow of `kernel` (a mesh pair, or a multicast kernel's GPU i -> i + 1 flow), for a
    collective of `nbytes` (phantora's size: all-gather's output, reduce-scatter's input) over `n` GPUs."""
    part = nbytes if kind == "all_reduce" else -(-nbytes // n)
    if kernel == "AllReduce_RSxLDMC_AGxSTMC":
        return -(-nbytes * (n + 1) // n)
    if kernel in MULTICAST or kernel in MULTICAST_RS:
        return (n - 1) * part
    if kernel == "AllReduce_RSxLD_AGxST":
        return -(-2 * nbytes // n)
    return part


GIN_KERNELS = ("AllGather_RailRing_LsaSTMC", "ReduceScatter_RailA2A_LsaLD", "ReduceScatter_RailA2A_LsaLDMC")


def gin_flows(b: DagBuilder, kernel: str, blocks: list[list[int]], nbytes: int) -> None:
    """The flows of a GIN kernel over `blocks` (group positions by host, each host as many), for a collective of
    `nbytes` (all-gather's output, reduce-scatter's input)."""
    hosts, local = len(blocks), len(blocks[0])
    part = -(-nbytes // (hosts * local))
    tag = f"sym/{kernel}"
    rail_out = (hosts - 1) * part if kernel.startswith("AllGather") else part
    for h, block in enumerate(blocks):
        for i, pos in enumerate(block):
            peers = (
                [blocks[(h + 1) % hosts][i]]
                if kernel.startswith("AllGather")
                else [o[i] for o in blocks if o is not block]
            )
            for peer in peers:
                b.add(pos, peer, rail_out, tag, 0)
            if kernel == "ReduceScatter_RailA2A_LsaLD":
                for other in block:
                    if other != pos:
                        b.add(pos, other, hosts * part, tag, 0)
            elif local > 1:
                b.add(pos, block[(i + 1) % local], (local - 1) * hosts * part, tag, 0)


def sym_flows(
    b: DagBuilder, kind: str, kernel: str, n: int, nbytes: int, blocks: list[list[int]] | None = None
) -> None:
    """The flows of symmetric kernel `kernel` over group positions 0..n-1: one NVLink domain, or the hosts of
    `blocks` for a GIN kernel."""
    if kernel in GIN_KERNELS:
        assert blocks is not None
        gin_flows(b, kernel, blocks, nbytes)
        return
    size = pair_bytes(kind, kernel, nbytes, n)
    tag = f"sym/{kernel}"
    if kernel in MULTICAST or kernel in MULTICAST_RS:
        for i in range(n):
            b.add(i, (i + 1) % n, size, tag, 0)
        return
    mesh(b, n, size, tag)


def mesh(b: DagBuilder, n: int, size: int, tag: str) -> None:
    """One flow of `size` bytes for every ordered pair of positions 0..n-1, all at once."""
    for i in range(n):
        for j in range(n):
            if i != j:
                b.add(i, j, size, tag, 0)


def ce_flows(b: DagBuilder, kind: str, n: int, nbytes: int, blocks: list[list[int]] | None = None) -> None:
    """A copy-engine collective (`nccl/ce_coll.py`): each GPU's copy engines write its part of an all-gather (S/n of
    the output S) or its block of an all-to-all (S/n of its send buffer S) into every peer's window, one copy a
    peer, all in one batch. The copy into its own output stays in its memory. Across hosts (`blocks` of more than
    one host): NCCL 2.30.7's hierarchical CE, `hier_ce_flows`."""
    if blocks is not None and len(blocks) > 1:
        hier_ce_flows(b, kind, blocks, nbytes)
        return
    mesh(b, n, -(-nbytes // n), f"ce/{kind}")


def hier_ce_flows(b: DagBuilder, kind: str, blocks: list[list[int]], nbytes: int) -> None:
    """NCCL 2.30.7's hierarchical CE (`ncclHierCeAllGather` / `ncclHierCeAlltoAll`) on H hosts of L GPUs, a rank's
    part s = S / (H L), each peer's bytes put across the network in `hier_chunks` (the RMA proxy's puts, posted all
    at once; a peer's chunks go on the wire in order, `DagBuilder.add_chunks`).
    All-to-all: each GPU puts s to every GPU of every other host and copies s to each host peer, all at once.
    All-gather: each GPU puts s to the GPU of its local index on every other host (its rail peers) and, one host sync
    later (`HOST_SYNC_NS`, a delay of its own), copies s to each host peer; then, for the other hosts in shift order
    (host h - k for k = 1 .. H - 1) and each chunk, once that chunk has arrived and its previous batch of copies
    has ended (its stream runs them in turn), it copies the chunk to each host peer."""
    hosts = len(blocks)
    if len({len(block) for block in blocks}) > 1:
        raise InputError(
            f"NCCL's hierarchical copy-engine {kind} over hosts of {sorted({len(x) for x in blocks})} GPUs of the "
            "communicator: not modelled (NCCL pairs each GPU with the GPU of its local index on every other host)",
            field="NCCL_CTA_POLICY",
        )
    s = -(-nbytes // sum(len(block) for block in blocks))
    chunks = hier_chunks(s)
    tag = f"ce/{kind}"
    if kind == "all_to_all":
        for h, block in enumerate(blocks):
            for pos in block:
                for k in range(1, hosts):
                    for peer in blocks[(h + k) % hosts]:
                        b.add_chunks(pos, peer, chunks, f"{tag}/put", 0, window=len(chunks), puts=True)
                for other in block:
                    if other != pos:
                        b.add(pos, other, s, tag, 0)
        return
    puts: dict[tuple[int, int], list[int]] = {}
    for h, block in enumerate(blocks):
        for i, pos in enumerate(block):
            for k in range(1, hosts):
                peer = blocks[(h + k) % hosts][i]
                puts[pos, peer] = b.add_chunks(pos, peer, chunks, f"{tag}/put", 0, window=len(chunks), puts=True)
    for h, block in enumerate(blocks):
        for i, pos in enumerate(block):
            others = [o for o in block if o != pos]
            batch = tuple(b.add(pos, o, s, tag, 0, delay_ns=HOST_SYNC_NS) for o in others)
            for k in range(1, hosts):
                arrived = puts[blocks[(h - k) % hosts][i], pos]
                for j, c in enumerate(chunks):
                    batch = tuple(b.add(pos, o, c, tag, 0, deps=(arrived[j], *batch)) for o in others)
