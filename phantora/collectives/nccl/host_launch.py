"""The host time one nccl-tests thread spends on each GPU's call when it drives several GPUs (`-g N`).

ncclGroupEnd plans, enqueues and launches each GPU's kernel in turn on that thread. Part of the work is per call
(the plan, the streams' ordering, cudaLaunchKernelEx) and part is per channel the call runs on: NCCL's enqueue
builds one work batch and one proxy op for every channel of the task (enqueue.cc, `scheduleCollTasksToPlan`:
`for (int c=devWork->channelLo; c <= (int)devWork->channelHi; c++)` ... `addWorkBatchToPlan`, tag v2.26.2-1),
and `finishPlan` copies one `ncclDevWorkBatch` per channel into the kernel's arguments. A p2p call adds one work and
two proxy ops per peer and channel part (`addP2pToPlan`), but `addWorkBatchToPlan` puts up to 8 peers' works of other
rounds on one channel into one batch (NCCL_MAX_DEV_WORK_P2P_PER_BATCH): it is charged per peer and part, one unit
of the per-channel cost each, as the collective's fit cannot tell a batch from its work and proxy op.

Both costs come from one published run: Together's `-g 8` ring all-gather on 8 H100s (NCCL 2.26.2,
all_gather_ring.out in tests/data/nccl_tests/SOURCES.md), whose out-of-place times are flat where its GPUs are
idle most of the loop: 34.86 µs (mean) at 128 B-8 KiB, where NCCL runs one channel, and 41.50 µs at 1-4 MiB, on
24. Less the loop's tail (one GPU time over the 20 iterations: about 0.54 and 1.30 µs), that is 4.29 and 5.03 µs
per GPU's call: 32 ns per channel and 4.26 µs per call. The per-call part is the host's CPU and differs by host
(docs/validation.md, "Host launches"). Out of sample, the same node's other rows below 1 MiB (tests/data/nccl_small:
all-reduce, reduce-scatter, NCCL's own choice) check the floor (tests/test_host_launch.py).
"""

from __future__ import annotations

from typing import Any

HOST_LAUNCH_US = 4.26  # per GPU's call, besides its channels
HOST_CHANNEL_US = 0.032  # per work batch (a channel of a collective; a peer's channel part of a p2p call)
DEFAULT_BATCHES = 24  # when the call's channels are not known: NCCL's count on one 8-GPU host from about 1 MiB


def work_batches(kind: str, channels: int | None, nranks: int) -> int:
    """The units of per-channel host work of one GPU's call: one per channel of a collective (its work batch); for
    p2p one per channel part of each peer (its work and proxy ops; NCCL fuses up to 8 peers' works into one batch:
    all-to-all: nranks - 1 peers; send/recv: one). None: DEFAULT_BATCHES."""
    if channels is None:
        return DEFAULT_BATCHES
    if kind == "all_to_all":
        return max(1, channels) * max(1, nranks - 1)
    return max(1, channels)


def host_launch_us(batches: int) -> float:
    """Host time (µs) to enqueue and launch one GPU's call of `batches` work batches."""
    if batches < 0:
        raise ValueError(f"work batches must be >= 0, got {batches}")
    return HOST_LAUNCH_US + HOST_CHANNEL_US * batches


def host_ns_per_call(kind: str, choice: dict[str, Any] | None, nranks: int, gpus_per_thread: int) -> int:
    """Host time (ns) one thread spends per call launching its `gpus_per_thread` GPUs' calls, from the NCCL
    model's choice of the call (its "channels"; None or no channels: DEFAULT_BATCHES). A group NCCL 2.22+ cuts
    into several plans (the choice's "plans") launches a kernel for each: one more launch a plan."""
    channels = choice.get("channels") if choice else None
    batches = work_batches(kind, None if channels is None else int(channels), nranks)
    plans = int(choice.get("plans", 1)) if choice else 1
    return round((host_launch_us(batches) + HOST_LAUNCH_US * (plans - 1)) * 1000 * gpus_per_thread)
