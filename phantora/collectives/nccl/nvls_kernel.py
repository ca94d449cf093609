"""NVLS all-reduce inside one node at the rate its kernel runs, not the rate NCCL's tuner rates it at.

The NVLS all-reduce kernel (src/device/all_reduce.h, the NCCL_ALGO_NVLS specialisation of RunWorkColl) gives
each of the n GPUs one n-th of the buffer: it load-reduces that part through the switch (`multimem.ld_reduce`:
the switch reads the part from every GPU) and stores the sum back as a multicast (`multimem.st`: the switch writes
it to every GPU). Each GPU's NVLink therefore carries S + S/n in each direction, and the kernel runs at
NVLink x nvlsEfficiency x n / (n + 1). n is the heads (`channels.nvls_heads`: at most 32): on a larger NVLink
domain the heads' links carry S + S/32 and the other GPUs' S.

NCCL's tuner (tuning.cc) states the same bound per channel of its NVLS graph, but the graph search quantises the
per-channel speed to its candidate list (at most 60 GB/s on Hopper) and has one channel per GPU, so on 2 or 4 GPUs
it rates NVLS at 102 or 204 GB/s where the kernel, on its 16 CTAs (`nvlsChannels`, transport/nvls.cc), reaches
210 and 252. The tuner's rating still decides whether NVLS is chosen; this is the throughput once it runs.

The switch chips add the inputs (`nvls_switch.py`); on an NVLink domain of more than 8 GPUs their additions, not
the NVLinks, bound the kernel (a GB200 NVL72: 71 inputs an element over 18 chips).
"""

from __future__ import annotations

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.channels import nvls_heads
from phantora.collectives.nccl.nvls_switch import switch_bound_algbw
from phantora.collectives.nccl.platform import Platform


def nvls_kernel_algbw(kind: str, p: Platform) -> float:
    """Algorithm bandwidth (GB/s) of a one-node NVLS all-reduce kernel; 0 where this bound does not apply (other
    collectives, NVLS-Tree across nodes: NCCL's own rating is kept there)."""
    if kind != "all_reduce" or p.nnodes != 1 or p.ppn < 2:
        return 0.0
    n = nvls_heads(p)  # a head's NVLink carries S + S/heads; on more GPUs than heads the others carry S
    links = p.nvls_gpu_bw * T.NVLS_EFFICIENCY[p.arch] * n / (n + 1)
    switch = switch_bound_algbw(p)  # the switch chips' additions: binds only on domains of more than 8 GPUs
    return min(links, switch) if switch else links
