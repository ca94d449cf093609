"""Watching partition workers (issue 38): the first to fail ends the run, named (`bridge.cut_pool` for local
processes, `bridge.cut_ray` for Ray actors)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from phantora.netsim import proc_watch
from phantora.netsim.decompose import WorkerDiedError
from phantora.netsim.proc_watch import LOOK_S, STOPPED, proc_state


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
    stops = StopWatch(
        [(f"partition worker {i} ({w.describe()})", getattr(w, "proc", None)) for i, w in enumerate(workers)]
    )
    while pending:
        if tick is not None:
            tick()
        stops.look(pending)
        for i in sorted(pending):
            code = workers[i].poll()
            if code is None:
                continue
            if code != 0:
                words = workers[i].last_words()
                raise WorkerDiedError(
                    stops.blame(pending - {i})
                    + f"partition worker {i} ({workers[i].describe()}) exited with code {code}"
                    + (f"; its last words: {words}" if words else "")
                )
            pending.discard(i)
        if time.monotonic() > deadline:
            raise WorkerDiedError(
                f"partition workers {sorted(pending)} still running after {timeout_s:.0f} s "
                "(PacketConfig.partition_timeout_s)"
            )
        time.sleep(interval_s)


class StopWatch:
    """Local workers seen stopped (state T or t), by index: one stopped `proc_watch.STOPPED_S` on end ends the run,
    named (`look`); and a worker that fails while another is stopped (its peers give up on a silent one at their
    barrier, 60 s) is said to have failed waiting for it (`blame`). Looked at every `LOOK_S`."""

    def __init__(self, procs: Sequence[tuple[str, Any]]) -> None:
        """`procs`: each worker's name for an error and its process (a `subprocess.Popen`; None: not local)."""
        self.procs = procs
        self.since: dict[int, float] = {}  # worker -> when it was first seen stopped
        self.states: dict[int, str] = {}
        self.looked = time.monotonic()  # (a round shorter than a look costs no /proc read)

    def look(self, pending: Iterable[int]) -> None:
        """WorkerDiedError naming a worker of `pending` stopped for `STOPPED_S`."""
        now = time.monotonic()
        if now - self.looked < LOOK_S:
            return
        self.looked = now
        for i in sorted(pending):
            name, proc = self.procs[i]
            state = proc_state(proc.pid) if proc is not None else None
            if state not in STOPPED:
                self.since.pop(i, None)
                continue
            self.states[i] = state
            if now - self.since.setdefault(i, now) > proc_watch.STOPPED_S:
                raise WorkerDiedError(f"{name} has been {STOPPED[state]} for {proc_watch.STOPPED_S:.0f} s")

    def blame(self, others: Iterable[int]) -> str:
        """The words naming a stopped worker among `others` (`partition worker J (pid N) is stopped (...): `), or
        nothing."""
        for j in sorted(set(others) & self.since.keys()):
            return f"{self.procs[j][0]} is {STOPPED[self.states[j]]}: "
        return ""
