"""A rank's liveness beat: a daemon thread touches the rank's file in the run's private directory every `BEAT_S`.

A rank may send nothing for minutes (computing, or waiting for a collective), so the launcher cannot take its silence
for failure. The beat tells it more: the thread needs the process to run and its interpreter to take the GIL, so it
goes on while the rank waits or computes with the GIL released, and stops when the process is stopped (SIGSTOP) or
wedged (blocked holding the GIL). A rank that computes holding the GIL stops the beat too, but gains CPU time, which
the launcher also counts as a sign of life (bridge/rank_watch.py, bridge/liveness.py). The file is the rank's pid
under `beats/`, holding its rank (JSON); the beat is the file's modification time.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

BEAT_S = 1.0  # the beat's period
BEATS_DIR = "beats"  # under the run's private directory (PHANTORA_RUN_DIR)

_started: int | None = None  # the pid whose beat runs (a forked child starts its own)


def beat_file(run_dir: str | Path, pid: int) -> Path:
    """Where the process `pid` of the run whose private directory is `run_dir` beats."""
    return Path(run_dir) / BEATS_DIR / str(pid)


def start(run_dir: str | Path, rank: int) -> bool:
    """Start this process's beat (once per process); False if its file cannot be written (then the launcher judges
    the rank by its process state alone)."""
    global _started
    pid = os.getpid()
    if _started == pid:
        return True
    path = beat_file(run_dir, pid)
    try:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"rank": rank}))
    except OSError:
        return False
    _started = pid
    stop = threading.Event()  # never set: the thread ends with the process, or when the run's directory goes
    threading.Thread(target=_beat, args=(path, stop), name="phantora-beat", daemon=True).start()
    return True


def _beat(path: Path, stop: threading.Event) -> None:
    """Touch `path` every BEAT_S (Event.wait: real time, whatever the rank's time patch does)."""
    while not stop.wait(BEAT_S):
        try:
            os.utime(path)
        except OSError:
            return  # the run's directory is gone: the run is over
