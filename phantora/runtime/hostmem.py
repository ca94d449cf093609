"""Real mode's host memory: a rank nearing its share of the machine says so before the kernel's OOM killer acts.

Real mode holds every tensor's data in host memory, so N live ranks of one configuration need about N times what
one holds. Each real-mode rank watches its own memory (PSS: the pages it shares with the fork server counted in
part) every second. Past its share, the memory available when it started over the live ranks (plus what it held
then), it prints one line on its stderr (its log): what it holds, what the ranks need at that rate, what the
machine had, and what to do (--phantom, fewer live ranks, a smaller configuration). The run goes on: the share is
an estimate and the kernel decides; when it kills a rank, bridge/oom.py names the OOM killer.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from phantora.procmem import available_bytes, proportional_set_mb
from phantora.runtime.memory import fmt_bytes

ADVICE = "run with --phantom (shapes only, no tensor data), fewer live ranks (--nproc), or a smaller configuration"


def share_bytes(world: int, available: int | None, held: int = 0) -> int | None:
    """One rank's share of the host: `available` bytes over `world` live ranks, plus the `held` bytes it had."""
    if available is None or world < 1:
        return None
    return available // world + held


def message(rank: int, used: int, world: int, available: int) -> str:
    """The line a rank prints past its share."""
    return (
        f"phantora: rank {rank} holds {fmt_bytes(used)} of host memory in real mode (every tensor's data); {world} "
        f"live ranks at that rate need about {fmt_bytes(world * used)}, and {fmt_bytes(available)} were available "
        f"when it started: the kernel's OOM killer may stop the run; {ADVICE}"
    )


def _pss_bytes() -> int | None:
    mb = proportional_set_mb()
    return None if mb is None else int(mb * 1024 * 1024)


def watch(
    rank: int,
    world: int,
    period_s: float = 1.0,
    used: Callable[[], int | None] = _pss_bytes,
    available: int | None = None,
    say: Callable[[str], None] | None = None,
) -> threading.Thread | None:
    """Start the watcher (a daemon thread); None where the machine does not tell its memory."""
    avail = available_bytes() if available is None else available
    held = used()
    share = share_bytes(world, avail, held or 0)
    if share is None or held is None or avail is None:
        return None
    out = say or (lambda line: print(line, file=sys.stderr, flush=True))
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(period_s):
            now = used()
            if now is not None and now > share:
                out(message(rank, now, world, avail))
                return

    thread = threading.Thread(target=run, name="phantora-hostmem", daemon=True)
    thread.stop = stop  # type: ignore[attr-defined]
    thread.start()
    return thread
