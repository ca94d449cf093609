"""Simulated wall clock: while installed, time.perf_counter / time.time (and their _ns forms) return
the rank's simulated time, so a training loop's own logs print simulated step times.

`time.perf_counter()` = simulated seconds since the run began; `time.time()` = the real epoch
time at install plus simulated seconds. `time.monotonic` and `time.sleep` stay real (libraries
use them for timeouts). Switch off with `phantora run --no-time-patch` or PHANTORA_TIME_PATCH=0,
or temporarily with `with real_time(): ...`.

Libraries that time their own timeouts with `time.perf_counter` keep the real clocks (`REAL_CLOCK_MODULES`, each
given a `time` whose clocks are real): filelock's lock acquisition polls with `time.sleep` until `perf_counter` passes
its deadline, and the simulated clock does not move while the host sleeps, so a lock another process held (evaluate's
metric cache file, which two ranks on one host both ask for) was waited for forever instead of timing out.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from phantora.runtime import import_hooks

_REAL = {name: getattr(time, name) for name in ("perf_counter", "perf_counter_ns", "time", "time_ns")}
REAL_PERF_COUNTER_NS: Callable[[], int] = _REAL["perf_counter_ns"]  # the real one, without a lookup (hot paths)
_installed = False
# modules whose `time.perf_counter` measures a host timeout: filelock 3 (`_api`) and 4 (`_core`)
REAL_CLOCK_MODULES = (
    "filelock._api",
    "filelock._core._acquire",
    "filelock._core._settings",
    "filelock._core._state",
)


class _RealClocks(ModuleType):
    """The time module with its real clocks, whatever is installed on it."""

    def __init__(self) -> None:
        super().__init__("time")
        for name, fn in _REAL.items():
            setattr(self, name, fn)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


REAL_CLOCKS = _RealClocks()


def _keep_real_clocks(module: ModuleType) -> None:
    if getattr(module, "time", None) is time:
        module.time = REAL_CLOCKS  # type: ignore[attr-defined]


def install(now_ns: Callable[[], int]) -> None:
    """Replace the time functions with ones reading `now_ns()` (simulated integer ns); the modules of
    `REAL_CLOCK_MODULES` keep the real ones."""
    global _installed
    for name in REAL_CLOCK_MODULES:
        import_hooks.after_import(name, _keep_real_clocks)
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
