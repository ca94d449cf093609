"""The pipeline fill NCCL's cost model leaves out: a chunk must cross every stage of a pipelined algorithm before the
last stage has data, so the collective takes (stages - 1) chunk times longer than latency plus bytes over bandwidth.
NCCL's latency term counts the per-hop software latency once; the chunk's own transfer through the stages is not in
it. The ring has no fill (every rank sends from its first step). NVLS inside one node counts the steps its kernel's
warp groups hand on whole through their connections' slots (src/device/all_reduce.h, reduce_scatter.h, all_gather.h,
NCCL_ALGO_NVLS, v2.17.1-1 to v2.30.7-1; `nvls_stages`): an all-reduce three (the scatter warps copy a loop's chunks
into the NVLS buffer; each head's reduce warps load-reduce its chunk through the switch and store the sum as a
multicast in the same primitive call, element by element, so the load-reduce and the multicast are one stage, not
two; the gather warps copy the loop out), a reduce-scatter two (scatter, then load-reduce into the output) and an
all-gather two (multicast store, then gather). NVLS-Tree three on two nodes (NVLS reduce, the tree across nodes,
NVLS multicast; its kernel's scatter and gather are not counted: adding them moves the fitted two- to eight-host
H100 tables away, 33 -> 31 tables at goal) plus, on more nodes, the extra network hops of its deeper tree (each a
chunk over a NIC's share per channel), the tree 2 x (GPUs per node - 1 + tree height) (up the chain and tree, then
down) under Simple and LL128. Under LL a tree's GPU forwards each 16-byte line as soon as its flag arrives
(prims_ll.h reads, reduces and stores one line at a time), so a chunk crosses the NVLink chain at wire latency,
which NCCL's latency already counts; only a network hop stores and forwards a whole step (the proxy sends it once
every line of it is written): 2 x tree height stages, one chunk time on two nodes. (LL128 forwards its 128-byte
lines the same way, but the tree correction, `tuning.tree_correction_us`, is fitted with the chain's fill in place:
moving it there moves the compared >= 1 MiB rows, 33 -> 32 tables at goal; left as is.)

Chunk sizes follow NCCL's `calcCollChunking` (`chunking.py`); a chunk's time is its bytes over one operation's
share of the model's bandwidth. NVLS-Tree with a single chunk per operation forms no pipeline (`nvls_tree.py`).
"""

from __future__ import annotations

import math

from phantora.collectives.nccl import nvls_tree
from phantora.collectives.nccl.channels import nvls_heads
from phantora.collectives.nccl.chunking import chunk_bytes
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings

# Fixed cost (µs) of one NVLS chunk for one head: each loop, a CTA's scatter warps post a chunk to every head's
# connection and its gather warps wait on every head's (src/device/all_reduce.h, NCCL_ALGO_NVLS, v2.17.1-1 to
# v2.30.7-1), a flag wait and post per head and chunk. A loop of a CTA therefore costs heads x this, and the cost
# per byte, this over (channels x chunk), does not depend on the heads. Fitted as 4.2 µs per chunk-operation on the
# 8-head Azure ND H100 v5 table (the marginal bandwidth either side of its 64 KiB -> 128 KiB step, 257 vs 274 GB/s
# algbw): 4.2 / 8. The held-out B200 host's step from 64 to 512 KiB chunks (4 -> 8 GiB, NCCL_NVLS_CHUNKSIZE=524288)
# gives 0.51 µs on 24 CTAs (docs/validation.md, "Held-out tables").
NVLS_HEAD_CHUNK_COST_US = 4.2 / 8


def chunk_overhead_us(
    algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int, channels: int, kind: str
) -> float:
    """Extra time (µs) of the chunks a mid-size NVLS `kind` collective adds over NCCL's largest chunk: each CTA
    runs ceil(bytes / (channels x heads x chunk)) loops, each a chunk per head at `NVLS_HEAD_CHUNK_COST_US`, and
    NCCL's bandwidth already pays that cost at the largest chunk."""
    if algo != "nvls" or nbytes <= 0:
        return 0.0
    heads = nvls_heads(p)
    ops = max(1, channels * heads)
    per_op = nbytes / ops
    chunk = chunk_bytes(algo, proto, p, st, nbytes, ops, kind)
    largest = chunk_bytes(algo, proto, p, st, 1 << 62, ops, kind)
    extra = math.ceil(per_op / chunk) - math.ceil(per_op / largest)
    return max(0, extra) * heads * NVLS_HEAD_CHUNK_COST_US


# The steps a one-node NVLS kernel's warp groups store and forward, one group after another, per collective (its
# unregistered buffers: on registered ones the data moves in one pass, register.py, and nothing fills).
NVLS_STAGES = {"all_reduce": 3, "reduce_scatter": 2, "all_gather": 2}


def nvls_stages(kind: str) -> int:
    """Stages of a one-node NVLS `kind`: all-reduce scatter, reduce-and-multicast, gather; reduce-scatter scatter,
    load-reduce; all-gather multicast store, gather."""
    return NVLS_STAGES.get(kind, 2)


def stages(algo: str, p: Platform, proto: str = "Simple", kind: str = "all_reduce") -> int:
    """Pipeline stages a chunk crosses one after another (the tree's LL lines: its network hops only)."""
    if algo == "nvls":
        return nvls_stages(kind)
    if algo == "nvls_tree":
        return 3
    if algo == "tree":
        height = math.ceil(math.log2(p.nnodes)) if p.nnodes > 1 else 0
        if proto == "LL":
            return 2 * height
        return 2 * (p.ppn - 1 + height)
    return 1


def fill_us(
    algo: str,
    proto: str,
    p: Platform,
    st: NcclSettings,
    nbytes: int,
    channels: int,
    algbw: float,
    kind: str,
    chunk: int = 0,
) -> float:
    """Extra time (µs) of the pipeline fill of a `kind` collective: (stages - 1) chunk times of one concurrent
    operation; NVLS-Tree with one chunk per operation (nLoops = 1): that chunk's own crossing, never more
    (`nvls_tree.fill_us`). `chunk`: NCCL's chunk where the caller knows it (registered NVLS, register.py), else
    `chunk_bytes`'."""
    depth = stages(algo, p, proto, kind)
    if depth <= 1 or algbw <= 0 or nbytes <= 0:
        return 0.0
    heads = nvls_heads(p) if algo in ("nvls", "nvls_tree") else 1
    ops = max(1, channels * heads)
    chunk = min(chunk or chunk_bytes(algo, proto, p, st, nbytes, ops, kind), math.ceil(nbytes / ops))
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
