"""The pipeline fill NCCL's cost model leaves out: a chunk must cross every stage of a pipelined algorithm before
the last stage has data, so the collective takes (stages - 1) chunk times longer than latency plus bytes over
bandwidth. NCCL's latency term counts the per-hop software latency once; the chunk's own transfer through the
stages is not in it. The ring has no fill (every rank sends from its first step); NVLS has two stages (the
switch's load-reduce, then its multicast store), NVLS-Tree three on two nodes (NVLS reduce, the tree across nodes,
NVLS multicast) plus, on more nodes, the extra network hops of its deeper tree (each a chunk over a NIC's share per
channel), the tree 2 x (GPUs per node - 1 + tree height) (up the chain and tree, then down).

Chunk sizes follow NCCL's `calcCollChunking` (src/enqueue.cc), which shrinks the chunk for mid-size messages so
that every concurrent operation keeps several chunks in flight; a chunk's time is its bytes over one operation's
share of the model's bandwidth.
"""

from __future__ import annotations

import math

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings

KiB = 1024
# Fixed cost of one NVLS chunk per operation (µs): the multimem load-reduce / store loop synchronises its warps and
# the peers' flags once per chunk. NCCL's bandwidth is its rate at the largest chunk; below 1 GiB the chunk ladder
# halves the chunk and this cost shows. Fitted on the marginal bandwidth either side of the 64 KiB -> 128 KiB step
# of the Azure ND H100 v5 table (257 vs 274 GB/s algbw), and it predicts the H200 table's steps (docs/validation.md).
NVLS_CHUNK_COST_US = 4.2


def _shrink(nbytes: int, ops: int, chunk: int, rules: tuple[tuple[int, int], ...]) -> int:
    """NCCL's rule ladder: for each (factor, size), if nbytes < factor x ops x chunk and chunk > size: chunk = size."""
    for factor, size in rules:
        if nbytes < factor * ops * chunk and chunk > size:
            chunk = size
    return chunk


def chunk_bytes(algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, ops: int) -> int:
    """The chunk NCCL moves per step for this algorithm and protocol (`calcCollChunking`)."""
    buff = st.buffsize if proto == "Simple" and st.buffsize else T.DEFAULT_BUFFSIZE[proto]
    chunk = buff // T.NCCL_STEPS
    if proto == "LL":
        chunk //= 2
    elif proto == "LL128":
        chunk = chunk // 16 * 15
    if algo == "nvls":
        chunk = min(chunk, st.nvls_chunk)
        return _shrink(nbytes, ops, chunk, ((64, 64 * KiB), (8, 32 * KiB), (2, 16 * KiB)))
    if algo == "nvls_tree":
        tree_max = st.nvls_tree_max_chunk or (64 * KiB if p.nnodes >= 4 else st.nvls_chunk)  # nvls.cc
        chunk = min(st.nvls_chunk, tree_max)
        return _shrink(nbytes, ops, chunk, ((32, 256 * KiB), (16, 128 * KiB), (4, 64 * KiB), (1, 32 * KiB)))
    if algo == "tree" and proto == "LL128":
        steps = 1 + math.log2(p.nnodes) + 0.1 * p.ppn
        while nbytes / (ops * chunk) < steps * 64 / p.ppn and chunk > 128 * KiB:
            chunk //= 2
        while nbytes / (ops * chunk) < steps * 16 / p.ppn and chunk > 32 * KiB:
            chunk //= 2
    return chunk


def chunk_overhead_us(algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, channels: int) -> float:
    """Extra time (µs) of the chunks a mid-size NVLS collective adds over NCCL's largest chunk: each operation
    (channel x head) runs ceil(bytes / chunk) chunks, each with a fixed cost, and NCCL's bandwidth already pays that
    cost at the largest chunk."""
    if algo != "nvls" or nbytes <= 0:
        return 0.0
    ops = max(1, channels * p.ppn)
    per_op = nbytes / ops
    chunk = chunk_bytes(algo, proto, p, st, nbytes, ops)
    largest = chunk_bytes(algo, proto, p, st, 1 << 62, ops)
    extra = math.ceil(per_op / chunk) - math.ceil(per_op / largest)
    return max(0, extra) * NVLS_CHUNK_COST_US


def stages(algo: str, p: Platform) -> int:
    """Pipeline stages a chunk crosses one after another."""
    if algo == "nvls":
        return 2
    if algo == "nvls_tree":
        return 3
    if algo == "tree":
        return 2 * (p.ppn - 1 + math.ceil(math.log2(p.nnodes)))
    return 1


def fill_us(algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, channels: int, algbw: float) -> float:
    """Extra time (µs) of the pipeline fill: (stages - 1) chunk times of one concurrent operation."""
    depth = stages(algo, p)
    if depth <= 1 or algbw <= 0 or nbytes <= 0:
        return 0.0
    heads = p.ppn if algo in ("nvls", "nvls_tree") else 1
    ops = max(1, channels * heads)
    chunk = min(chunk_bytes(algo, proto, p, st, nbytes, ops), math.ceil(nbytes / ops))
    per_op = algbw * 1000.0 / ops  # bytes per µs of one operation
    if algo == "tree":
        per_op *= 2  # the tree's model bandwidth is half its per-edge rate (NCCL's 0.5 ratio)
    fill = (depth - 1) * chunk / per_op
    if algo == "nvls_tree" and p.nnodes > 2 and p.nic_bw > 0:  # deeper trees: more network hops to cross
        fill += tree_hops_beyond_two_nodes(p) * chunk / (p.nic_bw * 1000.0 / channels)
    return fill


def tree_hops_beyond_two_nodes(p: Platform) -> int:
    """Network hops a chunk of NVLS-Tree crosses beyond the two of a two-node tree: NCCL's tree of nodes
    (`ncclGetBtree`, one per half of the channels) is ceil(log2(nodes)) deep, crossed up then down, and each hop
    moves the whole chunk over the head GPU's NIC at its share per channel. (Two nodes: the three stages.)"""
    return 2 * (math.ceil(math.log2(p.nnodes)) - 1) if p.nnodes > 2 else 0
