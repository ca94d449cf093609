"""The tie-breaking rule of parallel packet simulation, checked against one engine's own order (issue 38).

ns-3 runs events in (time, uid) order and hands uids out in scheduling order. So of two events of the same
time, the first is the one scheduled first: the one whose *parent* (the event that scheduled it) ran first,
or, with the same parent, the one it scheduled first. A worker that simulates one group of a partition
(`phantora.netsim.partition`) knows the order of its own events; an event that arrives from another group (a
packet over a cut link) carries its ancestry: per ancestor its time, group and position in that group's order.
The rule, for two events of one group at the same time, walks up both ancestries while the times are equal:

- different times: the earlier ancestor ran first;
- both ancestors in one group: that group's order decides (the same event: the order it scheduled them in);
- an ancestor scheduled from outside the engine (the caller between runs: flow starts at T - 1): the caller
  runs at a ns boundary, after every event of its time t and before any later one, so it is a pseudo-event
  at (t, after all); two of those keep the caller's order ((T, flow id) in both runs).

`order_log` runs one engine with `PhantoraOrderLog` on; `check_rule` sorts each group's ties by the rule and
compares with the order one engine ran them in (docs/packet-model.md, "Parallel packet simulation").
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from phantora.netsim.partition import NO_GROUP

NO_CONTEXT = 0xFFFFFFFF
CALLER = -1  # parent of an event scheduled from outside the engine
DEEP = 8  # ancestry levels a cut-link message would carry explicitly


@dataclasses.dataclass
class OrderLog:
    """One engine's run: per event run, in order, its time, uid, context and the uids it handed out."""

    ts: list[int]
    uid: list[int]
    context: list[int]
    first: list[int]
    end: list[int]

    @classmethod
    def from_flat(cls, flat: Sequence[int]) -> OrderLog:
        """From PhantoraOrderLog::Take()'s five numbers per event."""
        return cls(*(list(flat[i::5]) for i in range(5)))

    def __len__(self) -> int:
        return len(self.ts)


@dataclasses.dataclass
class RuleCheck:
    """What `check_rule` found: events and tie runs per group, decisions by depth, and the mismatches."""

    events: int = 0
    ties: int = 0  # pairs of same-time events of one group compared
    by_depth: dict[int, int] = dataclasses.field(default_factory=dict)  # ancestry levels walked -> decisions
    cross: int = 0  # decisions that looked at an ancestor in another group
    deep_ends: dict[str, int] = dataclasses.field(default_factory=dict)  # walks past DEEP levels: how they ended
    mismatches: int = 0
    local_key_moves: int = 0  # events of tie runs the local key (`local_keys`) would run elsewhere in the run

    @property
    def max_depth(self) -> int:
        return max(self.by_depth, default=0)


def order_log(run: Any, runtime: Any) -> OrderLog:
    """Run `run()` (which drives an ns-3 engine of this process) with the order log on; the log."""
    runtime.cppyy.include("phantora-order-log.h")
    log = runtime.gbl.PhantoraOrderLog
    log.Start()
    try:
        run()
    finally:
        flat = log.Take()
    return OrderLog.from_flat(list(flat))


def check_rule(log: OrderLog, groups: Sequence[int]) -> RuleCheck:
    """Sort each group's same-time events by the rule, knowing only group-local orders and ancestries, and
    count where that differs from the order one engine ran them in."""
    n = len(log)
    parent, k = _parents(log)
    grp = [groups[c] if c != NO_CONTEXT and c < len(groups) else NO_GROUP for c in log.context]
    pos = [0] * n  # position in its group's order
    seen: dict[int, int] = {}
    for i in range(n):
        pos[i] = seen[grp[i]] = seen.get(grp[i], -1) + 1
    local = local_keys(log, parent, k)
    out = RuleCheck()
    cmp = functools.partial(_compare, log.ts, parent, k, grp, pos, out)
    by_group: dict[int, list[int]] = {}
    for i in range(n):
        if grp[i] != NO_GROUP:
            by_group.setdefault(grp[i], []).append(i)
    for members in by_group.values():
        out.events += len(members)
        start = 0
        while start < len(members):
            stop = start + 1
            while stop < len(members) and log.ts[members[stop]] == log.ts[members[start]]:
                stop += 1
            run = members[start:stop]
            if len(run) > 1:
                got = sorted(run, key=functools.cmp_to_key(cmp))
                out.mismatches += sum(a != b for a, b in zip(got, run, strict=True))
                alt = sorted(run, key=lambda i: local[i])
                out.local_key_moves += sum(a != b for a, b in zip(alt, run, strict=True))
            start = stop
    return out


def local_keys(log: OrderLog, parent: list[int], k: list[int]) -> list[tuple[int, int, int, int]]:
    """The alternative: a key each node computes alone, (time scheduled at, scheduling node, that node's count
    of events scheduled so far; the caller's: its order), so that no ancestry travels. It is another order of
    ties than ns-3's uids (one engine would have to run with it too); `check_rule` counts how many tie-run
    events it would place differently."""
    count: dict[int, int] = {}
    keys: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)] * len(log)
    for i in sorted(range(len(log)), key=log.uid.__getitem__):  # scheduling order
        p = parent[i]
        if p == CALLER:
            keys[i] = (k[i], 1 << 33, 0, log.uid[i])
            continue
        node = log.context[p]
        count[node] = count.get(node, -1) + 1
        keys[i] = (log.ts[p], node, count[node], 0)
    return keys


def _parents(log: OrderLog) -> tuple[list[int], list[int]]:
    """Per event: the event that scheduled it (CALLER, then `k` is the ts of the last event run before it was
    scheduled, -1 if none), and its rank among what its parent scheduled."""
    first = log.first
    parent, k = [], []
    for u in log.uid:
        j = bisect.bisect_right(first, u) - 1  # the last event that started handing out uids at or before u
        if j >= 0 and u < log.end[j]:
            parent.append(j)
            k.append(u - first[j])
        else:
            parent.append(CALLER)
            k.append(log.ts[j] if j >= 0 else -1)
    return parent, k


def _compare(
    ts: list[int], parent: list[int], k: list[int], grp: list[int], pos: list[int], out: RuleCheck, a: int, b: int
) -> int:
    """-1 if the rule runs a before b (same time, same group), 1 if after; records how deep it looked."""
    depth, cross = 0, False
    while True:
        pa, pb = parent[a], parent[b]
        if pa == CALLER or pb == CALLER:
            r, end = _caller_order(ts, parent, k, a, b), "caller"
            break
        if pa == pb:
            r, end = (-1 if k[a] < k[b] else 1), "same parent"
            break
        depth += 1
        if ts[pa] != ts[pb]:
            r, end = (-1 if ts[pa] < ts[pb] else 1), "time"
            cross = cross or grp[pa] != grp[pb]
            break
        if grp[pa] == grp[pb]:
            r, end = (-1 if pos[pa] < pos[pb] else 1), "group order"
            break
        cross = True
        a, b = pa, pb
    if depth > DEEP:
        out.deep_ends[end] = out.deep_ends.get(end, 0) + 1
    out.ties += 1
    out.by_depth[depth] = out.by_depth.get(depth, 0) + 1
    out.cross += cross
    return r


def _caller_order(ts: list[int], parent: list[int], k: list[int], a: int, b: int) -> int:
    """a or b was scheduled by the caller at a ns boundary after time k (its parent is CALLER): before every
    event whose parent ran later than k, after every one whose parent ran at k or before; callers in order
    (their uids: the caller's own order, (T, flow id), the same in every run)."""
    pa, pb = parent[a], parent[b]
    if pa == CALLER and pb == CALLER:
        return -1 if a < b else 1  # log order of two caller events of one time: the caller's order
    if pa == CALLER:
        return -1 if ts[pb] > k[a] else 1
    return 1 if ts[pa] > k[b] else -1


KEYED_NO_CONTEXT = 0xFFFFFFFE  # PhantoraOrderKey::kNoContext
KEYED_CALLER = 0xFFFFFFFF  # PhantoraOrderKey::kCaller


def keyed_mode_keys(log: OrderLog) -> list[tuple[int, int, int]]:
    """Per event of `log`, the order key the keyed mode (fabric Scheduler ns3::PhantoraKeyedScheduler) gives
    it, derived from the log alone: (time its parent ran, the parent's context, that context's count of events
    scheduled before it); events scheduled by a context-less event: node KEYED_NO_CONTEXT; by the caller
    between runs: (time of the last event run before, or 0, KEYED_CALLER, the caller's count). In the keyed
    mode, events of one time run in increasing key order."""
    parent, k = _parents(log)
    count: dict[int, int] = {}
    callers = 0
    keys: list[tuple[int, int, int]] = [(0, 0, 0)] * len(log)
    for i in sorted(range(len(log)), key=log.uid.__getitem__):  # scheduling order
        p = parent[i]
        if p == CALLER:
            keys[i] = (max(k[i], 0), KEYED_CALLER, callers)
            callers += 1
            continue
        node = KEYED_NO_CONTEXT if log.context[p] == NO_CONTEXT else log.context[p]
        count[node] = count.get(node, -1) + 1
        keys[i] = (log.ts[p], node, count[node])
    return keys


def keyed_order_breaks(log: OrderLog) -> tuple[int, int]:
    """(pairs of consecutive same-time events, those whose keyed-mode keys do not increase): 0 breaks when the
    log is a keyed-mode run."""
    keys = keyed_mode_keys(log)
    ties = breaks = 0
    for a in range(len(log) - 1):
        if log.ts[a] == log.ts[a + 1]:
            ties += 1
            breaks += not keys[a] < keys[a + 1]
    return ties, breaks
