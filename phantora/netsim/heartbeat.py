"""A heartbeat from inside a long ns-3 run call, for a progress display (issue 38).

One ns-3 call (`Ns3Simulator.advance_to_completion` and the like) runs until a flow completes or its limit, which on
a large live all-reduce can take minutes of CPU with nothing reported. With a `Heartbeat` set on the engine
(`attach`), each call runs in bounded chunks of simulated time instead and the heartbeat's `report` is called
between two chunks with ns-3's clock. A chunk is sized to take about `target_s` CPU seconds, from the last one's
CPU per simulated ns.

The model events are the same whatever the stopping points: a call stops between two event times (every event of
the stop's ns run, `PhantoraNetwork::RunTo`) or right after the completion that leaves no flow in flight (where a
whole drain stops, whatever the chunk's limit), nothing is submitted between chunks, and a chunk ends early exactly
where the whole call would (the first completion's ns; `advance_watching` and `drain` step completion by
completion, so they also stop where the fabric falls idle). Only ns-3's `events` counter moves: it counts the
chunks' own stop events (as it counts every run call's), so it is not a figure of the simulation
(`phantora.results.reproduce.NOT_SIMULATED`). tests/test_heartbeat.py compares every file of a run with and
without it.

An engine in another process reports the same way (`attach_beats`: a `phantora.progress.Beat` of its clock, events
and CPU): a network server sends them to its peer as `progress` messages (`bridge.netserver`), and a decomposition
driver's worker pool (an engine's `beat_source`) passes its workers' on, merged (`bridge.workers`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from phantora.netsim.base import INF_NS
from phantora.progress import Beat

FIRST_CHUNK_NS = 10_000  # the first chunk: 10 us of simulated time (then sized from its CPU)


class Heartbeat:
    """Chunks of about `target_s` CPU seconds (None: of `first_ns` each); `report(sim_ns)` between two of them."""

    def __init__(
        self, report: Callable[[int], None], target_s: float | None = 0.5, first_ns: int = FIRST_CHUNK_NS
    ) -> None:
        self.report = report
        self.target_s = target_s
        self.chunk_ns = max(1, first_ns)
        self.beats = 0  # reports made

    def _sized(self, ran_ns: int, cpu_s: float) -> None:
        """The next chunk from the last one's CPU per simulated ns, at most 4x larger and at least 1 ns."""
        if ran_ns <= 0 or self.target_s is None:
            return
        want = ran_ns * self.target_s / cpu_s if cpu_s > 0 else ran_ns * 4
        self.chunk_ns = max(1, min(int(want), ran_ns * 4, INF_NS // 4))

    def run(self, now: Callable[[], int], step: Callable[[int], bool], until: int, idle: Callable[[], bool]) -> bool:
        """`step(t)` (one bounded run call to t: True if the whole call is over there) in chunks towards `until`,
        with a report between two. True when a step ended the call; False at `until`, or as soon as `idle()` says
        the whole call would now run no further on its own (nothing in flight, or nothing live left: the caller
        then makes the whole call, which returns or fails as it would have)."""
        while True:
            if idle():
                return False
            t = now()
            stop = min(until, t + self.chunk_ns)
            c0 = time.process_time()
            over = step(stop)
            reached = now()
            self._sized(reached - t, time.process_time() - c0)
            if over:
                return True
            if stop >= until:
                return False
            self.beats += 1
            self.report(reached)


def engines(sim: Any) -> list[Any]:
    """The in-process ns-3 engines (`Ns3Simulator`, known by its `beatable`) under `sim`: itself, or below its
    packet side and wrappers (`packet`, `inner`, `engine`); not one writing a call script (not `beatable`)."""
    return _walk(sim)[0]


def _walk(sim: Any) -> tuple[list[Any], list[Any]]:
    """`engines(sim)`, and the worker pools under `sim` that report their workers' beats (an engine's
    `beat_source` with an `on_beat`)."""
    out: list[Any] = []
    pools: list[Any] = []
    seen: set[int] = set()
    todo = [sim]
    while todo:
        s = todo.pop()
        if s is None or id(s) in seen:
            continue
        seen.add(id(s))
        beatable = getattr(s, "beatable", None)
        if beatable is not None:
            if beatable:
                out.append(s)
            continue
        pool = getattr(s, "beat_source", None)
        if pool is not None and hasattr(pool, "on_beat"):
            pools.append(pool)
            continue
        todo.extend(getattr(s, name, None) for name in ("packet", "inner", "engine"))
    return out, pools


def attach(sim: Any, report: Callable[[int], None]) -> list[Any]:
    """Give every in-process ns-3 engine under `sim` without one a `Heartbeat` calling `report`; returns those
    engines (their `heartbeat` is set back to None by `detach`)."""
    found = [e for e in engines(sim) if e.heartbeat is None]
    for e in found:
        e.heartbeat = Heartbeat(report)
    return found


def detach(found: list[Any]) -> None:
    for e in found:
        e.heartbeat = None


def attach_beats(sim: Any, report: Callable[[Beat], None], cpu0: float = 0.0, every_s: float = 0.5) -> list[Any]:
    """`attach` with a `Beat` for `report` (chunks of about `every_s` CPU seconds): the engine's clock, the events
    of every in-process ns-3 engine under `sim` and this process's CPU seconds since `cpu0`; and every worker pool
    under `sim` passes its workers' beats to `report` (merged, at most every `every_s`: `bridge.workers`). Returns
    what `detach_beats` undoes."""
    found, pools = _walk(sim)
    mine = [e for e in found if e.heartbeat is None]
    if mine:

        def beat(ns: int) -> None:
            report(Beat(ns, sum(e.event_count() for e in found), time.process_time() - cpu0))

        for e in mine:
            e.heartbeat = Heartbeat(beat, target_s=every_s)
    free = [p for p in pools if p.on_beat is None]
    for p in free:
        p.on_beat, p.beat_s = report, every_s
    return [*mine, *free]


def beat_now(found: list[Any], cpu0: float = 0.0) -> Beat | None:
    """A `Beat` of the in-process ns-3 engines among what `attach_beats` returned (their clock, events, this
    process's CPU seconds since `cpu0`), for a report at the end of a call; None without one."""
    mine = [e for e in found if not hasattr(e, "on_beat")]
    if not mine:
        return None
    return Beat(min(e.now() for e in mine), sum(e.event_count() for e in mine), time.process_time() - cpu0)


def detach_beats(found: list[Any]) -> None:
    for e in found:
        if hasattr(e, "on_beat"):
            e.on_beat = None
        else:
            e.heartbeat = None
