"""Progress of a long command, on stderr: a tqdm bar on a terminal, a plain line every few seconds otherwise.

Modes: "bar" (tqdm: done/total, rate and ETA, plus the simulated time, the engine's events and events per second
and this process's CPU seconds),
"lines" (a log file or a pipe: at most one line every `LINE_EVERY_S` seconds, with the same figures) and
"off".
The display only reads what it is told; it never drives what it reports on.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any

MODES = ("off", "bar", "lines")
LINE_EVERY_S = 5.0  # "lines": at most one line this often
STATUS_EVERY_S = 1.0  # `NetworkLine` on a terminal: its status line redrawn at most this often


def auto_mode(progress: bool | None = None, quiet: bool = False) -> str:
    """The mode for the flags `--progress/--no-progress` (None: not given) and `--quiet`."""
    if quiet or progress is False:
        return "off"
    return "bar" if progress or sys.stderr.isatty() else "lines"


@dataclass(frozen=True)
class Beat:
    """How far a network engine in another process is, from inside a long ns-3 call (`phantora.netsim.heartbeat`):
    its clock (with workers, the slowest one's: every worker has run that far), the ns-3 events run so far and the
    CPU seconds the processes running them spent (summed over the workers), the worker processes (0: one engine)
    and the slowest of them (-1: none)."""

    sim_ns: int
    events: int
    cpu_s: float
    workers: int = 0
    slowest: int = -1

    def fields(self) -> dict[str, Any]:
        """As the fields of a `progress` message (`bridge.protocol`)."""
        return {"sim": self.sim_ns, "events": self.events, "cpu": self.cpu_s, "workers": self.workers,
                "slowest": self.slowest}  # fmt: skip

    @classmethod
    def from_fields(cls, f: Mapping[str, Any]) -> Beat:
        return cls(int(f["sim"]), int(f["events"]), float(f["cpu"]), int(f["workers"]), int(f["slowest"]))

    def text(self) -> str:
        """ "simulated 4.210 ms, 2,171,842 events (310.2 k per CPU s, 7.0 CPU s), 2 workers (slowest: 1)"."""
        rate = f"{_rate(self.events / self.cpu_s)} per CPU s, " if self.cpu_s > 0 else ""
        out = f"simulated {self.sim_ns / 1e6:.3f} ms, {self.events:,} events ({rate}{self.cpu_s:.1f} CPU s)"
        if self.workers:
            out += f", {self.workers} workers" + (f" (slowest: {self.slowest})" if self.slowest >= 0 else "")
        return out


class NetworkLine:
    """The network's progress as its engine process reports it (`Beat`s: `phantora run` with the engine in a
    network server, or its workers), on stderr. "bar" (a terminal): one status line redrawn in place at most every
    `STATUS_EVERY_S` (`clear` it before printing another line); "lines": a plain line at most every `every_s`;
    "off": nothing."""

    def __init__(self, mode: str, *, every_s: float | None = None, file: IO[str] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"progress mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.every_s = (STATUS_EVERY_S if mode == "bar" else LINE_EVERY_S) if every_s is None else every_s
        self.file = file if file is not None else sys.stderr
        self.t0 = time.monotonic()
        self._last = float("-inf")
        self._drawn = False  # a status line is on the terminal
        self.shown = 0  # lines or redraws made

    def show(self, beat: Beat) -> None:
        now = time.monotonic()
        if self.mode == "off" or now - self._last < self.every_s:
            return
        self._last = now
        self.shown += 1
        line = f"[phantora] network: {beat.text()}, {_duration(now - self.t0)} elapsed"
        if self.mode == "bar":
            self.file.write(f"\r{line}\x1b[K")
            self._drawn = True
        else:
            self.file.write(line + "\n")
        self.file.flush()

    def clear(self) -> None:
        """Take the status line off the terminal (another line is about to be printed)."""
        if self._drawn:
            self.file.write("\r\x1b[K")
            self.file.flush()
            self._drawn = False


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _rate(per_s: float) -> str:
    for div, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if per_s >= div:
            return f"{per_s / div:.1f}{suffix}"
    return f"{per_s:.0f}"


class Progress:
    """Counts `done` of `total` `unit`s, with the simulated time and an event counter alongside."""

    def __init__(
        self,
        mode: str,
        desc: str,
        total: int | None,
        unit: str,
        *,
        every_s: float | None = None,
        file: IO[str] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"progress mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.desc, self.total, self.unit = mode, desc, total, unit
        self.every_s = LINE_EVERY_S if every_s is None else every_s
        self.file = file if file is not None else sys.stderr
        self.done = 0
        self.failed = 0
        self.sim_ns: int | None = None
        self.events: int | None = None
        self.workers: Beat | None = None  # the last report of an engine's worker processes (`beat`)
        self.note: str | None = None  # what the unit under way last said (`show`: a sweep's running run)
        self.t0 = time.monotonic()
        self._last_line = self.t0
        self._last_post = float("-inf")
        self._bar: Any = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.file, leave=False, dynamic_ncols=True)

    def update(
        self,
        done: int | None = None,
        *,
        add: int = 0,
        failed: int = 0,
        sim_ns: int | None = None,
        events: int | None = None,
    ) -> None:
        """Now `done` (or `add` more) units are done, `failed` more failed; the simulation is at `sim_ns`
        and has run `events` events in all."""
        new = (self.done + add) if done is None else done
        step, self.done = new - self.done, new
        self.failed += failed
        if sim_ns is not None:
            self.sim_ns = sim_ns
        if events is not None:
            self.events = events
        now = time.monotonic()
        if self._bar is not None:
            if now - self._last_post >= 0.5:
                self._last_post = now
                self._bar.set_postfix_str(self._extras(now), refresh=False)
            self._bar.update(step)
        elif self.mode == "lines" and now - self._last_line >= self.every_s:
            self._last_line = now
            print(self.line(now), file=self.file, flush=True)

    def beat(self, sim_ns: int, events: Callable[[], int | None] | None = None, workers: Beat | None = None) -> None:
        """The engine is at `sim_ns` in the middle of a long call (`phantora.netsim.heartbeat`): show it, with
        `events()` read only if it is shown, and redraw the bar though no unit was done. `workers`: what the
        engine's worker processes report (their CPU, events per CPU second, the slowest), shown from now on."""
        if workers is not None:
            self.workers = workers
        if not self.shows_extras():
            return
        self.update(add=0, sim_ns=sim_ns, events=None if events is None else events())
        if self._bar is not None:
            self._bar.refresh()

    def show(self, note: str) -> None:
        """The unit under way says `note` (a sweep's run: its last progress line): shown after the counts from now
        on, a line printed if one is due, though no unit was done."""
        self.note = note
        self.update(add=0)

    def shows_extras(self) -> bool:
        """Whether an `update` now would show the simulated time and events/s (a bar's figures every 0.5 s, a line
        every `every_s`): a caller may read an engine's event counter only then (partition workers answer it
        with their records)."""
        now = time.monotonic()
        if self._bar is not None:
            return now - self._last_post >= 0.5
        return self.mode == "lines" and now - self._last_line >= self.every_s

    def _extras(self, now: float) -> str:
        parts = []
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.sim_ns is not None:
            parts.append(f"simulated {self.sim_ns / 1e6:.3f} ms")
        if self.events is not None and now > self.t0:
            parts.append(f"{self.events:,} events ({_rate(self.events / (now - self.t0))}/s)")
        if self.sim_ns is not None or self.events is not None:
            parts.append(f"{time.process_time():.1f} CPU s")
        if self.workers is not None:
            w = self.workers
            rate = f"{_rate(w.events / w.cpu_s)} events per CPU s, " if w.cpu_s > 0 else ""
            parts.append(f"{w.workers} workers: {w.cpu_s:.1f} CPU s, {rate}slowest {w.slowest}")
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)

    def line(self, now: float | None = None) -> str:
        """The plain progress line: done/total, the extras, elapsed time and the ETA."""
        now = time.monotonic() if now is None else now
        elapsed = now - self.t0
        head = f"{self.done}/{self.total}" if self.total else str(self.done)
        if self.total:
            head += f" {self.unit}s ({100 * self.done / self.total:.0f}%)"
        else:
            head += f" {self.unit}s"
        parts = [head, self._extras(now), f"{_duration(elapsed)} elapsed"]
        if self.total and 0 < self.done < self.total:
            parts.append(f"ETA {_duration(elapsed * (self.total - self.done) / self.done)}")
        return f"[phantora] {self.desc}: " + ", ".join(p for p in parts if p)

    def write(self, text: str) -> None:
        """A message that must not tear the bar."""
        if self._bar is not None:
            self._bar.write(text, file=self.file)
        elif self.mode != "off":
            print(text, file=self.file, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
