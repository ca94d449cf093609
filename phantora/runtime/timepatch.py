"""Simulated wall clock: while installed, time.perf_counter / time.time (and their _ns forms) return
the rank's simulated time, so a training loop's own logs print simulated step times.

`time.perf_counter()` = simulated seconds since the run began; `time.time()` = the real epoch
time at install plus simulated seconds. `time.monotonic` and `time.sleep` stay real (libraries
use them for timeouts). Switch off with `phantora run --no-time-patch` or PHANTORA_TIME_PATCH=0,
or temporarily with `with real_time(): ...`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

_REAL = {name: getattr(time, name) for name in ("perf_counter", "perf_counter_ns", "time", "time_ns")}
REAL_PERF_COUNTER_NS: Callable[[], int] = _REAL["perf_counter_ns"]  # the real one, without a lookup (hot paths)
_installed = False


def install(now_ns: Callable[[], int]) -> None:
    """Replace the time functions with ones reading `now_ns()` (simulated integer ns)."""
    global _installed
    epoch_ns = _REAL["time_ns"]()
    time.perf_counter = lambda: now_ns() / 1e9
    time.perf_counter_ns = lambda: now_ns()
    time.time = lambda: (epoch_ns + now_ns()) / 1e9
    time.time_ns = lambda: epoch_ns + now_ns()
    _installed = True


def uninstall() -> None:
    """Restore the real time functions."""
    global _installed
    for name, fn in _REAL.items():
        setattr(time, name, fn)
    _installed = False


def installed() -> bool:
    return _installed


@contextlib.contextmanager
def real_time() -> Iterator[None]:
    """Inside, the time functions are real again (for measuring the simulator itself)."""
    saved = {name: getattr(time, name) for name in _REAL}
    for name, fn in _REAL.items():
        setattr(time, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(time, name, fn)


def real_perf_counter() -> float:
    """The real perf_counter, whatever is installed."""
    return _REAL["perf_counter"]()


def real_perf_counter_ns() -> int:
    """The real perf_counter_ns, whatever is installed."""
    return _REAL["perf_counter_ns"]()
