"""Chrome / Perfetto trace of a live run: one process per rank, lanes for steps, compute and comm (and a lane per side
stream a thread of the program ran kernels on).

Each rank records its events in integer ns and appends those of each finished step to
`trace/rank<R>.jsonl` (one line per step), so a run killed at step 90 keeps the trace of steps 0-89;
the launcher merges the rank files into one `trace.json` that chrome://tracing and ui.perfetto.dev
open (`phantora.results.run_dir.merge_trace`).
Levels: "ops" records every compute op, "coarse" merges back-to-back ops into blocks, "none" keeps
only steps and collectives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phantora.rank_options import check_trace_level
from phantora.results.trace_chunks import chunk_line_parts
from phantora.runtime.trace_json import compute_spans_json

TID_STEPS, TID_COMPUTE, TID_COMM = 0, 1, 2
TID_STORAGE = 999  # checkpoint reads and writes (runtime/storage.py), below the comm lanes
TID_STREAMS = 1000  # + a side stream's id: the lane of a thread's side stream (clock.py `lanes`), below storage


def _us(ns: int) -> float:
    return ns / 1000.0


class TraceRecorder:
    """Collects one rank's events."""

    def __init__(self, rank: int, level: str = "ops") -> None:
        check_trace_level(level)
        self.rank = rank
        self.level = level
        self._ops: list[tuple[str, int, int]] = []
        self._block: list[int] | None = None  # [start, end, count] of the open coarse block
        self._comms: list[tuple[str, int, int, dict[str, Any]]] = []
        self._steps: list[tuple[int, int, int]] = []
        self._io: list[tuple[str, int, int, dict[str, Any]]] = []  # checkpoint reads and writes
        self._io_named = False
        self._lane_ops: list[tuple[int, str, int, int]] = []  # ops on side streams' lanes: (stream, name, start, end)
        self._lanes_named: set[int] = set()
        self._lanes_end: list[int] = []  # comm lanes: when each one's last collective ends
        self._named = False  # the process and thread names went out with the first events

    def op(self, name: str, start: int, end: int) -> None:
        """A compute op ran on the compute lane from start to end (ns)."""
        if self.level == "ops":
            self._ops.append((name, start, end))
        elif self.level == "coarse":
            if self._block is not None and self._block[1] == start:
                self._block[1] = end
                self._block[2] += 1
            else:
                self._close_block()
                self._block = [start, end, 1]

    def lane_op(self, stream: int, name: str, start: int, end: int) -> None:
        """A compute op ran on side stream `stream`'s own lane from start to end (ns): a span on that stream's track."""
        if self.level != "none":
            self._lane_ops.append((stream, name, start, end))

    def stop_ops(self) -> None:
        """Record no more compute ops (steps, collectives and checkpoint I/O still): `--trace-steps` reached."""
        self._close_block()
        self.level = "none"

    def _close_block(self) -> None:
        if self._block is not None:
            start, end, count = self._block
            self._ops.append((f"compute ({count} ops)", start, end))
            self._block = None

    def comm(self, name: str, start: int, end: int, args: dict[str, Any]) -> None:
        """A collective occupied the comm lane from its issue to its completion (ns)."""
        self._close_block()
        self._comms.append((name, start, end, args))

    def io(self, name: str, start: int, end: int, args: dict[str, Any]) -> None:
        """The host read or wrote a checkpoint file from start to end (ns): a span on the storage lane."""
        self._close_block()
        self._io.append((name, start, end, args))

    def step(self, index: int, start: int, end: int) -> None:
        self._close_block()
        self._steps.append((index, start, end))

    def take_events(self) -> list[dict[str, Any]]:
        """This rank's Chrome trace events (ts and dur in microseconds) recorded since the last call."""
        before, ops, after = self._take()
        pid = self.rank
        return [*before, *(_span(name, "compute", pid, TID_COMPUTE, s, e, None) for name, s, e in ops), *after]

    def _take(self) -> tuple[list[dict[str, Any]], list[tuple[str, int, int]], list[dict[str, Any]]]:
        """The events since the last call, in their order: those before the compute ops, the ops (as recorded), and
        those after them (the comm lanes' names, the collectives, checkpoint I/O)."""
        self._close_block()
        pid = self.rank
        ev: list[dict[str, Any]] = []
        if not self._named:
            self._named = True
            ev += [
                {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {self.rank}"}},
                {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": self.rank}},
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": TID_STEPS, "args": {"name": "steps"}},
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": TID_COMPUTE, "args": {"name": "compute"}},
            ]
        for index, start, end in self._steps:
            ev.append(_span(f"step {index}", "step", pid, TID_STEPS, start, end, {"step": index}))
        ops = self._ops
        after: list[dict[str, Any]] = []
        lanes_end = self._lanes_end  # overlapping collectives go to extra comm lanes
        for name, start, end, args in sorted(self._comms, key=lambda c: (c[1], c[2])):
            lane = next((i for i, t in enumerate(lanes_end) if t <= start), len(lanes_end))
            if lane == len(lanes_end):
                lanes_end.append(end)
                label = "comm" if lane == 0 else f"comm.{lane}"
                after.append(
                    {"name": "thread_name", "ph": "M", "pid": pid, "tid": TID_COMM + lane, "args": {"name": label}}
                )
            lanes_end[lane] = end
            after.append(_span(name, "comm", pid, TID_COMM + lane, start, end, args))
        if self._io and not self._io_named:
            self._io_named = True
            after.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": TID_STORAGE, "args": {"name": "storage"}}
            )
        for name, start, end, args in self._io:
            after.append(_span(name, "storage", pid, TID_STORAGE, start, end, args))
        for stream, name, start, end in self._lane_ops:
            if stream not in self._lanes_named:
                self._lanes_named.add(stream)
                names = {"name": f"compute (stream {stream})"}
                after.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": TID_STREAMS + stream, "args": names})
            after.append(_span(name, "compute", pid, TID_STREAMS + stream, start, end, None))
        self._steps, self._ops, self._comms, self._io, self._lane_ops = [], [], [], [], []
        return ev, ops, after

    def append_to(self, path: str | Path, step: int | None) -> None:
        """Append the events since the last call to `path` as one JSON line (`step`: the step they finish,
        None for the rest at the end), written at once so that it survives a crash later. The line is
        `chunk_line(rank, step, take_events())`'s, the compute ops' events formatted straight to their JSON text
        (`compute_spans_json`) rather than made as dicts and encoded (about 2 µs an op less)."""
        before, ops, after = self._take()
        line = chunk_line_parts(self.rank, step, before, compute_spans_json(ops, self.rank, TID_COMPUTE), after)
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a") as f:
            f.write(line)


def _span(name: str, cat: str, pid: int, tid: int, start: int, end: int, args: dict[str, Any] | None) -> dict[str, Any]:
    ev: dict[str, Any] = {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": _us(start)}
    ev["dur"] = _us(end - start)
    if args:
        ev["args"] = args
    return ev
