"""Complete rendezvous waiting to be launched, in a deterministic order (issue 39).

A rendezvous is complete when its last call arrives, and calls of different ranks arrive in whatever order the
operating system delivers them. Launching at that moment would give flow ids, ECMP keys and the engine's
order of same-time events by arrival, so two identical jobs could trade figures between runs. The
coordinator keeps complete rendezvous here and launches them by (start time, key) once no rendezvous that
sorts before them can still be completed (`bridge.core`'s `_launch_ready` says when).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection
from typing import Any

from bridge.matching import Rendezvous


class HeldRendezvous:
    """A heap of complete rendezvous keyed by (latest issue time, rendezvous key); keys are unique."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, tuple[Any, ...], Rendezvous]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, rv: Rendezvous) -> None:
        heapq.heappush(self._heap, (max(c.t for c in rv.calls.values()), rv.key, rv))

    def head_start(self) -> int | None:
        """The start time of the first rendezvous in launch order (None: nothing held)."""
        return self._heap[0][0] if self._heap else None

    def at(self, start: int) -> list[Rendezvous]:
        """The held rendezvous that start at `start`."""
        return [e[2] for e in self._heap if e[0] == start]

    def pop(self) -> Rendezvous:
        return heapq.heappop(self._heap)[2]

    def drop(self, ranks: Collection[int]) -> None:
        """Forget the rendezvous with a member in `ranks` (their job failed)."""
        mine = set(ranks)
        self._heap = [e for e in self._heap if not mine.intersection(e[2].members)]
        heapq.heapify(self._heap)
