"""An opt-in host launch for a live rank's NCCL calls: `PHANTORA_NCCL_HOST_LAUNCH=on`.

By default a live collective or send/recv costs its rank's CPU nothing: a loop of calls runs as nccl-tests `-G 1`
(CUDA graph, no launch between calls). Opted in, each NCCL launch (a lone call, or one NCCL group at its
ncclGroupEnd: a coalescing block, a batch of sends and receives) costs the rank's host the launch of one GPU's call
(collectives/nccl/host_launch.py, fitted on nccl-tests), on a host clock of its own (`RankSession.host_ns`): it runs
on from the host's last launch, or from the last device synchronise (where the host waited for the GPU), and the
call is issued, its kernel starting, no earlier than the host has launched it; a compute lane behind the host moves
up to it (an idle GPU). So N calls from an idle GPU end at max(N h + g, h + N g), as nccl-tests' loop without -G
(report/nccl_tests_iters.py), and a GPU busy past the host hides the launch. Compute kernels keep their own launch
on the compute lane (compute.py); the host clock does not follow them, nor a wait on a collective (a stream wait).
The rank does not know NCCL's channel count when it issues a call (the coordinator chooses), so it is charged the
owner's fallback, DEFAULT_BATCHES work batches. Unset, empty or "off": no cost.
"""

from __future__ import annotations

import functools
import os

from phantora.collectives.nccl.host_launch import host_launch_us, work_batches
from phantora.errors import InputError

ENV = "PHANTORA_NCCL_HOST_LAUNCH"


@functools.cache
def enabled() -> bool:
    """Whether `PHANTORA_NCCL_HOST_LAUNCH` opts in; a one-line error for a value other than on/off."""
    v = os.environ.get(ENV, "").strip().lower()
    if v in ("", "off", "0"):
        return False
    if v in ("on", "1"):
        return True
    raise InputError(f"{ENV}={v!r}: expected on or off", field=ENV)


def launch_ns() -> int:
    """The host time (ns) of one NCCL launch on one GPU when opted in (else 0): host_launch.py's per-call part plus
    its per-batch part for the owner's fallback count of work batches (the channels are the coordinator's choice)."""
    if not enabled():
        return 0
    return round(host_launch_us(work_batches("all_reduce", None, 0)) * 1000)
