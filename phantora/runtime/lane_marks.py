"""Which host time launched the work on each lane of the simulated GPU, while threads the program started live.

A CUDA device synchronise waits for the work launched before it, not for work launched after it by another host
thread. The rank's host threads run in simulated time (host_clocks.py), but the program's thread runs ahead of a
thread that waits for its collective (that one holds no one up), so a lane may hold work launched at a later host
time than a thread's synchronise. `LaneMarks` keeps, for each lane (clock.py: 0 the compute lane, else a thread's
side stream), the marks (host time of a launch, the lane's end after it) in the order the work went on the lane, and
answers a synchronise at host time h with the end of the last work launched at h or before on each lane (a lane runs
its work in order, so that end is the latest of theirs).

The program's thread's kernels go on the compute lane from its compiled entry (simcuda/_fastop.c), unseen here: all
of them between two moves of its host time are launched at that time, so the session marks the compute lane's end
at the program's host time before that time moves on (`main_moves`), and before another thread's work goes on the
compute lane (`before`). A side lane's end moved without a mark (by a thread phantora did not start) is taken in
whole, as before these marks.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Callable, Iterable
from typing import Any

PRUNE_AT = 64  # marks on a lane before those no live thread can ask about are dropped


class LaneMarks:
    """Per lane, the host times of launches and the lane's end after each (see the module docstring)."""

    def __init__(self, clock: Any, main_h: Callable[[], int], floor_h: Callable[[], int | None]) -> None:
        self.clock = clock  # the rank's VirtualClock
        self.main_h = main_h  # the program's thread's host time now
        self.floor_h = floor_h  # the least host time a live thread may synchronise at (None: none lives)
        self._lock = threading.Lock()
        self._hs: dict[int, list[int]] = {}
        self._ends: dict[int, list[int]] = {}
        self._seen: dict[int, int] = {}  # each lane's end at its last mark
        self._dropped: dict[int, int] = {}  # each lane's end at its latest mark pruned (taken where none is earlier)
        self.reset()

    def reset(self) -> None:
        """Everything on the lanes now was launched before any live thread's host time (its first start)."""
        with self._lock:
            self._hs.clear()
            self._ends.clear()
            self._seen.clear()
            self._dropped.clear()
            for lane in self._lanes():
                self._mark(lane, -1, self.clock.lane_now(lane))

    def main_moves(self) -> None:
        """The program's thread's host time is about to move on (or another thread asks): the compute lane's work
        since its last mark was launched at the program's present host time."""
        with self._lock:
            self._main_tail()

    def before(self, lane: int) -> None:
        """A thread other than the program's is about to put work on `lane`."""
        if lane == 0:
            self.main_moves()

    def after(self, lane: int, h: int | None) -> None:
        """Work launched at host time `h` (None: the program's thread's, now) went on `lane`."""
        if lane == 0 and h is None:
            return  # the program's: its tail, marked when its host time moves
        with self._lock:
            self._mark(lane, self.main_h() if h is None else h, self.clock.lane_now(lane))

    def upto(self, h: int, lanes: Iterable[int] | None = None) -> int:
        """The latest end, over the lanes (or over `lanes`: a stream's synchronise), of the work launched at host
        time `h` or before. A stream with no side lane runs on the compute lane (clock.py)."""
        with self._lock:
            self._main_tail()
            end = 0
            for lane in self._lanes() if lanes is None else {x if x in self.clock.lanes else 0 for x in lanes}:
                now = self.clock.lane_now(lane)
                if lane and now != self._seen.get(lane):  # moved where no launch was marked: all of it
                    end = max(end, now)
                    continue
                hs = self._hs.get(lane, [])
                i = bisect_right(hs, h) - 1
                end = max(end, self._ends[lane][i] if i >= 0 else self._dropped.get(lane, 0))
            return end

    def _lanes(self) -> Iterable[int]:
        return [0, *self.clock.lanes]

    def _main_tail(self) -> None:
        end = self.clock.compute_ns
        if end != self._seen.get(0):
            self._mark(0, self.main_h(), end)

    def _mark(self, lane: int, h: int, end: int) -> None:
        """Under the lock: a launch at `h` leaves `lane` ending at `end`. A mark at `h` or later before it is dropped
        (whoever asks at or after its time also waits for this one, which ends no earlier)."""
        hs = self._hs.setdefault(lane, [])
        ends = self._ends.setdefault(lane, [])
        while hs and hs[-1] >= h:
            hs.pop()
            ends.pop()
        hs.append(h)
        ends.append(max(end, ends[-1]) if ends else end)
        self._seen[lane] = end
        if len(hs) > PRUNE_AT:
            floor = self.floor_h()
            if floor is not None:
                keep = max(bisect_right(hs, floor) - 1, 0)  # the last mark at or before the floor, and later ones
                if keep:
                    self._dropped[lane] = ends[keep - 1]
                    del hs[:keep], ends[:keep]
