"""Is a child process stopped? Read a network process's output without waiting on one that is stopped for good.

A network process (the ns-3 runner of `phantora netsim`) may print nothing for minutes while it computes, so its
silence proves nothing; a process stopped (SIGSTOP, SIGTSTP: state T) or held by a debugger (state t) for
`STOPPED_S` on end is taken for failure, and named with its pid and state. `proc_state` is the one reader of a
process's state letter (bridge/rank_watch.py judges the ranks by it too).
"""

from __future__ import annotations

import codecs
import os
import select
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from phantora.errors import PhantoraError

STOPPED_S = 30.0  # a process stopped this long without a break ends its reader
LOOK_S = 1.0  # a silent process's state is looked at this often
STOPPED = {
    "T": "stopped (state T: SIGSTOP or SIGTSTP; nothing resumed it)",
    "t": "held by a debugger or tracer (state t)",
}


def proc_state(pid: int) -> str | None:
    """The state letter of process `pid`'s main thread (/proc/PID/task/PID/stat field 3), None if it is gone, a
    zombie, or the system has no /proc."""
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    except OSError:
        return None
    state = stat.rsplit(")", 1)[1].split()[0]
    return None if state in ("Z", "X") else state


def watched_lines(proc: Any, what: str, stopped_s: float = STOPPED_S) -> Iterator[str]:
    """The lines `proc` (a `subprocess.Popen` with a stdout pipe) prints, without their newline, as they come, until
    it closes its stdout; PhantoraError naming `what` and its pid once it has been stopped for `stopped_s`."""
    out: IO[Any] = proc.stdout
    fd = out.fileno()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    rest = ""
    stopped_since: float | None = None
    while True:
        if select.select([fd], [], [], LOOK_S)[0]:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            stopped_since = None
            *lines, rest = (rest + decoder.decode(chunk)).split("\n")
            yield from lines
            continue
        state = proc_state(proc.pid)
        if state not in STOPPED:
            stopped_since = None
            continue
        now = time.monotonic()
        stopped_since = now if stopped_since is None else stopped_since
        if now - stopped_since > stopped_s:
            raise PhantoraError(f"{what} (pid {proc.pid}) has been {STOPPED[state]} for {stopped_s:.0f} s")
    rest += decoder.decode(b"", final=True)
    if rest:
        yield rest
