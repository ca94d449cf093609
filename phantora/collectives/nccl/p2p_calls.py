"""Several equal p2p calls in one NCCL group (nccl-tests' `-m N` of alltoall_perf and sendrecv_perf).

At ncclGroupEnd NCCL plans a rank's p2p tasks round by round (enqueue.cc `scheduleP2pTasksToPlan`, v2.19.4-1 ..
v2.30.7-1): each pass over the rounds takes the head of each peer's send and receive queue, and the passes go on
until every queue is empty. So the N transfers to one peer are N operations on that round's channels, one after
another: each cut into channel parts by its own bytes and run with the protocol of its own bytes
(`addP2pToPlan`), in one plan (one kernel launch) while the plan's budget lasts (from 2.22 the kernel's arguments,
p2p_plans.py; before, half the work FIFO, fifo_budget.py), each further plan one more launch after the one before.
A plan is thus one launch (the protocol's base latency), then each peer's operations in it: each one step over its
link, its proxy ops across nodes, and its bytes at one call's rate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.tuning import Choice


def grouped_calls(one: Choice, calls: int, plans: Sequence[int] = ()) -> Choice:
    """The choice of `calls` equal p2p calls in one NCCL group, from `one` (a call's choice alone): per plan the
    launch (`BASE_LAT` of its protocol) once and the rest of its latency (a step over the link, the proxy's ops) per
    call it holds; the bandwidth time once per call; its channels, protocol, rates and algorithm bandwidth are one
    call's. `plans`: the calls each plan holds (`p2p_plans.calls_per_plan` from 2.22, `fifo_budget.p2p_plans`
    before; a pass cut between two plans counts in both, its extra operation's bytes time as latency: the flows
    carry `calls` calls' bytes); () for one plan."""
    if calls < 2:
        return one
    ops = sum(plans) if plans else calls
    launch = T.BASE_LAT["ring"][T.PROTOCOLS.index(one.protocol)]
    per_op = max(0.0, one.lat_us - launch)
    bw = one.time_us - one.lat_us
    lat = launch * max(1, len(plans)) + ops * per_op + (ops - calls) * bw
    return dataclasses.replace(one, lat_us=lat, time_us=lat + calls * bw, works=calls, plans=max(1, len(plans)))
