"""Real mode's gloo sends and receives on a pair not yet connected run off the rank's thread, in order by peer.

gloo connects a pair at its first exchange (gloo_store.py), and its first `send` or `recv` on a pair blocks the
caller until the peer makes its own first call there. A rank calls gloo as it issues the transfer, so a rank whose
peer had not reached its matching call stood still in gloo, its clock no longer reported, and a peer waiting for a
simulated collective that needed that clock waited for ever: torchtitan's pipeline warm-up vote, sent by the first
stage while the last stage's ranks were still in their data-parallel all-reduce, hung the run (NCCL enqueues a send
on its stream and returns). So a pair's calls run on a thread of its own (its lane: gloo matches one pair's
transfers in order) until one has returned, when the pair is connected and later calls go direct; the rank waits
for a call only when it waits for the transfer, which the coordinator ends once both ranks have issued it.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any


class LaneCall:
    """One gloo call on a pair's lane: its work, once the call has returned."""

    def __init__(self, peer: int, call: Callable[[], Any], timeout_s: float, name: str = "") -> None:
        self.peer = peer
        self._name = name or f"rank {peer}"  # how the timeout names the peer
        self._call: Callable[[], Any] | None = call
        self._timeout_s = timeout_s
        self._work: Any = None
        self._error: BaseException | None = None
        self._done = threading.Event()

    def run(self) -> bool:
        """Make the call (the lane's thread); True if it returned. Whatever it raises is kept for `wait` (gloo's
        RuntimeError for a connect that timed out, or any other): a lane's thread that died with it would leave
        the rank waiting out the group's timeout and the pair's later calls queued behind it for ever."""
        call, self._call = self._call, None
        assert call is not None
        try:
            self._work = call()
        except BaseException as exc:  # noqa: BLE001 - raised to the rank by `wait`
            self._error = exc.with_traceback(None)
        finally:
            self._done.set()
        return self._error is None

    def wait(self) -> bool:
        """Wait for the call to have returned, then for its gloo work (the rank's thread, or SendCopies')."""
        if not self._done.wait(self._timeout_s):
            raise RuntimeError(f"phantora: gloo did not connect the pair with {self._name} in {self._timeout_s} s")
        if self._error is not None:
            raise self._error
        work, self._work = self._work, None
        return bool(work.wait()) if work is not None else True


class PairLanes:
    """The gloo sends and receives of one group, by peer (the group rank gloo knows it by); `ranks`, the group's
    global ranks, name a peer in the timeout's message (its global rank, then its group rank)."""

    def __init__(self, timeout_s: float, ranks: tuple[int, ...] = ()) -> None:
        self._timeout_s = timeout_s
        self._ranks = ranks
        self._lock = threading.Lock()
        self._connected: set[int] = set()
        self._lanes: dict[int, collections.deque[LaneCall]] = {}

    def start(self, peer: int, call: Callable[[], Any]) -> Any:
        """`call()`'s gloo work: made now if the pair with `peer` is connected and nothing waits on its lane, else
        a `LaneCall` queued on the lane, whose `wait` waits for the call and then its work."""
        with self._lock:
            queue = self._lanes.get(peer)
            if queue is None and peer in self._connected:
                item = None
            else:
                name = f"rank {self._ranks[peer]} (group rank {peer})" if peer < len(self._ranks) else ""
                item = LaneCall(peer, call, self._timeout_s, name)
                if queue is None:
                    queue = self._lanes[peer] = collections.deque()
                    threading.Thread(target=self._drain, args=(peer,), name="phantora-gloo-lane", daemon=True).start()
                queue.append(item)
        return call() if item is None else item

    def _drain(self, peer: int) -> None:
        """The lane's thread: make its calls in order; end when none is left (the pair is then connected)."""
        while True:
            with self._lock:
                queue = self._lanes[peer]
                if not queue:
                    del self._lanes[peer]
                    return
                item = queue[0]
            returned = item.run()
            with self._lock:
                queue.popleft()
                if returned:
                    self._connected.add(peer)
