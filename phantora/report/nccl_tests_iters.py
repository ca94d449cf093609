"""nccl-tests' -I (per-iteration timing) and -C (CPU time) figures, from the simulated loop.

nccl-tests (src/common.cu, BenchTime) records a CUDA event on each GPU's stream before each iteration's launches
and one after the last (with -z 3 a start and a stop event around each iteration), and reports each iteration's
elapsed time over its -m calls; its summary (util.cu, computeIterStats) is min, max, p50, p95, p99 (nearest rank),
mean and the population standard deviation of the iterations after the first -K. Its -C time is the host's wall
time from the launch loop's start to its end (before it waits for the GPUs), over iterations x calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def event_intervals(gpu_ns: Sequence[int], launch_ns: int, blocking: bool) -> list[int]:
    """Each iteration's time between its CUDA events (ns, all of its -m calls). The host launches iteration i from
    i x launch_ns to (i + 1) x launch_ns and records its event just before, so the event runs on the stream at
    max(i x launch_ns, the previous iteration's end); the last event runs when the last iteration ends. `blocking`
    (-z 1, 2, 3): the host waits for each iteration, so its events bracket its launch and its GPU time."""
    if blocking:
        return [launch_ns + g for g in gpu_ns]
    events = [0]
    end = 0
    for i, g in enumerate(gpu_ns):
        if i:
            events.append(max(i * launch_ns, end))
        end = max((i + 1) * launch_ns, end) + g
    events.append(end)
    return [b - a for a, b in zip(events, events[1:], strict=False)]


def cpu_time_ns(iter_ns: Sequence[int], launch_ns: int, blocking: bool) -> int:
    """The host's time in the timed loop (ns, every iteration): under -z 0 its launches alone (it does not wait for
    the GPUs inside the loop); blocking (-z 1, 2, 3) it waits for each call, so the loop holds every iteration."""
    return sum(iter_ns) if blocking else launch_ns * len(iter_ns)


@dataclass(frozen=True)
class IterStats:
    """computeIterStats' figures, in the unit of its input."""

    min: float
    max: float
    avg: float
    p50: float
    p95: float
    p99: float
    stdev: float

    @property
    def cv_pct(self) -> float:
        return self.stdev / self.avg * 100.0 if self.avg > 0 else 0.0


def percentile_index(n: int, percentile: int) -> int:
    """nccl-tests' nearest-rank index: min(n - 1, ceil(n x p / 100) - 1)."""
    return min(n - 1, (n * percentile + 99) // 100 - 1)


def iter_stats(times: Sequence[float]) -> IterStats:
    """The summary of `times` as util.cu's computeIterStats computes it (p50 is the upper median)."""
    s = sorted(times)
    n = len(s)
    if n == 0:
        raise ValueError("no iterations to summarise")
    avg = sum(s) / n
    stdev = math.sqrt(sum((t - avg) ** 2 for t in s) / n)
    return IterStats(s[0], s[-1], avg, s[n // 2], s[percentile_index(n, 95)], s[percentile_index(n, 99)], stdev)
