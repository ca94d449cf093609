"""What the GPUs do for an NCCL call of count 0 that NCCL launches (read from NCCL's code, v2.19.3-1 and v2.22.3-1).

Which calls launch: a send or receive of count 0 always does. enqueue.cc's `taskAppend` makes it a p2p task like
any other ("Empty collectives do not make it to the proxy thread since they don't imply synchronization for the
user like p2p", v2.19.3-1). So do nccl-tests' groups of sends and receives: sendrecv_perf, hypercube_perf, and
alltoall_perf before NCCL 2.28 calls ncclAlltoAll (empty_call.COLL_API_FROM). A collective of count 0 launches
only before 2.20 (empty_call.DISCARD_FROM): it becomes a task and a kernel, with no proxy op.

What its kernel does:
- p2p: `addP2pToPlan` gives a transfer of 0 bytes one channel and one proxy step of 0 bytes, and picks LL where
  the connection has LL buffers (0 is under any threshold; the network's p2p connections have none by default:
  net.cc allocates them only with NCCL_ALLOC_P2P_NET_LL_BUFFERS). sendrecv.h's `runSend` / `runRecv` still call
  the primitive once (a do-while). Simple (prims_simple.h `genericOp`) runs an empty slice through `waitPeer` and
  `postPeer`: the receiver waits for the sender's step of size 0, which across nodes the proxies carry as a network
  message of 0 bytes (net.cc: isend / irecv / test as for any step, only the flush skipped for a total of 0). That
  is the model's p2p message: its whole latency (`Choice.lat_us`: the launch, one step over the link and, across
  nodes, the proxy's ops). LL (prims_ll.h `LLGenericOp`) with 0 elements stores and polls no line: the receiver
  waits for nothing, so the kernel is the launch alone (the protocol's base latency, no step).
- a collective before 2.20: the kernel's loop over the count (e.g. all_reduce.h `for (gridOffset = 0; gridOffset
  < size; ...)`) runs no iteration, so no step moves and no peer is waited for: the launch alone (the base latency
  of the algorithm and protocol NCCL's tuner picks for 0 bytes).
"""

from __future__ import annotations

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.empty_call import discards_empty
from phantora.collectives.nccl.tuning import Choice


def launches_empty(kind: str, version: tuple[int, int], alltoall_api: bool = False) -> bool:
    """Whether NCCL `version` launches a kernel for a call of `kind` of count 0 (`alltoall_api`: an all-to-all
    called as ncclAlltoAll, which from 2.28 is a collective)."""
    if kind == "all_to_all" and not alltoall_api:
        return True  # a group of sends and receives, launched at any version
    return not discards_empty(kind, version)  # send_recv: never discarded


def empty_latency_us(choice: Choice) -> float:
    """The GPU time (µs) of the kernel of an empty call NCCL launches, on NCCL's choice for it: a p2p transfer under
    Simple posts a step of size 0 its receiver waits for (the p2p message's latency); under LL, and a collective
    of count 0, no step moves (the protocol's base latency: the launch)."""
    if choice.algorithm == "p2p" and choice.protocol == "Simple":
        return choice.lat_us
    algorithm = "ring" if choice.algorithm == "p2p" else choice.algorithm  # p2p's launch is the ring's (p2p.py)
    if algorithm not in T.BASE_LAT:
        raise ValueError(f"no base latency for an empty call on algorithm {choice.algorithm!r}")
    return T.BASE_LAT[algorithm][T.PROTOCOLS.index(choice.protocol)]
