"""The launcher's judge of its ranks: is a rank that sends nothing stopped or wedged, or only busy?

A rank may send the coordinator nothing for minutes, so silence proves nothing. Each rank beats instead
(bridge/rank_beat.py: a thread touching its file every second, which needs the process to run and its interpreter
to take the GIL). `RankWatch` counts a rank's silence only while it neither beats, nor gains CPU time, nor is
running or runnable (bridge/liveness.py's `Silence`); before its beat starts (its imports), only while it is stopped
(state T or t). A rank silent that way for the limit (the run's peer timeout) ends the run, named with its pid and
state:
- stopped (SIGSTOP, SIGTSTP: state T) or held by a debugger (state t): no beat, no CPU time;
- wedged (blocked while holding the GIL, e.g. a C call that never returns): no beat, no CPU time, state S or D.
A rank waiting for a collective, sleeping, or computing with the GIL released beats; one computing holding the GIL
(a long C loop) gains CPU time: neither is ever stopped, however long it takes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bridge.liveness import LOOK_S, Silence, progress_mark
from bridge.rank_beat import BEATS_DIR, beat_file
from bridge.supervisor import Child
from phantora.netsim.proc_watch import STOPPED, proc_state

STATES = {"S": "S, sleeping", "D": "D, in an uninterruptible wait", "R": "R, running", "I": "I, idle"}


@dataclass
class _Clock:
    silence: Silence
    start: str  # the process's start time (a pid taken by another process is not this one)
    beat: int | None = None  # the beat file's last modification time seen (ns)


class RankWatch:
    """Silence clocks on a run's rank processes; `check` at any rate (it looks at most every LOOK_S)."""

    def __init__(self, run_dir: Path, limit_s: float) -> None:
        self.run_dir = run_dir
        self.limit_s = limit_s
        self._clocks: dict[int, _Clock] = {}
        self._looked = 0.0

    def check(self, ranks: Iterable[Child], others: bool = False) -> tuple[int, int | None, str] | None:
        """(pid, rank, why) of the first of `ranks` (live processes) silent and idle for the limit, else None; with
        `others`, also every process that beats in this run without being one of `ranks` (ranks a program started
        itself: `why` then names the rank its beat file gives)."""
        now = time.monotonic()
        if now - self._looked < LOOK_S:
            return None
        self._looked = now
        watched = {c.pid: (c.label, c.rank) for c in ranks}
        if others:
            for pid in self._beating() - watched.keys():
                rank = self._rank_of(pid)
                watched[pid] = (f"rank {rank} (pid {pid})", rank)
        for pid in self._clocks.keys() - watched.keys():
            del self._clocks[pid]
        for pid, (label, rank) in watched.items():
            why = self._judge(pid, label)
            if why is not None:
                return pid, rank, why
        return None

    def _judge(self, pid: int, label: str) -> str | None:
        mark = progress_mark(pid)
        state = proc_state(pid)
        if mark is None or state is None:
            return None  # gone: the launcher's poll of its children sees the exit
        clock = self._clocks.get(pid)
        if clock is None:
            clock = self._clocks[pid] = _Clock(Silence(pid), mark[0])
        elif mark[0] != clock.start:
            return None  # the rank is gone, its pid another process's (a beat file outlives its rank)
        try:
            beat: int | None = beat_file(self.run_dir, pid).stat().st_mtime_ns
        except OSError:
            beat = None
        if beat is not None and beat != clock.beat or beat is None and state not in STOPPED:
            clock.beat = beat
            clock.silence.heard()
        silent = clock.silence.silent_s()
        if silent <= self.limit_s:
            return None
        state = proc_state(pid) or state
        what = STOPPED.get(state) or (
            f"wedged: its heartbeat stopped and it gained no CPU time (state {STATES.get(state, state)}: blocked, "
            "e.g. in a call that holds the GIL)"
        )
        return f"{label} has made no progress for {self.limit_s:.0f} s: {what}"

    def _beating(self) -> set[int]:
        try:
            return {int(p.name) for p in (self.run_dir / BEATS_DIR).iterdir() if p.name.isdigit()}
        except OSError:
            return set()

    def _rank_of(self, pid: int) -> int | None:
        try:
            return int(json.loads(beat_file(self.run_dir, pid).read_text())["rank"])
        except (OSError, ValueError, KeyError, TypeError):
            return None


def kill(pid: int) -> None:
    """SIGKILL `pid` (a stopped process takes no other signal until it is resumed); nothing if it is gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
