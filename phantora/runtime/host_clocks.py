"""Each host thread's simulated time, and the order it gives their GPU work: the same run after run (per rank).

The program's thread's host time is the session's host clock (`RankSession.host_ns`: its host ops, NCCL launches
and waits). A thread the program started (gpu_threads.py) has a host time of its own: from the later of the
compute lane's time and the program's host time when it was started (a thread's start: its starter's time), it
runs on by the thread's host ops (timed by the host model, as the program's `host_work`) and by the launch
overhead of each kernel it launches (`launch_ns`); its kernel starts no earlier than that time
(RankSession.charge_on).

The host's scheduler must not decide what runs first on the simulated GPU, so the threads take turns in simulated
time, a conservative barrier: a thread's GPU work (a kernel, an event's record or wait) goes on only when every
other live thread that could still launch something has a later host time, or the same and was started before it
(the program's thread first of all). The program's thread never waits at an op (its compiled entry,
simcuda/_fastop.c, stays as it is): it waits where its host time moves on (`moved`: a host op, a synchronise, an
NCCL launch, a join), until every other thread has caught up with it.

A thread blocked in a wait the program makes holds no one up: `Thread.join`; a `threading.Condition` wait, so an
`Event`, a `queue.Queue`, a `concurrent.futures` result; a `queue.SimpleQueue` made from then on, so a
`ThreadPoolExecutor`'s idle workers; a `multiprocessing` queue's `get`, so a DataLoader's pin-memory thread. One
woken by another's notify carries that one's host time on (a join, the joined thread's; any other wake, at least
the program's). A thread that waits where phantora does not see it (a bare lock, a socket, a sleep loop polling
a flag) would hold the others up for ever: after `STALL_S` of real time in which nothing moved it is passed over
until it next moves, and the rank says so once on its stderr (the order of that GPU work is then the host's).

A thread's NCCL collectives are GPU work too (session.py `_thread_issue`): issued in its turn, so a communicator's
calls take their sequence numbers in the same order run after run; from the first thread on, the rank's calls to
the coordinator go one at a time (`LockedClient`). A thread learning when its collective completes (session.py
`_thread_learn`) holds no one up and holds the client for one bounded wait at a time: the network runs no further
than the earliest time another running thread of the rank can still call at (`floor`), so the program's next call
is neither held behind the wait nor stamped late (a wait on another communicator that needs it completes).
"""

from __future__ import annotations

import multiprocessing.queues
import os
import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from bridge.client import WaitTimedOut
from phantora.runtime.lane_marks import LaneMarks

STALL_S = 2.0  # real seconds a thread may hold the others up without a move before it is passed over

_ORIG: dict[str, Any] = {}  # the patched functions as the process had them
_current: HostClocks | None = None  # the rank's, once a thread was adopted


@dataclass
class Part:
    """A host thread in the barrier: its place in the order of starts (0: the program's) and its host time."""

    order: int
    h: int
    name: str
    ident: int | None = None
    blocked: int = 0  # depth of the waits it is in
    stalled: bool = False  # passed over until it moves again
    done: bool = False


class HostClocks:
    """The rank's host threads in simulated time (see the module docstring)."""

    def __init__(self, session: Any, mode: Any) -> None:
        self.session = session
        self.pid = os.getpid()  # a process the rank forks (a DataLoader worker) has none of its threads
        self.mode = mode  # the ChargeMode, whose op lock the program's thread lets go of while it waits
        self.main = Part(0, 0, "the program's thread", session.thread)
        self.parts: dict[int, Part] = {}  # ident -> part, once its thread runs
        self.live: list[Part] = []  # the threads started and not ended, in the order of their starts
        self._orders = 0
        self._cv = threading.Condition(threading.Lock())
        self._moves = 0  # bumped at every change (a stall is a wait through which nothing moved)
        self._warned = False
        self.marks = LaneMarks(session.clock, lambda: int(session.host_ns), self._least_h)

    # ----- whose time is what
    def part_of(self, ident: int) -> Part | None:
        """The calling thread's part: the program's, an adopted thread's, else None (phantora's own threads)."""
        if ident == self.main.ident:
            return self.main
        return self.parts.get(ident)

    def _h(self, p: Part) -> int:
        return int(self.session.host_ns) if p is self.main else p.h

    def _active(self, p: Part) -> bool:
        return not (p.done or p.blocked or p.stalled)

    # ----- threads come and go
    def register(self, name: str, starter: Part | None, floor_ns: int) -> Part:
        """A thread is being started (by `starter`): it counts from now, from `floor_ns` or its starter's time."""
        with self._cv:
            self._orders += 1
            h = max(floor_ns, self._h(starter)) if starter is not None else floor_ns
            p = Part(self._orders, h, name)
            if not self.live:  # the first to live (again): the lanes' work so far was launched before it
                self.marks.reset()
            self.live.append(p)
            self.session.host_clocks = self
            if not isinstance(self.session.client, LockedClient):  # its collectives talk to the coordinator too
                self.session.client = LockedClient(self.session.client)
            self._moved()
            return p

    def bind(self, p: Part) -> None:
        """`p`'s thread runs (on the calling thread)."""
        with self._cv:
            p.ident = threading.get_ident()
            self.parts[p.ident] = p

    def end(self, p: Part) -> None:
        """`p`'s thread ends: it holds no one up any more."""
        with self._cv:
            p.done = True
            if p in self.live:
                self.live.remove(p)
            if p.ident is not None:
                self.parts.pop(p.ident, None)
            if not self.live:
                self.session.host_clocks = None
            self._moved()

    # ----- a thread's time runs on
    def spend(self, p: Part, ns: int) -> None:
        """`p`'s host spent `ns` (a host op, a launch)."""
        if ns > 0:
            with self._cv:
                p.h += ns
                p.stalled = False
                self._moved()

    def turn(self, p: Part) -> None:
        """Wait until `p` is the earliest of the threads that could launch GPU work (its GPU work goes on then)."""
        if p is self.main:
            return
        with self._cv:
            p.stalled = False
            self._wait_until(lambda: [q for q in self._everyone() if q is not p and self._before(q, p)])

    def floor(self, p: Part) -> int | None:
        """The earliest time at which a running thread of the rank other than `p` can still call the coordinator (the
        program's thread: its compute lane, where its calls are stamped; another: its host time), None if none runs
        (every other one waits, ended or was passed over)."""
        with self._cv:
            others = [q for q in self._everyone() if q is not p and self._active(q)]
            return min((self.session.clock.compute_ns if q is self.main else q.h for q in others), default=None)

    def idle(self, p: Part, quiet_since: float) -> None:
        """`p` waits for another thread to move (20 ms of real time at most); after `STALL_S` since `quiet_since`
        the running ones are passed over until they move (they wait where phantora does not see it)."""
        with self._cv:
            _ORIG.get("wait", threading.Condition.wait)(self._cv, 0.02)
            if time.monotonic() - quiet_since > STALL_S:
                ahead = [q for q in self._everyone() if q is not p and self._active(q)]
                for q in ahead:
                    q.stalled = True
                if ahead:
                    self._say_stalled(ahead)

    def resume(self, p: Part) -> None:
        """`p` is back from a wait on the device (a collective's completion learned): its host time stays."""
        with self._cv:
            if p.blocked:
                p.blocked -= 1
            p.stalled = False
            self._moved()

    def turn_outside_ops(self, p: Part) -> None:
        """`turn`, unless the calling thread is inside an op of its own (a functional collective), which took its
        turn before it took the rank's op lock (waiting again there would hold the program's next op up)."""
        if self.mode._holder != threading.get_ident():
            self.turn(p)

    def moved(self) -> None:
        """The program's thread's host time moved on: wait until every other thread has caught up with it."""
        main = self.main
        if threading.get_ident() != main.ident:
            return
        with self.mode.ops_released(), self._cv:  # in an op of its own: the others' ops run meanwhile
            main.stalled = False
            self._moved()
            self._wait_until(lambda: [q for q in self.live if self._before(q, main)])

    def _least_h(self) -> int | None:
        """The least host time of a live thread (where a synchronise may still ask from), None if none lives."""
        return min((q.h for q in list(self.live)), default=None)

    def _everyone(self) -> list[Part]:
        return [self.main, *self.live]

    def _before(self, q: Part, p: Part) -> bool:
        """Could active `q` still launch before `p` (an earlier host time, or the same and started before)?"""
        return self._active(q) and (self._h(q), q.order) < (self._h(p), p.order)

    def _moved(self) -> None:
        self._moves += 1
        self._cv.notify_all()

    def _wait_until(self, blockers: Any) -> None:
        """Under `_cv`: wait while `blockers()` names threads; pass over those that do not move for STALL_S."""
        wait = _ORIG.get("wait", threading.Condition.wait)
        while True:
            ahead = blockers()
            if not ahead:
                return
            seen = self._moves
            wait(self._cv, STALL_S)
            if self._moves == seen:  # nothing moved: they wait where phantora does not see it
                for q in ahead:
                    q.stalled = True
                self._say_stalled(ahead)

    def _say_stalled(self, ahead: list[Part]) -> None:
        if self._warned:
            return
        self._warned = True
        names = ", ".join(q.name for q in ahead)
        print(
            f"phantora: rank {self.session.rank}: {names} did not move for {STALL_S:g} s of real time (a wait "
            "phantora does not see: a bare lock, a socket); the order of threads' GPU work is the host's from there",
            file=sys.stderr,
            flush=True,
        )

    # ----- waits the program makes
    def block(self, p: Part, cond: Any = None) -> None:
        with self._cv:
            p.blocked += 1
            if cond is not None:
                waiters = cond.__dict__.setdefault("_phantora_waiters", deque())
                waiters.append(p)
            self._moved()

    def unblock(self, p: Part, h_ns: int | None = None) -> None:
        """`p` returns from a wait no thread of the rank ended (a timeout, another process's data, a join); its host
        time is at least `h_ns` then (the thread it joined), and a thread's at least the program's (which did not
        wait for it meanwhile)."""
        with self._cv:
            if p.blocked:
                p.blocked -= 1
            if p is not self.main:
                self._raise(p, self._h(self.main))
            if h_ns is not None:
                self._raise(p, h_ns)
            p.stalled = False
            self._moved()

    def notified(self, cond: Any, n: int, notifier: Part | None) -> None:
        """`notifier` wakes `n` waiters of `cond` (the first to wait first, as `threading.Condition`): they run
        from now, at its host time or later (a wait it ends is over in simulated time too)."""
        waiters = cond.__dict__.get("_phantora_waiters")
        if not waiters:
            return
        with self._cv:
            h = self._h(notifier) if notifier is not None else None
            for _ in range(min(n, len(waiters))):
                q = waiters.popleft()
                if q.blocked:
                    q.blocked -= 1
                if h is not None:
                    self._raise(q, h)
                q.stalled = False
            self._moved()

    def _raise(self, p: Part, h_ns: int) -> None:
        if p is self.main:
            if h_ns > self.session.host_ns:
                self.marks.main_moves()
            self.session.host_ns = max(self.session.host_ns, h_ns)
        else:
            p.h = max(p.h, h_ns)


class LockedClient:
    """The rank's coordinator client once threads issue collectives too: one call at a time (its socket is not
    thread-safe, and its protocol takes one request in flight); every other attribute is the client's."""

    def __init__(self, client: Any) -> None:
        object.__setattr__(self, "_client", client)
        object.__setattr__(self, "_lock", threading.RLock())

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._client, name)
        if not callable(value) or name.startswith("__"):
            return value
        lock = self._lock

        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return value(*args, **kwargs)

        return locked

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._client, name, value)

    def wait_within(self, handle: int, floor: int | None, deadline: float | None = None) -> int | None:
        """A thread's wait for `handle`: its t_done if known or learned, the network let run no further than `floor`
        (None: as far as it takes); None if the network got to `floor` first (or is there already). `deadline`: the
        wait's wall-clock end (`time.monotonic()`), past which WaitTimedOut, as `RankClient.wait`'s."""
        with self._lock:
            client = self._client
            t = client.known(handle)
            if t is not None:
                return int(t)
            if floor is None:
                return int(client.wait(handle, deadline))
            if floor <= client.clock:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimedOut(f"rank {client.rank}: a thread's wait passed its timeout")
                return None
            got = client.wait_any([handle], until_ns=floor, deadline=deadline)
            return None if got is None else int(got[1])


def current() -> HostClocks | None:
    return _current


def ensure(session: Any, mode: Any) -> HostClocks:
    """The rank's clocks, made at the first thread adopted (the waits are watched from then on)."""
    global _current
    if _current is None or _current.session is not session:
        _current = HostClocks(session, mode)
        watch_waits()
    return _current


def _mine() -> tuple[HostClocks, Part] | None:
    c = _current
    if c is None or c.session.host_clocks is None or c.pid != os.getpid():
        return None
    p = c.part_of(threading.get_ident())
    return None if p is None or p.done else (c, p)


def watch_waits() -> None:
    """From now on (before the program makes its queues), tell the clocks when a thread of theirs waits (the
    module docstring's list; a `time.sleep` is the thread's host running on: it holds the others up)."""
    if _ORIG:
        return
    _ORIG.update(wait=threading.Condition.wait, notify=threading.Condition.notify, join=threading.Thread.join)
    wait, notify, join = _ORIG["wait"], _ORIG["notify"], _ORIG["join"]

    def watched_wait(cond: threading.Condition, timeout: float | None = None) -> bool:
        mine = _mine()
        if mine is None:
            return wait(cond, timeout)
        c, p = mine
        c.block(p, cond)
        try:
            return wait(cond, timeout)
        finally:
            waiters = cond.__dict__.get("_phantora_waiters")
            if waiters is not None and p in waiters:  # not notified (a timeout): it leaves the queue here
                waiters.remove(p)
                c.unblock(p)
            if p is c.main:
                c.moved()

    def watched_notify(cond: threading.Condition, n: int = 1) -> None:
        c = _current
        if c is not None and cond.__dict__.get("_phantora_waiters") and c.pid == os.getpid():
            c.notified(cond, n, c.part_of(threading.get_ident()))
        notify(cond, n)

    def watched_join(thread: threading.Thread, timeout: float | None = None) -> None:
        mine = _mine()
        if mine is None or thread is threading.current_thread():
            return join(thread, timeout)
        c, p = mine
        c.block(p)
        try:
            join(thread, timeout)
        finally:
            ended = getattr(thread, "_phantora_part", None)
            c.unblock(p, ended.h if ended is not None and not thread.is_alive() else None)
            if p is c.main:
                c.moved()

    class WatchedSimpleQueue(queue.SimpleQueue):  # type: ignore[type-arg]
        """`queue.SimpleQueue` (a `ThreadPoolExecutor`'s work queue): a blocking `get` is a wait, a `put` wakes."""

        def get(self, block: bool = True, timeout: float | None = None) -> Any:
            mine = _mine() if block else None
            if mine is None:
                return super().get(block, timeout)
            c, p = mine
            c.block(p, self)
            try:
                return super().get(block, timeout)
            finally:
                waiters = self.__dict__.get("_phantora_waiters")
                if waiters is not None and p in waiters:
                    waiters.remove(p)
                    c.unblock(p)
                if p is c.main:
                    c.moved()

        def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
            c = _current
            if c is not None and self.__dict__.get("_phantora_waiters") and c.pid == os.getpid():
                c.notified(self, 1, c.part_of(threading.get_ident()))
            super().put(item, block, timeout)

    mp_get = multiprocessing.queues.Queue.get

    def watched_mp_get(q: Any, block: bool = True, timeout: float | None = None) -> Any:
        mine = _mine() if block else None
        if mine is None:
            return mp_get(q, block, timeout)
        c, p = mine
        c.block(p)  # another process's data (a DataLoader worker's batch): no thread of the rank ends it
        try:
            return mp_get(q, block, timeout)
        finally:
            c.unblock(p)
            if p is c.main:
                c.moved()

    _ORIG.update(simple_queue=queue.SimpleQueue, mp_get=mp_get)
    queue.SimpleQueue = WatchedSimpleQueue  # type: ignore[misc]
    multiprocessing.queues.Queue.get = watched_mp_get  # type: ignore[method-assign,assignment]
    threading.Condition.wait = watched_wait  # type: ignore[method-assign,assignment]
    threading.Condition.notify = watched_notify  # type: ignore[method-assign,assignment]
    threading.Thread.join = watched_join  # type: ignore[method-assign,assignment]
