"""The host launch of a live rank's NCCL calls: on by default, `PHANTORA_NCCL_HOST_LAUNCH=off` opts out.

Each NCCL launch (a lone call, or one NCCL group at its ncclGroupEnd: a coalescing block, a batch of sends and
receives) costs the rank's host the launch of one GPU's call (collectives/nccl/host_launch.py, fitted on
nccl-tests), on a host clock of its own (`RankSession.host_ns`): it runs on from the host's last launch, or from
where the host last waited (a device synchronise, a barrier or another wait that blocks the host, a checkpoint
file's I/O), and the call is issued, its kernel starting, no earlier than the host has launched it; a compute lane
behind the host moves up to it (an idle GPU). So N calls from an idle GPU end at max(N h + g, h + N g), as
nccl-tests' loop without -G (report/nccl_tests_iters.py), and a GPU busy past the host hides the launch. Compute
kernels keep their own launch overhead on the compute lane (compute.py), inside their time: the host clock does
not count it again, nor a wait on a collective (a stream wait). The rank does not know NCCL's channel count when it
issues a call (the coordinator chooses), so it is charged the owner's fallback, DEFAULT_BATCHES work batches.
Opted out ("off" or "0"), a call costs the host nothing and a loop of calls runs as nccl-tests `-G 1` (CUDA
graph); unset, empty, "on" or "1": charged.
"""

from __future__ import annotations

import functools
import os

from phantora.collectives.nccl.host_launch import host_launch_us, work_batches
from phantora.errors import InputError

ENV = "PHANTORA_NCCL_HOST_LAUNCH"


@functools.cache
def enabled() -> bool:
    """Whether the host launch is charged: on unless `PHANTORA_NCCL_HOST_LAUNCH` opts out; a one-line error for a
    value other than on/off."""
    v = os.environ.get(ENV, "").strip().lower()
    if v in ("off", "0"):
        return False
    if v in ("", "on", "1"):
        return True
    raise InputError(f"{ENV}={v!r}: expected on or off", field=ENV)


def launch_ns() -> int:
    """The host time (ns) of one NCCL launch on one GPU (0 when opted out): host_launch.py's per-call part plus
    its per-batch part for the owner's fallback count of work batches (the channels are the coordinator's choice)."""
    if not enabled():
        return 0
    return round(host_launch_us(work_batches("all_reduce", None, 0)) * 1000)
