"""Stepped partition workers' reacting flows (issue 38): windows bounded by a flow the driver reacts to, and the
run stopped at its completion plus the driver's reaction (`phantora.netsim.cut_windows.run_windows`).

Two fake workers run the real window loop in two threads, exchanging their reports through a board; every
figure below follows from the event times, the lookahead and the bounds by hand.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from phantora.netsim.cut_windows import NEVER, REACT, PeerReport, WindowStats, run_windows

LOOKAHEAD = 1000
FLOW, REACTION = 7, 40
DONE_AT = 2350  # the flow completes in worker 1 (its receiver's) at its event of 2,350 ns


class ReactNet:
    """A worker's engine reduced to event times: the flows it completes (event ns -> flow) and the completion
    bounds of the flows it starts, as `CutReactBounds` reads them."""

    def __init__(self, events: list[int], completes: Mapping[int, int], starts: Mapping[int, int]) -> None:
        self.events = sorted(events)
        self.completes, self.starts = dict(completes), dict(starts)
        self.reacting: dict[int, int] = {}
        self.stop = -1
        self.ran: list[int] = []  # events run
        self.windows: list[int] = []  # window ends
        self.now = 0

    def NextEventTime(self) -> int:  # noqa: N802 - PhantoraNetwork's names
        return self.events[0] if self.events else -1

    def CutRunBefore(self, end: int) -> None:  # noqa: N802
        self.windows.append(end)
        while self.events and self.events[0] < end:
            t = self.now = self.events.pop(0)
            self.ran.append(t)
            flow = self.completes.get(t)
            if flow in self.reacting:
                done = t + self.reacting[flow]
                self.stop = done if self.stop < 0 else min(self.stop, done)

    def CutReacting(self, flat: list[int]) -> None:  # noqa: N802
        self.reacting = dict(zip(flat[0::2], flat[1::2], strict=True))
        self.stop = -1

    def CutReactBounds(self, floor_ns: int) -> list[int]:  # noqa: N802
        got = [max(lb, floor_ns) + self.reacting[f] for f, lb in self.starts.items() if f in self.reacting]
        return [min(got, default=-1), self.stop]

    def CutReleaseBounds(self, floor_ns: int) -> list[int]:  # noqa: N802
        return [-1, -1]

    def CutShareBounds(self, floor_ns: int) -> None:  # noqa: N802
        pass

    def CutTakeOutbox(self, group: int) -> bytes:  # noqa: N802
        return b""

    def CutTakeMinArrival(self) -> int:  # noqa: N802
        return -1

    def CutOutputBound(self) -> int:  # noqa: N802
        return 0  # no bound better than the lookahead

    def CutDeliver(self, batch: bytes) -> None:  # noqa: N802
        pass

    def CutAdvanceTo(self, ns: int) -> None:  # noqa: N802
        assert ns >= self.now and not (self.events and self.events[0] < ns), "a window ran past the stop"
        self.now = ns


class BoardPeers:
    """Two workers' exchange through a shared board: each posts its report for barrier `seq`, both wait, each
    reads the other's."""

    def __init__(self, board: dict[tuple[int, int], PeerReport], barrier: threading.Barrier, group: int) -> None:
        self.board, self.barrier, self.group = board, barrier, group

    def exchange(self, seq: int, next_ns: int, min_arrival: int, batches: Mapping[int, bytes],
                 releases: tuple[int, int] = (NEVER, NEVER), key: tuple[int, ...] = (),
                 sampling: tuple[int, int] = (NEVER, NEVER),
                 react: tuple[int, int] = (NEVER, NEVER), output: int = 0) -> list[PeerReport]:  # fmt: skip
        self.board[(seq, self.group)] = PeerReport(self.group, next_ns, min_arrival, b"", *releases, key, *sampling,
                                                   *react)  # fmt: skip
        self.barrier.wait(timeout=10)
        return [self.board[(seq, 1 - self.group)]]


def run_pair(bound: int, until: int | None) -> tuple[list[Any], list[ReactNet], list[WindowStats]]:
    """Worker 0 starts the flow (its completion bound: `bound`) and has events every 100 ns from 0; worker 1 has
    them every 100 ns from 50 and completes the flow at DONE_AT. Both run the windows to `until`, reacting to it."""
    nets = [ReactNet(list(range(0, 5001, 100)), {}, {FLOW: bound}),
            ReactNet(list(range(50, 5051, 100)), {DONE_AT: FLOW}, {})]  # fmt: skip
    board: dict[tuple[int, int], PeerReport] = {}
    barrier = threading.Barrier(2)
    stats = [WindowStats(), WindowStats()]
    got: list[Any] = [None, None]

    def work(g: int) -> None:
        nets[g].CutReacting([FLOW, REACTION])
        try:
            got[g] = run_windows(nets[g], BoardPeers(board, barrier, g), group=g, groups=2, lookahead_ns=LOOKAHEAD,
                                 until=until, stats=stats[g], reacting=True)  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            got[g] = exc
            barrier.abort()

    threads = [threading.Thread(target=work, args=(g,)) for g in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return got, nets, stats


def test_a_loose_bound_steps_the_tail_then_the_completion_stops_every_worker() -> None:
    """Bound 2,000 ns, completion at 2,350, reaction 40: two windows of the lookahead, one to the bound plus the
    reaction (2,000 to 2,041), then one ns at each event ns past it (2,050 ... 2,350) until the completion; every
    worker stops at 2,390 (the completion plus the reaction), no event past it run."""
    got, nets, stats = run_pair(bound=2000, until=None)
    stop = DONE_AT + REACTION
    assert got == [stop, stop]
    tail = [t + 1 for t in range(2050, DONE_AT + 1, 50)]
    assert nets[0].windows == nets[1].windows == [1000, 2000, 2041, *tail]
    assert nets[0].ran == list(range(0, 2301, 100)) and nets[1].ran == list(range(50, DONE_AT + 1, 100))
    assert nets[0].now == nets[1].now == stop
    assert stats[0].ended_by == {"lookahead": 2, REACT: 1 + len(tail)}


def test_a_tight_bound_runs_to_the_completion_in_one_window() -> None:
    """Bound 2,350 (the completion itself): the third window runs from 2,000 through 2,390 (the bound plus the
    reaction) in one go, the completion in it; the run stops at 2,390 with every event up to it run."""
    got, nets, stats = run_pair(bound=DONE_AT, until=None)
    stop = DONE_AT + REACTION
    assert got == [stop, stop]
    assert nets[0].windows == nets[1].windows == [1000, 2000, stop + 1]
    assert nets[0].ran == list(range(0, 2301, 100)) and nets[1].ran == list(range(50, DONE_AT + 1, 100))
    assert stats[1].ended_by == {"lookahead": 2, REACT: 1}


def test_no_completion_before_the_limit_runs_to_it() -> None:
    """A limit before the bound: the run ends at the limit (1,500: every event up to it), no stop."""
    got, nets, _ = run_pair(bound=2000, until=1500)
    assert got == [None, None]
    assert nets[0].windows == [1000, 1501] and nets[0].now == nets[1].now == 1500
    assert nets[1].ran == list(range(50, 1451, 100))


@pytest.mark.ns3
def test_partition_id_lists_name_the_param_and_the_word() -> None:
    """partition.Groups and partition.Idle parse one comma-separated id list (ParseIdList): a bad word is named
    with its param."""
    from phantora.netsim.packet import load_ns3

    net = load_ns3().ns.PhantoraNetwork()
    try:
        for key, value, want in (("partition.Groups", "0,1,x", "partition.Groups: 'x' is not a group number"),
                                 ("partition.Idle", "3,,4", "partition.Idle: '' is not a node id")):  # fmt: skip
            with pytest.raises(Exception, match=re.escape(want)):
                net.SetParam(key, value)
        net.SetParam("partition.Idle", "3,4")  # a good list is taken
    finally:
        net.Close()
