"""A pair's several operations in one NCCL group, run in turn as NCCL's passes over its peers' queues run them
(enqueue.cc `scheduleP2pTasksToPlan`, v2.19.4-1 .. v2.30.7-1; `LaunchGroup.later`).

Operation k is rated in pass k's group (every pair's k-th operation, `LaunchGroup.passes`) on its own bytes'
protocol and channels; its bytes start one step of its protocol (its latency less the launch's base latency) after
operation k - 1's bytes end, at the earliest at its own start plus its latency: one launch, then each operation's
step and bytes. The same on NVLink hosts, across nodes, on a described PCIe host and between SHM pairs of NCCL
nodes; only how a pass is rated differs (`rate`). From 2.22 an operation NCCL's plan budget puts in a later plan
than the pair's operation before it (p2p_plans.py) waits for that one's bytes and a launch a plan more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from phantora.collectives.launch_group import LaunchGroup
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.tuning import Choice
from phantora.collectives.spec import Collective

# (k, pass k's group, operation k's start ns, its bytes) -> its choice as if it started then
Rate = Callable[[int, LaunchGroup, int, int], Choice]


def in_turn(coll: Collective, rate: Rate, plans: Sequence[int] = ()) -> Choice:
    """The choice of `coll`, operation `coll.launch_op` of its pair in its launch group (`coll.in_flight`), its
    latency from its own start to where its bytes start after the operations before it. `plans`: the NCCL plan of
    each of the pair's operations (p2p_plans.pair_plans; () for one plan): an operation in a later plan than the one
    before it starts after that one's bytes end, a launch a plan (its protocol's base latency) and its step."""
    g = coll.in_flight
    assert g is not None
    ops = g.ops((coll.ranks[0], coll.ranks[1]))
    begin = end = 0.0  # ns: where the bytes of the operation before begin and end
    got: Choice | None = None
    for k in range(coll.launch_op + 1):
        t, nbytes = ops[k]
        got = rate(k, g.passes(k), t, nbytes)
        begin = t + got.lat_us * 1000.0
        if k:
            launch = T.BASE_LAT["ring"][T.PROTOCOLS.index(got.protocol)]
            launches = plans[k] - plans[k - 1] if plans else 0
            begin = max(begin, end + (got.lat_us - launch + launches * launch) * 1000.0)
        end = begin + (got.time_us - got.lat_us) * 1000.0
    assert got is not None
    if coll.launch_op == 0:
        return got
    lat = (begin - ops[coll.launch_op][0]) / 1000.0
    return dataclasses.replace(got, lat_us=lat, time_us=lat + got.time_us - got.lat_us)


def as_pass(coll: Collective, g: LaunchGroup, nbytes: int) -> Collective:
    """`coll` as its pair's operation in pass group `g` (its first there), moving `nbytes`."""
    return dataclasses.replace(coll, nbytes=nbytes, launch=g, launch_op=0)
