"""A wait given up past the program's wall-clock timeout (torch's `Work.wait(timeout)`): the coordinator's side of
`cancel` (no sockets). The rank runs again where the network is; an answer already sent stays the answer; a rank
that then leaves a call unjoined is named with the wait it gave up. Times: the ideal model's closed forms on a
100 Gb/s, 1 us star (tests/test_bridge_core.py)."""

from __future__ import annotations

import pytest

from bridge.core import RUN, WAIT
from bridge.errors import RunFailed
from tests.test_bridge_core import IDEAL, Harness, S, ring_allreduce_ns


def test_a_rank_that_gives_up_runs_again_where_the_network_is() -> None:
    """Rank 0 waits on A, which rank 1 has not issued; ranks 1 and 2 run B to its end meanwhile (every rank blocked:
    the network moves). Rank 0 gives up: it runs again at B's end, not at its own 0 ns, since the network's time
    passed there while it waited (a call it issued at 0 ns now would start before the network's time). A still
    completes once rank 1 issues it, at B's end plus A's closed form."""
    h = Harness(world=3, algo=IDEAL)
    one = ring_allreduce_ns(S, 2)
    a0 = h.coll(0, 0, group=(0, 1), seq=0)
    h.wait(0, 0, a0)
    b1, b2 = h.coll(1, 0, group=(1, 2)), h.coll(2, 0, group=(1, 2))
    h.wait(1, 0, b1)
    h.wait(2, 0, b2)
    h.core.progress()
    assert h.result(1)["t_done"] == h.result(2)["t_done"] == one
    assert h.core.ranks[0].state == WAIT and not h.sent[0]
    h.msg(0, "cancel", 0)
    h.core.progress()
    (got,) = h.sent[0]
    assert got.type == "cancelled" and got.t == one and got["now"] == one
    assert h.core.ranks[0].state == RUN and h.core.ranks[0].promise == one
    assert h.core.ranks[0].gave_up.startswith("gave up its wait on all_reduce(8388608 B) on group [0, 1] seq 0")
    h.msg(2, "finish", one, results={}, cpu_s=0.0)
    a1 = h.coll(1, one, group=(0, 1), seq=0)
    h.wait(1, one, a1)
    h.wait(0, one, a0)
    h.core.progress()
    assert h.result(0)["t_done"] == h.result(1)["t_done"] == 2 * one


def test_an_answer_that_crossed_the_cancel_stays_the_answer() -> None:
    """The coordinator answered rank 0's wait before its cancel arrived: the cancel changes nothing (the rank takes
    the answer, then `cancelled`), and nothing is said of a wait given up."""
    h = Harness(world=2, algo=IDEAL)
    one = ring_allreduce_ns(S, 2)
    for r in (0, 1):
        h.wait(r, 0, h.coll(r, 0, group=(0, 1)))
    h.core.progress()
    h.msg(0, "cancel", 0)
    assert [m.type for m in h.sent[0]] == ["result", "cancelled"]
    assert h.sent[0][0]["t_done"] == one and h.sent[0][1].t == one
    assert h.core.ranks[0].state == RUN and h.core.ranks[0].promise == one and not h.core.ranks[0].gave_up


def test_a_rank_that_gave_up_and_left_a_call_unjoined_is_named_with_its_wait() -> None:
    """Rank 0 gives up its wait on A, its communicator aborted (the runtime refuses its later calls on it), and
    finishes; rank 1 issued the group's next call: the missing participant is named, and why."""
    h = Harness(world=2, algo=IDEAL)
    a0 = h.coll(0, 0, group=(0, 1), seq=0)
    h.wait(0, 0, a0)
    h.msg(0, "cancel", 0)
    h.coll(1, 0, group=(0, 1), seq=0)
    h.coll(1, 0, group=(0, 1), seq=1)
    with pytest.raises(RunFailed) as err:
        h.msg(0, "finish", 0, results={}, cpu_s=0.0)
    text = err.value.text
    assert "missing participant: rank 0 finished" in text and "seq 1" in text
    assert "it gave up its wait on all_reduce(8388608 B) on group [0, 1] seq 0 at 0 ns" in text
    assert "Work.wait(timeout)" in text


def test_a_cancel_outside_a_wait_or_a_run_is_refused() -> None:
    """A rank blocked in a window barrier has no wait to give up: a protocol error naming it."""
    h = Harness(world=2, window_ns=10_000, algo=IDEAL)
    h.msg(0, "clock", 20_000, block=True)
    with pytest.raises(RunFailed) as err:
        h.msg(0, "cancel", 20_000)
    assert "rank 0 cancelled a wait while barrier" in err.value.text
