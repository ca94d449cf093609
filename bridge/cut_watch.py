"""Watching partition workers (issue 38): the first to fail ends the run, named (`bridge.cut_pool` for local
processes, `bridge.cut_ray` for Ray actors)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from phantora.netsim.decompose import WorkerDiedError


class Watched(Protocol):
    """A started partition worker, as the pool watches it (a local process, or a Ray actor's, `bridge.cut_ray`)."""

    def poll(self) -> int | None:
        """Its exit code, or None while it runs."""

    def describe(self) -> str:
        """Who it is, for an error: its pid (and where it runs)."""

    def last_words(self) -> str:
        """The last lines of its log, or ""."""


def wait_workers(
    workers: Sequence[Watched], timeout_s: float, interval_s: float = 0.01, tick: Callable[[], None] | None = None
) -> None:
    """Wait for every worker (polled every `interval_s`), at most `timeout_s`; the first to exit non-zero ends the
    run with a `WorkerDiedError` naming it and its last words. `tick`: called at each poll (a progress display's
    reader of the workers' beats)."""
    deadline = time.monotonic() + timeout_s
    pending = set(range(len(workers)))
    while pending:
        if tick is not None:
            tick()
        for i in sorted(pending):
            code = workers[i].poll()
            if code is None:
                continue
            if code != 0:
                words = workers[i].last_words()
                raise WorkerDiedError(
                    f"partition worker {i} ({workers[i].describe()}) exited with code {code}"
                    + (f"; its last words: {words}" if words else "")
                )
            pending.discard(i)
        if time.monotonic() > deadline:
            raise WorkerDiedError(
                f"partition workers {sorted(pending)} still running after {timeout_s:.0f} s "
                "(PacketConfig.partition_timeout_s)"
            )
        time.sleep(interval_s)
