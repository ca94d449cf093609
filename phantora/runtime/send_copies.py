"""Real data: the copies of lone sends handed off before their receive, each freed once its receive has taken it.

NCCL's send kernel leaves a handed-off send's bytes in its connection's fixed slots, so the caller may overwrite its
tensor at once and the GPU spends no memory per send. Real-data mode moves the bytes over gloo, which reads a send's
tensor only once its receiver's recv is posted, so a send handed off before its receive is issued moves a copy
(`RankSession.issue_p2p`). `SendCopies` holds those copies' gloo sends: a thread per lane (communicator, peer and
tag: gloo matches one lane's sends in order) waits for each in turn and drops it, and with it the copy, as soon as
the receiver has taken the bytes, whatever the program does with its work object. gloo's `is_completed` stays
False until someone waits, and a wait that times out breaks the pair, hence the threads (`Work.wait` releases the
GIL). `held_bytes` counts the copies still alive (a running total each copy's finaliser takes its bytes from), so it
measures memory, not bookkeeping; a send's record goes once its copies are taken (kept for `wait` only if gloo
raised), so a program that never waits its sends keeps none.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

import torch


class _Copy:
    """One send's gloo works, until its receiver has taken them."""

    def __init__(self, ident: int, works: list[Any]) -> None:
        self.ident = ident
        self.works = works
        self.done = threading.Event()
        self.error: BaseException | None = None

    def take(self) -> None:
        """Wait until the receiver has taken every copy (gloo's own timeout bounds it), then drop them."""
        try:
            for work in self.works:
                work.wait()
        except BaseException as exc:  # noqa: BLE001 - gloo's, or a lane's (gloo_lanes.py): `SendCopies.wait` raises it
            self.error = exc.with_traceback(None)  # (its frames would keep the work, and the copy, alive)
        finally:
            self.works = []
            self.done.set()  # also on an error: a waiter, and the lane's later copies, are never left behind


class SendCopies:
    """The copied sends of one rank not yet known taken, by the id the caller gives each (`add`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lanes: dict[Hashable, collections.deque[_Copy]] = {}
        self._by_id: dict[int, _Copy] = {}  # not yet taken, or taken with gloo's error (until `wait`)
        self._bytes_lock = threading.Lock()  # held only to count: a copy freed under `_lock` cannot wait on it
        self._held = 0
        self.peak_bytes = 0  # the most copy bytes alive at once, read as each copy is added

    @staticmethod
    def clone(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The copies a send moves instead of `tensors` (NCCL's kernel copies them into its slots)."""
        return [t.detach().clone() for t in tensors]

    def add(self, ident: int, lane: Hashable, works: list[Any], copies: Sequence[torch.Tensor]) -> None:
        """Hold send `ident`'s gloo `works`, which move `copies`, until its receiver has taken them; `lane`: the
        sends gloo matches in order with it (its communicator, peer and tag). The caller keeps no copy."""
        nbytes = 0
        for t in copies:
            n = t.numel() * t.element_size()
            nbytes += n
            weakref.finalize(t, self._freed, n).atexit = False
        item = _Copy(ident, works)
        with self._lock:
            self._by_id[ident] = item
            queue = self._lanes.get(lane)
            start = queue is None
            if queue is None:
                queue = self._lanes[lane] = collections.deque()
            queue.append(item)
        with self._bytes_lock:
            self._held += nbytes
            self.peak_bytes = max(self.peak_bytes, self._held)
        if start:
            threading.Thread(target=self._drain, args=(lane,), name="phantora-send-copies", daemon=True).start()

    def _freed(self, nbytes: int) -> None:
        """A copy's finaliser: its bytes are no longer alive."""
        with self._bytes_lock:
            self._held -= nbytes

    def _drain(self, lane: Hashable) -> None:
        """The lane's thread: take its copies in order, each send's record gone once taken (kept for `wait` if gloo
        raised); end when none is left (the next `add` starts another)."""
        while True:
            with self._lock:
                queue = self._lanes[lane]
                if not queue:
                    del self._lanes[lane]
                    return
                item = queue[0]
            item.take()
            with self._lock:
                queue.popleft()
                if item.error is None:
                    self._by_id.pop(item.ident, None)

    def wait(self, ident: int) -> None:
        """Block until send `ident`'s receiver has taken its copy (nothing to wait for if it was not copied, or is
        taken already); raise what gloo raised."""
        with self._lock:
            item = self._by_id.pop(ident, None)
        if item is None:
            return
        item.done.wait()
        if item.error is not None:
            raise item.error

    def held_bytes(self) -> int:
        """The bytes of the copies still alive."""
        return self._held

    def records(self) -> int:
        """The sends whose records are kept: not yet taken, or taken with an error not yet raised by `wait`."""
        with self._lock:
            return len(self._by_id)
