"""Is a silent peer hung, or busy? A peer's silence counts only while its process makes no progress.

Every process of a run that waits on a peer gives up after the peer timeout of silence (`peer_timeout_s`). A peer
on this machine (the coordinator, seen by the launcher, the ranks and the network server; the launcher, seen by
the coordinator) that is silent because it works, planning a collective of 1,024 ranks or inside one long engine
call, or because a loaded machine gives it little CPU, is alive: its main thread's CPU time grows or it is running or
waiting for a CPU. `Silence` restarts the clock whenever it sees that, so only real silence counts: a peer stopped
(SIGSTOP), blocked for good, or gone (its death is seen sooner by the launcher, which polls its children).
"""

from __future__ import annotations

import time
from pathlib import Path

LOOK_S = 1.0  # look at a silent peer's process at most this often, once it missed a heartbeat (bridge.transport)


def progress_mark(pid: int) -> tuple[str, int, bool] | None:
    """(start time, user + system CPU in clock ticks, running or runnable now) of a live process's main thread
    (/proc/PID/task/PID/stat fields 22, 14 + 15, 3), where a run's processes do their work: ZeroMQ's I/O threads,
    which wake for every message that arrives, would make a hung process look busy. None if the process is gone, a
    zombie, or the system has no /proc."""
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    state = fields[0]
    if state in ("Z", "X"):
        return None
    return fields[19], int(fields[11]) + int(fields[12]), state == "R"


class Silence:
    """The silence clock on one peer process: `heard()` on each message from it; `silent_s()` how long it has been
    silent and idle. The peer's pid may come later (`watch`); until then every second of silence counts."""

    def __init__(self, pid: int | None = None) -> None:
        self._since = time.monotonic()
        self._looked = self._since
        self._pid: int | None = None
        self._start = ""
        self._cpu = -1
        self.busy_s = 0.0  # the longest stretch of silence the peer spent working (not counted)
        self._busy_from: float | None = None
        if pid is not None:
            self.watch(pid)

    def watch(self, pid: int) -> None:
        """Judge the process `pid` (which must be on this machine) by its progress from now on."""
        mark = progress_mark(pid)
        self._pid = pid
        self._start, self._cpu = (mark[0], mark[1]) if mark is not None else ("", -1)

    def heard(self) -> None:
        self._since = time.monotonic()
        self._busy_from = None

    def silent_s(self) -> float:
        """Seconds the peer has been silent without progressing. Looks at the process at most once a second, and
        only once it has been silent that long: running (or runnable) now, it is alive now; CPU time gained since
        the last look, it was alive at that look at least."""
        now = time.monotonic()
        if self._pid is None or now - self._since < LOOK_S or now - self._looked < LOOK_S:
            return now - self._since
        last_look, self._looked = self._looked, now
        mark = progress_mark(self._pid)
        if mark is None or mark[0] != self._start:  # gone (or its pid taken by another process): no credit
            return now - self._since
        _, cpu, running = mark
        alive = now if running else last_look if cpu > self._cpu else None
        self._cpu = cpu
        if alive is not None and alive > self._since:
            if self._busy_from is None:
                self._busy_from = self._since
            self.busy_s = max(self.busy_s, alive - self._busy_from)
            self._since = alive
        return now - self._since
