"""The network crossings on a ring's longest chain of steps, which NCCL's latency undercounts.

A ring step waits for the step before it on the previous rank (all-reduce: each rank reduces what its
predecessor sent; all-gather and reduce-scatter: each forwards it), so a collective of one chunk per rank and
channel ends when the longest chain of `nsteps` consecutive hops around the ring has been crossed. NCCL lays a
node's GPUs out consecutively on each ring (graph/connect.cc), so every `ppn`-th hop leaves a node, and a window
of L consecutive hops holds at most ceil(L / ppn) of them. tuning.cc charges its network latency on
`2 (nNodes - 1)` steps of an all-reduce and `nNodes - 1` of an all-gather or reduce-scatter (the count of a ring
of one GPU per node) and its NVLink latency on the rest; with ppn >= 3 the longest chain crosses the network
2 nNodes and nNodes times, two (all-reduce) or one (the others) more than NCCL counts. Each such hop costs
NCCL's network hop instead of its NVLink hop; the tuner's choice keeps NCCL's count.
"""

from __future__ import annotations

import math

CHAIN_KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def nccl_inter_steps(kind: str, nnodes: int) -> int:
    """The ring steps tuning.cc charges at the network's latency (`nInterSteps`)."""
    if nnodes <= 1:
        return 0
    return 2 * (nnodes - 1) if kind == "all_reduce" else nnodes - 1


def net_crossings(nsteps: int, nnodes: int, ppn: int) -> int:
    """Network hops on the longest chain of `nsteps` consecutive ring hops over `nnodes` nodes of `ppn` GPUs."""
    if nnodes <= 1 or nsteps <= 0:
        return 0
    return math.ceil(nsteps / ppn)


def extra_us(kind: str, nsteps: int, nnodes: int, ppn: int, intra_us: float, inter_us: float) -> float:
    """Latency (µs) the longest chain adds over NCCL's ring latency: its network hops beyond NCCL's count, each at
    NCCL's network hop latency instead of the NVLink (or net-overhead) one it was charged."""
    if kind not in CHAIN_KINDS:
        return 0.0
    more = net_crossings(nsteps, nnodes, ppn) - nccl_inter_steps(kind, nnodes)
    return max(0, more) * max(0.0, inter_us - intra_us)
