"""Waits on processes for the tests: a signal's effect is seen by /proc a moment after it is sent."""

from __future__ import annotations

import time
from collections.abc import Callable

from bridge.supervisor import alive_pids


def wait_gone(pids: list[int], within_s: float) -> list[int]:
    """The pids of `pids` still alive after up to `within_s` (sooner once none is)."""
    deadline = time.monotonic() + within_s
    while alive_pids(pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive_pids(pids)


def wait_state(state_of: Callable[[int], str | None], pid: int, want: str, within_s: float) -> str | None:
    """Process `pid`'s state letter once it is `want`, or the last one read after `within_s`."""
    deadline = time.monotonic() + within_s
    state = state_of(pid)
    while state != want and time.monotonic() < deadline:
        time.sleep(0.01)
        state = state_of(pid)
    return state
