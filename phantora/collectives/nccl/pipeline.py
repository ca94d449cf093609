"""The pipeline fill NCCL's cost model leaves out: a chunk must cross every stage of a pipelined algorithm before
the last stage has data, so the collective takes (stages - 1) chunk times longer than latency plus bytes over
bandwidth. NCCL's latency term counts the per-hop software latency once; the chunk's own transfer through the
stages is not in it. The ring has no fill (every rank sends from its first step); NVLS has two stages (the
switch's load-reduce, then its multicast store), NVLS-Tree three on two nodes (NVLS reduce, the tree across nodes,
NVLS multicast) plus, on more nodes, the extra network hops of its deeper tree (each a chunk over a NIC's share per
channel), the tree 2 x (GPUs per node - 1 + tree height) (up the chain and tree, then down).

Chunk sizes follow NCCL's `calcCollChunking` (`chunking.py`); a chunk's time is its bytes over one operation's
share of the model's bandwidth. NVLS-Tree with a single chunk per operation forms no pipeline (`nvls_tree.py`).
"""

from __future__ import annotations

import math

from phantora.collectives.nccl import nvls_tree
from phantora.collectives.nccl.chunking import chunk_bytes
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings

# Fixed cost of one NVLS chunk per operation (µs): the multimem load-reduce / store loop synchronises its warps and
# the peers' flags once per chunk. NCCL's bandwidth is its rate at the largest chunk; below 1 GiB the chunk ladder
# halves the chunk and this cost shows. Fitted on the marginal bandwidth either side of the 64 KiB -> 128 KiB step
# of the Azure ND H100 v5 table (257 vs 274 GB/s algbw), and it predicts the H200 table's steps (docs/validation.md).
NVLS_CHUNK_COST_US = 4.2


def chunk_overhead_us(
    algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, channels: int, kind: str
) -> float:
    """Extra time (µs) of the chunks a mid-size NVLS `kind` collective adds over NCCL's largest chunk: each operation
    (channel x head) runs ceil(bytes / chunk) chunks, each with a fixed cost, and NCCL's bandwidth already pays that
    cost at the largest chunk."""
    if algo != "nvls" or nbytes <= 0:
        return 0.0
    ops = max(1, channels * p.ppn)
    per_op = nbytes / ops
    chunk = chunk_bytes(algo, proto, p, st, nbytes, ops, kind)
    largest = chunk_bytes(algo, proto, p, st, 1 << 62, ops, kind)
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


def fill_us(
    algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, channels: int, algbw: float, kind: str
) -> float:
    """Extra time (µs) of the pipeline fill of a `kind` collective: (stages - 1) chunk times of one concurrent
    operation; NVLS-Tree with one chunk per operation (nLoops = 1): that chunk's own crossing, never more
    (`nvls_tree.fill_us`)."""
    depth = stages(algo, p)
    if depth <= 1 or algbw <= 0 or nbytes <= 0:
        return 0.0
    heads = p.ppn if algo in ("nvls", "nvls_tree") else 1
    ops = max(1, channels * heads)
    chunk = min(chunk_bytes(algo, proto, p, st, nbytes, ops, kind), math.ceil(nbytes / ops))
    per_op = algbw * 1000.0 / ops  # bytes per µs of one operation
    if algo == "tree":
        per_op *= 2  # the tree's model bandwidth is half its per-edge rate (NCCL's 0.5 ratio)
    fill = (depth - 1) * chunk / per_op
    if algo == "nvls_tree" and p.nnodes > 2 and p.nic_bw > 0:  # deeper trees: more network hops to cross
        fill += tree_hops_beyond_two_nodes(p) * chunk / (p.nic_bw * 1000.0 / channels)
    if algo == "nvls_tree":
        fill = nvls_tree.fill_us(p, st, nbytes, channels, algbw, fill)
    return fill


def tree_hops_beyond_two_nodes(p: Platform) -> int:
    """Network hops a chunk of NVLS-Tree crosses beyond the two of a two-node tree: NCCL's tree of nodes
    (`ncclGetBtree`, one per half of the channels) is ceil(log2(nodes)) deep, crossed up then down, and each hop
    moves the whole chunk over the head GPU's NIC at its share per channel. (Two nodes: the three stages.)"""
    return 2 * (math.ceil(math.log2(p.nnodes)) - 1) if p.nnodes > 2 else 0
