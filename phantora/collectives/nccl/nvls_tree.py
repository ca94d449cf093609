"""NVLS-Tree all-reduce when each operation has a single chunk: no pipeline forms, so the collective is that chunk's
own crossing of the stages, each at its hardware's rate, not (stages - 1) chunk times at NCCL's rate.

NCCL's NVLS-Tree kernel (src/device/all_reduce.h, NCCL_ALGO_NVLS_TREE) runs on each of `channels` CTAs one
operation per head GPU (nHeads = GPUs per node): each loop moves nHeads x chunk per channel, and enqueue.cc's
`calcCollChunking` gives nLoops = ceil(bytes / (channels x nHeads x chunk)) with its NVLS-Tree chunk ladder. A
chunk goes: NVLS reduce in the node (`multimem.ld_reduce`: every GPU's NVLink up carries its copy of every
operation's chunk), up the tree of nodes and back down (connect.cc: channel c runs tree c % 2 of NCCL's double
binary tree of nodes, so a tree has half the channels), then NVLS multicast (`multimem.st`: every GPU's NVLink
down carries every chunk).

With nLoops > 1 the stages overlap and share their links and CTAs; `pipeline.fill_us` charges that pipelined fill
(NCCL's rate per operation), which the two-host tables of #309 meet from four chunks per operation. With
nLoops = 1 (two hosts: 4 and 8 MiB) the single chunk has each resource to itself:
- NVLS reduce and multicast: bytes / (NVLink x nvlsEfficiency) each;
- each network hop: the chunks of one tree's channels that cross the head's NIC at once, over the NIC: an edge into
  (or out of) a parent with k children in that tree carries k x channels / 2 chunks; the critical path is the
  deepest leaf's, up then down.
The bytes-over-bandwidth term already counts one chunk interval, so the fill is the crossing less that.
"""

from __future__ import annotations

import math

from phantora.collectives.layout import children_of, dbt_parents
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.channels import nvls_heads
from phantora.collectives.nccl.chunking import chunk_bytes
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings


def loops(p: Platform, st: NcclSettings, nbytes: int, channels: int) -> int:
    """NCCL's nLoops: the chunks each (channel, head) operation moves, one after another."""
    ops = max(1, channels * nvls_heads(p))
    chunk = chunk_bytes("nvls_tree", "Simple", p, st, nbytes, ops)
    return max(1, math.ceil(nbytes / (ops * chunk)))


def path_shares(nnodes: int) -> int:
    """Network hops of the deepest chunk, each counted as the chunks-per-tree-channel its busiest NIC carries at
    once (a parent with k children: k): the maximum over both trees and every node of 2 x sum over its path to the
    root of the parent's children. Two nodes: 2; four: 2 x (2 + 1) = 6; eight: 2 x (2 + 2 + 1) = 10."""
    if nnodes < 2:
        return 0
    worst = 0
    for which in (0, 1):
        parent = dbt_parents(nnodes, which)
        kids = children_of(parent)
        for u in range(nnodes):
            units, v = 0, u
            while (q := parent[v]) is not None:
                units += len(kids[q])
                v = q
            worst = max(worst, 2 * units)
    return worst


def single_chunk_us(p: Platform, nbytes: int, channels: int) -> float:
    """Time (µs) of one chunk per operation (each operation's share of `nbytes`) crossing NVLS reduce, the tree of
    nodes and NVLS multicast alone."""
    ops = max(1, channels * nvls_heads(p))
    chunk = math.ceil(nbytes / ops)
    nvls = p.nvls_gpu_bw * T.NVLS_EFFICIENCY[p.arch] * 1000.0  # bytes per µs of one GPU's NVLink, NVLS
    nic = p.nic_bw * min(1.0, p.nics_per_node / max(1, p.ppn)) * 1000.0  # bytes per µs of a head GPU's NIC
    intra = 2 * ops * chunk / nvls if nvls > 0 else 0.0
    hops = path_shares(p.nnodes) * math.ceil(channels / 2) * chunk / nic if nic > 0 else 0.0
    return intra + hops


def fill_us(p: Platform, st: NcclSettings, nbytes: int, channels: int, algbw: float, pipelined: float) -> float:
    """NVLS-Tree's fill (µs): `pipelined` (pipeline.fill_us) from two chunks per operation; with one, the chunk's
    own crossing less the one chunk interval that bytes over `algbw` (GB/s) already counts (never above
    `pipelined`)."""
    if nbytes <= 0 or algbw <= 0 or loops(p, st, nbytes, channels) > 1:
        return pipelined
    crossing = single_chunk_us(p, nbytes, channels) - nbytes / (1000.0 * algbw)
    return min(pipelined, max(0.0, crossing))
