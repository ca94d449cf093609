"""Several equal p2p calls in one NCCL group (nccl-tests' `-m N` of alltoall_perf and sendrecv_perf).

At ncclGroupEnd NCCL plans a rank's p2p tasks round by round (enqueue.cc `scheduleP2pTasksToPlan`, v2.19.4-1 ..
v2.30.7-1): each pass over the rounds takes the head of each peer's send and receive queue, and the passes go on
until every queue is empty. So the N transfers to one peer are N operations on that round's channels, one after
another: each cut into channel parts by its own bytes and run with the protocol of its own bytes
(`addP2pToPlan`), all in one plan (one kernel launch) while the plan's budget lasts. A group of N calls is thus
one launch (the protocol's base latency once), then N operations per peer: each one step over its link, its
proxy ops across nodes, and its bytes at one call's rate.
"""

from __future__ import annotations

import dataclasses

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.coll_group import MAX_CALLS
from phantora.collectives.nccl.tuning import Choice
from phantora.errors import InputError


def grouped_calls(one: Choice, calls: int) -> Choice:
    """The choice of `calls` equal p2p calls in one NCCL group, from `one` (a call's choice alone): the launch
    (`BASE_LAT` of its protocol) once, the rest of its latency (a step over the link, the proxy's ops) and its
    bandwidth time once per call; its channels, protocol, rates and algorithm bandwidth are one call's. More than
    `coll_group.MAX_CALLS` calls (where NCCL's plan budget would start another launch) are refused."""
    if calls < 2:
        return one
    if calls > MAX_CALLS:
        raise InputError(
            f"{calls} p2p calls in one NCCL group: more than {MAX_CALLS} (one launch) are not modelled", field="-m"
        )
    launch = T.BASE_LAT["ring"][T.PROTOCOLS.index(one.protocol)]
    per_op = max(0.0, one.lat_us - launch)
    lat = launch + calls * per_op
    return dataclasses.replace(one, lat_us=lat, time_us=lat + calls * (one.time_us - one.lat_us), works=calls)
