"""The host's cost of an NCCL call that NCCL discards because it is empty (count 0), and which calls NCCL discards.

From v2.20.3-1 NCCL drops a collective of count 0 before it makes a task (enqueue.cc: `taskAppend`, "Empty
collectives can be discarded", v2.29.7-1): no plan, no kernel, no proxy op. The call still runs its host path:
ncclEnqueueCheck's CommCheck, ncclGroupStartInternal, ncclCommEnsureReady, ArgsCheck, then
ncclGroupEndInternal, which with no communicator joined has nothing to launch. Before 2.20 an empty collective
became a task and a kernel (v2.19.3-1 only skips its proxy ops). ncclSend / ncclRecv of count 0 are never dropped:
a p2p call synchronises its peers, so nccl-tests' send/recv groups (sendrecv_perf, hypercube_perf, alltoall_perf
before NCCL 2.28, gather_perf and scatter_perf before 2.28) launch even at count 0. ncclAlltoAll, ncclGather and
ncclScatter (2.28+) drop a count of 0 with the other collectives.

The cost of one GPU's empty call comes from one published run: Together's `-g 8` H100 node (NCCL 2.26.2, the
node whose launches fit host_launch.py), whose all_gather_perf and reduce_scatter_perf rows of count 0 (ring and
NCCL's choice, both column groups: 32 figures, docs/nccl-tests.md "Empty calls") have a median of 0.93 µs for
the thread's 8 calls: 0.116 µs a call. The figure holds the thread's group bracket and the loop's final stream
sync over 20 iterations too, which one host's `-g 8` cannot separate from the calls. It is the host's CPU, and
other hosts differ by about 2x either way (held out: the same docs section).
"""

from __future__ import annotations

EMPTY_CALL_US = 0.93 / 8  # one GPU's empty call on Together's H100 host (median 0.93 µs for its -g 8)
DISCARD_FROM = (2, 20)  # v2.20.3-1: taskAppend returns on count 0 for every collective
COLL_API_FROM = (2, 28)  # ncclAlltoAll / ncclGather / ncclScatter: before, nccl-tests runs send/recv groups
ALWAYS_COLLECTIVE = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
COLLECTIVE_FROM_228 = ("all_to_all", "gather", "scatter")


def discards_empty(kind: str, version: tuple[int, int]) -> bool:
    """Whether NCCL `version` drops nccl-tests' call of `kind` at count 0 before launching anything (else it
    launches: a send/recv group, or a collective before 2.20)."""
    if version < DISCARD_FROM:
        return False
    if kind in ALWAYS_COLLECTIVE:
        return True
    return kind in COLLECTIVE_FROM_228 and version >= COLL_API_FROM


def empty_ns_per_call(gpus_per_thread: int) -> int:
    """Host time (ns) one thread spends on one empty call of each of its `gpus_per_thread` GPUs."""
    if gpus_per_thread < 1:
        raise ValueError(f"GPUs per thread must be >= 1, got {gpus_per_thread}")
    return round(EMPTY_CALL_US * 1000 * gpus_per_thread)
