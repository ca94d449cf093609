"""The in-process workload replay's NCCL groups of transfers (an all_to_all with `splits`), rated as the bridge rates
them.

Through the bridge (`phantora.egraph.replay_rank`) each pair of a group starts at the later of its two ranks' issues
and the coordinator rates it, at that start, with the group's pairs it knows then (`bridge/p2p_batch.py`): those
whose ranks had run on to issue them (docs/egraph.md "NCCL groups of transfers"). The in-process replay is one static
flow DAG, so a pair's rating is fixed before the run: here a run's times give each pair its start and what the
coordinator would know then, and the workload is planned again with those ratings until they no longer change (a
group's issues depend only on earlier ops, so each run settles at least the next group: at most one run a group
more). What a replay rank joins before each issue is found by running `ReplayRank` itself against the run's
completions (`_Timeline`), and the knowledge rule is `LaunchGroups`'s, so both paths answer alike. Against a bridge
run in window mode (`window_ns`) the rule is its rounds': a rank woken by a completion at c runs on from the end of
c's window (where the coordinator stops the network to answer it), by a deadline d from the first window end at or
after d - W, and a pair knows the pairs whose later end ran on from the same window end or an earlier one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from phantora.p2p_knowledge import Grouped, LaunchGroups, Transfer
from phantora.replay_ranks import ReplayRank
from phantora.workload import Workload

Ratings = dict[str, Grouped]  # a group transfer's op name -> its pairs known and their starts, as the bridge rates it


def grouped_ops(wl: Workload) -> list[str]:
    """The ops that are transfers of an NCCL group (an all_to_all with `splits`)."""
    return [op.name for op in wl.ops if op.group and op.coll.comm]


def planned(wl: Workload) -> Ratings:
    """The ratings the workload's group transfers carry now (the pairs sorted, as `ratings_of` gives them)."""
    out = {}
    for op in wl.ops:
        if op.group and op.coll.comm:
            inflight, at = op.coll.relative()
            out[op.name] = Grouped(op.coll.comm, tuple(sorted(inflight)), tuple(sorted(at)))
    return out


def rated(wl: Workload, ratings: Ratings) -> Workload:
    """The workload with its group transfers rated so: each pair on the group's `LaunchGroup` (one object for the
    pairs rated with the group so known), alone without one."""
    ops = [
        dataclasses.replace(
            op, coll=dataclasses.replace(op.coll, inflight=(), inflight_at=(), launch=g.launch, launch_op=g.op)
        )
        if (g := ratings.get(op.name)) is not None
        else op
        for op in wl.ops
    ]
    return dataclasses.replace(wl, ops=ops)


def ratings_of(wl: Workload, starts: dict[str, int], done: dict[str, dict[int, int]], window_ns: int = 0) -> Ratings:
    """Each group transfer's rating from a run's times: `starts` (op -> its start ns) and `done` (op -> rank -> when
    that rank's part ended). Each pair is known to the coordinator from the later of its two ranks' last joins before
    issuing it, as a replay rank joins completions (`ReplayRank.run`); with `window_ns`, in the round its later end's
    rank ran on in."""
    names = set(grouped_ops(wl))
    members = sorted({r for op in wl.ops if op.name in names for r in op.coll.ranks})
    joined: dict[int, dict[str, int]] = {}
    released: dict[int, dict[str, int]] = {}
    launch: dict[int, dict[str, int]] = {}
    for r in members:
        rank = ReplayRank(wl, r)
        timeline = _Timeline({op.name: done[op.name][r] for op in rank.ops}, window_ns)
        rank.run(timeline)
        joined[r], released[r], launch[r] = timeline.joined_at, timeline.released_at, rank.launch
    transfers: dict[str, Transfer] = {}
    seq = ReplayRank(wl, members[0]).seq if members else {}
    for op in wl.ops:
        if op.name in names:
            src, dst = op.coll.ranks
            ends = ((src, launch[src][op.group]), (dst, launch[dst][op.group]))
            known = max(joined[src][op.name], joined[dst][op.name])
            key = (src, dst, 0, seq[op.name])
            release = max(released[src][op.name], released[dst][op.name]) if window_ns else None
            transfers[op.name] = Transfer(key, ends, op.coll.comm, starts[op.name], known, op.coll.nbytes, release)
    groups = LaunchGroups(list(transfers.values()))
    return {name: _of(groups, t) for name, t in transfers.items()}


def _of(groups: LaunchGroups, t: Transfer) -> Grouped:
    g = groups.of(t.key)
    assert g is not None  # every transfer given is in a group
    return g


class _Timeline:
    """A replay rank's coordinator, answered from a finished run: each of its ops completes at the run's time for
    this rank; it notes, for each op issued, the latest time the rank was woken before (a completion it waited for,
    or the deadline of a wait that saw none): from then on it runs on and issues, as a live replay rank does. With
    `window`, also the window end the rank ran on from (`released_at`: the coordinator's round, `RankClient.
    released_ns`)."""

    def __init__(self, done: dict[str, int], window: int = 0) -> None:
        self._done = done
        self._window = window
        self._names: list[str] = []
        self._clock = 0
        self._woken = 0
        self._released = 0
        self.joined_at: dict[str, int] = {}
        self.released_at: dict[str, int] = {}

    @property
    def clock(self) -> int:
        return self._clock

    def p2p_group(self, comm: Sequence[int] | None) -> None:
        return None

    def p2p(self, *, name: str, t_issue_ns: int, **_: Any) -> int:
        return self._issue(name, t_issue_ns)

    def collective(self, *, name: str, t_issue_ns: int, **_: Any) -> int:
        return self._issue(name, t_issue_ns)

    def _issue(self, name: str, t: int) -> int:
        self.joined_at[name] = self._woken
        self.released_at[name] = self._released
        self._clock = max(self._clock, t)
        self._names.append(name)
        return len(self._names) - 1

    def wait_any(self, handles: Sequence[int], until_ns: int | None = None) -> tuple[int, int] | None:
        t, h = min((self._done[self._names[h]], h) for h in handles)
        w = self._window
        if until_ns is not None and t > until_ns:
            self._woken, self._clock = max(self._woken, until_ns), max(self._clock, until_ns)
            if w:  # answered once the network is within a window of the deadline: the first window end there
                self._released = max(self._released, -(-(until_ns - w) // w) * w)
            return None
        self._woken, self._clock = max(self._woken, t), max(self._clock, t)
        if w:  # answered where the coordinator stops the network after the completion: the end of its window
            self._released = max(self._released, t - t % w + w)
        return h, t

    def wait(self, handle: int) -> int:
        got = self.wait_any([handle])
        assert got is not None
        return got[1]
