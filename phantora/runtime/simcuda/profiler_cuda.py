"""`torch.profiler` asked for CUDA activity on the simulated GPU: the CPU ops are profiled, the CUDA part is not.

This CPU build of torch has no CUPTI: a profiler started with `ProfilerActivity.CUDA` printed a C++ traceback
("Failed to record CUDA event. CUDA used in profiler but not enabled.") at every op of a simulated-GPU tensor, and
its CUDA columns stayed empty. `install()` drops CUDA from the activities a program asks for and says once that
the simulated GPU's kernels and collectives are in phantora's own trace (the run's trace.json), not torch's.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from torch.profiler import ProfilerActivity
from torch.profiler.profiler import _KinetoProfile

_told: list[bool] = []


def without_cuda(activities: Any) -> Any:
    """`activities` without CUDA (an activity, or a key of a dict item); None stays None (torch's default, which on
    this build is the CPU). What is left empty becomes the CPU alone."""
    if activities is None:
        return None
    kept: list[Any] = []
    for a in activities:
        if isinstance(a, dict):
            a = {k: v for k, v in a.items() if k != ProfilerActivity.CUDA}
            if a:
                kept.append(a)
        elif a != ProfilerActivity.CUDA:
            kept.append(a)
    return kept or [ProfilerActivity.CPU]


def _asks_cuda(activities: Any) -> bool:
    return activities is not None and any(
        (ProfilerActivity.CUDA in a) if isinstance(a, dict) else a == ProfilerActivity.CUDA for a in activities
    )


def install() -> None:
    """Filter the activities of every torch.profiler profile (idempotent)."""
    original = _KinetoProfile.__init__
    if getattr(original, "_phantora", False):
        return

    @functools.wraps(original)
    def init(self: Any, *args: Any, activities: Any = None, **kwargs: Any) -> None:
        if _asks_cuda(activities):
            activities = list(activities)
            if not _told:
                _told.append(True)
                print(
                    "phantora: torch.profiler records the CPU ops only; the simulated GPU's kernels and collectives "
                    "are in phantora's trace (trace.json of the run directory), not in torch's",
                    file=sys.stderr,
                    flush=True,
                )
            activities = without_cuda(activities)
        original(self, *args, activities=activities, **kwargs)

    init._phantora = True  # type: ignore[attr-defined]
    _KinetoProfile.__init__ = init  # type: ignore[method-assign]
