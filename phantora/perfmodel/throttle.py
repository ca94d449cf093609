"""A throttled GPU (scenario `gpu_slow`): compute runs `factor` times slower inside a time window.

`Throttles.stretch(rank, start_ns, work_ns)` is how long `work_ns` of full-speed compute takes on that rank
when it starts at `start_ns`: the work is done at speed 1/factor inside each window and at full speed outside,
so an op that straddles a window's edge is stretched only for the part inside. Overlapping windows of one rank
multiply their factors.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Throttle:
    """Rank `rank` computes `factor` times slower in [start_ns, end_ns) (end None: to the end of the run)."""

    rank: int
    start_ns: int
    end_ns: int | None
    factor: float


class Throttles:
    """The throttle windows of a run, by rank."""

    def __init__(self, windows: Iterable[Throttle]) -> None:
        self.by_rank: dict[int, list[Throttle]] = {}
        for w in windows:
            self.by_rank.setdefault(w.rank, []).append(w)

    def __bool__(self) -> bool:
        return bool(self.by_rank)

    def factor_at(self, rank: int, t_ns: int) -> float:
        """The slowdown of `rank` at `t_ns` (1.0 outside every window)."""
        f = 1.0
        for w in self.by_rank.get(rank, ()):
            if w.start_ns <= t_ns and (w.end_ns is None or t_ns < w.end_ns):
                f *= w.factor
        return f

    def stretch(self, rank: int, start_ns: int, work_ns: int) -> int:
        """Wall (simulated) ns that `work_ns` of full-speed compute takes from `start_ns` (rounded up)."""
        windows = self.by_rank.get(rank)
        if not windows or work_ns <= 0:
            return work_ns
        edges = sorted({e for w in windows for e in (w.start_ns, w.end_ns) if e is not None and e > start_ns})
        t, left = float(start_ns), float(work_ns)
        for edge in [*edges, None]:
            f = self.factor_at(rank, int(t))
            if edge is None or left * f <= edge - t:
                return math.ceil(t + left * f - 1e-9) - start_ns
            left -= (edge - t) / f
            t = float(edge)
        raise AssertionError("unreachable")
