"""`SendCopies` (phantora/runtime/send_copies.py) with many sends, on real gloo pairs (two process groups of one
process, one a thread): the copies alive are the sends not yet received, counted in O(1), and a send's record goes
once its receiver has taken it, whether or not the program ever waits for it.

Before, every record stayed until `wait` (a program that never waits its sends kept them all) and `held_bytes` summed
every record's weak references at each `add`.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from phantora.runtime.send_copies import SendCopies

FLOATS = 1024
NBYTES = 4 * FLOATS  # one send's copy


@pytest.fixture
def pair() -> list[dist.ProcessGroupGloo]:
    """Ranks 0 and 1 of one gloo group, both in this process (gloo's connect needs both at once: two threads)."""
    store = dist.HashStore()
    pgs: list[dist.ProcessGroupGloo] = []
    made: dict[int, dist.ProcessGroupGloo] = {}

    def make(rank: int) -> None:
        made[rank] = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=2))

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pgs = [made[0], made[1]]
    return pgs


def send(sc: SendCopies, pg: dist.ProcessGroupGloo, ident: int, value: float) -> None:
    """Rank 0's send `ident` of `value`s, handed off before its receive: a copy moves; the caller keeps none."""
    x = torch.full((FLOATS,), value)
    copies = SendCopies.clone([x])
    sc.add(ident, ("comm", 1, 0), [pg.send(copies, 1, 0)], copies)
    x.fill_(-1.0)  # the program reuses its tensor at once


def receive(pg: dist.ProcessGroupGloo) -> float:
    buf = torch.zeros(FLOATS)
    pg.recv([buf], 0, 0).wait()
    assert float(buf.min()) == float(buf.max())
    return float(buf[0])


def settled(sc: SendCopies) -> int:
    """held_bytes() once the lane thread has dropped what its receiver took (at most 10 s)."""
    end = time.monotonic() + 10
    while (sc.held_bytes() or sc.records()) and time.monotonic() < end:
        time.sleep(0.0005)
    return sc.held_bytes()


def test_many_sends_each_received_before_the_next_keep_one_copy_and_no_record(pair) -> None:
    """300 sends, each received before the next is issued, none ever waited: at most one copy alive (the peak is
    one send's bytes), none once each is received, and no record left (before: 300 records)."""
    sc = SendCopies()
    k = 300
    for i in range(k):
        send(sc, pair[0], i, float(i))
        assert sc.held_bytes() == NBYTES
        assert receive(pair[1]) == float(i)
        assert settled(sc) == 0 and sc.records() == 0
    assert sc.peak_bytes == NBYTES


def test_sends_ahead_of_their_receives_hold_every_copy_until_received(pair) -> None:
    """50 sends before any receive: 50 copies alive (the peak 50 x one send's bytes); each receive takes one, in
    order; then none is alive, no record is kept, and waiting any of them returns at once."""
    sc = SendCopies()
    k = 50
    for i in range(k):
        send(sc, pair[0], i, float(i))
        assert sc.held_bytes() == (i + 1) * NBYTES
    assert sc.records() == k and sc.peak_bytes == k * NBYTES
    assert [receive(pair[1]) for _ in range(k)] == [float(i) for i in range(k)]
    assert settled(sc) == 0 and sc.records() == 0
    for i in range(k):
        sc.wait(i)
    assert sc.peak_bytes == k * NBYTES


def test_a_send_gloo_gave_up_on_keeps_its_record_until_its_wait_raises(pair) -> None:
    """A send whose receive never comes: gloo's 2 s timeout ends it; its copy is freed then (the error kept without
    the frames that held its work), its record stays until the program's wait, which raises gloo's error, and then
    goes."""
    sc = SendCopies()
    send(sc, pair[0], 7, 1.0)
    end = time.monotonic() + 30
    while sc.held_bytes() and time.monotonic() < end:
        time.sleep(0.01)
    assert sc.held_bytes() == 0 and sc.records() == 1
    with pytest.raises(RuntimeError):
        sc.wait(7)
    assert sc.records() == 0


class Refused:
    """A send's work whose wait raises what is not gloo's RuntimeError: a lane's own (gloo_lanes.py keeps whatever its
    call raised, a TypeError of a wrong argument, say, for the rank's wait)."""

    def wait(self) -> bool:
        raise TypeError("send(): incompatible function arguments")


class Taken:
    def __init__(self) -> None:
        self.waited = threading.Event()

    def wait(self) -> bool:
        self.waited.set()
        return True


def test_a_send_whose_wait_raised_anything_raises_it_at_its_wait_and_the_lane_goes_on() -> None:
    """The program's wait raises the work's TypeError, and the next send on the lane is still taken. Before, only a
    RuntimeError was kept: the lane's thread died with anything else, so the wait blocked for ever (no timeout) and
    every later copy on that lane stayed alive."""
    sc, lane, later = SendCopies(), ("comm", 1, 0), Taken()
    sc.add(1, lane, [Refused()], SendCopies.clone([torch.ones(4)]))
    sc.add(2, lane, [later], SendCopies.clone([torch.ones(4)]))
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            sc.wait(1)
        except BaseException as exc:  # noqa: BLE001 - what the wait raised, checked below
            raised.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)  # a wait that never returns fails the test, not hangs it
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive() and [type(e) for e in raised] == [TypeError]
    assert later.waited.wait(10) and settled(sc) == 0 and sc.records() == 0
