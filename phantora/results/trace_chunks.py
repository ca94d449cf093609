"""The ranks' trace chunks on disk, and their merge into one trace.json as a stream.

A live rank appends one line per finished step to `trace/rank<R>.jsonl` (`chunk_line`):

    {"rank": R, "step": S, "comm": [its collective spans], "events": [every other event]}

The collective spans come first and apart because the merge adds NCCL's choice to them; every other event is
copied into trace.json as the rank wrote it, never parsed. So a merge costs about a copy of the bytes, read and
written line by line, where a JSON round trip of the whole document held it all in memory at about 11 MB/s: a
rank killed ten minutes into a run (a 500 MB trace) kept the launcher writing for a minute, and a run of hours
would not fit in memory. A line in another layout (all events in "events") is parsed whole and still merged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from phantora.results.trace_stream import TraceWriter

COMM_CAT = "comm"  # the category of a collective's span (runtime/trace.py)
_HEAD = re.compile(r'\{"rank": (-?\d+), "step": (null|-?\d+), "comm": ')
_EVENTS = ', "events": ['
_DECODER = json.JSONDecoder()


@dataclass
class Chunk:
    """One rank's events of one step: its collective spans parsed, the rest as JSON text."""

    rank: int
    step: int | None  # the step they finish; None for the rest at the end of the run
    comm: list[dict[str, Any]]
    rest: str  # the other events, as the items of a JSON list without its brackets ("" if none)

    def events(self) -> list[dict[str, Any]]:
        """Every event of the chunk, parsed."""
        return [*json.loads(f"[{self.rest}]"), *self.comm]


def chunk_line(rank: int, step: int | None, events: Sequence[Mapping[str, Any]]) -> str:
    """A trace chunk's line, newline-terminated: the collective spans under "comm", the others under "events"."""
    comm = [ev for ev in events if ev.get("cat") == COMM_CAT]
    rest = [ev for ev in events if ev.get("cat") != COMM_CAT]
    return json.dumps({"rank": rank, "step": step, "comm": comm, "events": rest}) + "\n"


def chunk_line_parts(
    rank: int,
    step: int | None,
    before: Sequence[Mapping[str, Any]],
    middle_json: str,
    after: Sequence[Mapping[str, Any]],
) -> str:
    """`chunk_line(rank, step, [*before, *middle, *after])` for events whose middle part (none of them collective
    spans) is given as its JSON text already: the items of a JSON list without its brackets ("" if none)."""
    comm = [ev for ev in (*before, *after) if ev.get("cat") == COMM_CAT]
    head = [ev for ev in before if ev.get("cat") != COMM_CAT]
    tail = [ev for ev in after if ev.get("cat") != COMM_CAT]
    parts = [json.dumps(head)[1:-1] if head else "", middle_json, json.dumps(tail)[1:-1] if tail else ""]
    shell = json.dumps({"rank": rank, "step": step, "comm": comm, "events": []})  # ends in '[]}'
    return f"{shell[:-2]}{', '.join(p for p in parts if p)}]}}\n"


def parse_chunk(line: str) -> Chunk | None:
    """The chunk of one line; None if the line was cut short (a rank killed while it wrote) or is not a chunk."""
    if not line.endswith("\n"):
        return None
    m = _HEAD.match(line)
    if m and line.endswith("]}\n"):
        try:
            comm, end = _DECODER.raw_decode(line, m.end())
        except ValueError:
            return None
        if isinstance(comm, list) and line.startswith(_EVENTS, end):
            step = None if m[2] == "null" else int(m[2])
            return Chunk(int(m[1]), step, comm, line[end + len(_EVENTS) : -3].strip())
    try:  # another layout: parse it whole
        doc = json.loads(line)
        events = [*doc.get("events", []), *doc.get("comm", [])]
        step = doc.get("step")
        chunk = chunk_line(int(doc["rank"]), None if step is None else int(step), events)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return parse_chunk(chunk) if _HEAD.match(chunk) else None


def read_chunks(path: Path) -> Iterator[Chunk]:
    """The chunks of one rank's file, in order, up to the first line cut short."""
    with open(path) as f:
        for line in f:
            chunk = parse_chunk(line)
            if chunk is None:
                return
            yield chunk


def write_merged(
    f: IO[str],
    files: Mapping[int, Path],
    *,
    comm_extra: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] | None = None,
    extra_events: Sequence[Mapping[str, Any]] = (),
    partial: bool = False,
    notes: Mapping[str, Any] | None = None,
) -> dict[int, int]:
    """Write the Chrome trace of the ranks' `files` (rank -> its chunk file) to `f`, rank by rank.

    `comm_extra(span)` gives arguments to add to a collective span (or None); `extra_events` go in after the
    ranks'. A `partial` trace says so in `otherData`, with the steps each rank finished; `notes` go there too.
    Returns the steps each rank finished."""
    steps: dict[int, int] = {}
    out = TraceWriter(f)
    for rank in sorted(files):
        steps[rank] = 0
        for chunk in read_chunks(files[rank]):
            steps[rank] += chunk.step is not None
            if chunk.rest:
                out.write_json(chunk.rest)
            for ev in chunk.comm:
                extra = comm_extra(ev) if comm_extra else None
                out.write({**ev, "args": {**ev.get("args", {}), **extra}} if extra else ev)
    for other in extra_events:
        out.write(dict(other))
    other_data = dict(notes or {})
    if partial:
        other_data.update(partial=True, steps_traced={str(r): n for r, n in steps.items()})
    out.close(other_data)
    return steps
