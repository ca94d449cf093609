"""A Chrome trace document's events read and written one at a time, never the whole document in memory.

`read_trace_events` yields the events of a trace.json as phantora writes it (`{"traceEvents": [...], ...}`, the
list first) while reading the file in blocks; `TraceWriter` writes one event after another and closes the document
with its notes (`otherData`). A run of several jobs copies each job's trace.json into its own this way
(`phantora.jobs.results.write_jobs_trace`): its memory is one block and one event, whatever the traces' size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from phantora.errors import InputError

BLOCK = 1 << 20  # characters read at a time
_HEAD = re.compile(r'\s*\{\s*"traceEvents"\s*:\s*\[')
_HEAD_CHARS = 64  # read before looking for the head
_BLANK = re.compile(r"[\s,]*")  # what separates two events (a comma and any white space)
_DECODER = json.JSONDecoder()


def read_trace_events(path: Path, block: int = BLOCK) -> Iterator[dict[str, Any]]:
    """The events of the trace document at `path`, in order. A document whose first key is not "traceEvents" is
    read whole (the list elsewhere: not phantora's layout); one cut short or not JSON is an InputError naming it."""
    with open(path, encoding="utf-8") as f:
        buf = f.read(block)
        while len(buf) < _HEAD_CHARS and (more := f.read(block)):
            buf += more
        head = _HEAD.match(buf)
        if head is None:
            f.seek(0)
            yield from _whole(path, f)
            return
        pos, eof = head.end(), False
        while True:
            pos = _BLANK.match(buf, pos).end()  # type: ignore[union-attr]  # (matches the empty string)
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                if pos == len(buf):
                    raise ValueError("the block ends here")
                ev, pos = _DECODER.raw_decode(buf, pos)
            except ValueError:
                if eof:
                    raise InputError("cut short, or not JSON", file=str(path), field="traceEvents") from None
                more = f.read(block)
                buf, pos, eof = buf[pos:] + more, 0, not more
                continue
            if not isinstance(ev, dict):
                raise InputError("a trace event that is not a JSON object", file=str(path))
            yield ev


def _whole(path: Path, f: IO[str]) -> Iterator[dict[str, Any]]:
    try:
        doc = json.load(f)
    except ValueError:
        raise InputError("trace document is not JSON", file=str(path)) from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list) or not all(isinstance(ev, dict) for ev in events):
        raise InputError("expected a trace document with a list of event objects", file=str(path), field="traceEvents")
    yield from events


class TraceWriter:
    """A trace document written an event at a time to `f`: `write` each event, then `close` with the notes."""

    def __init__(self, f: IO[str]) -> None:
        self._f, self._sep = f, ""
        f.write('{"traceEvents": [')

    def write(self, event: Mapping[str, Any]) -> None:
        self.write_json(json.dumps(event))

    def write_json(self, text: str) -> None:
        """Events already in JSON text: one event, or several as a list's items without its brackets."""
        self._f.write(self._sep + text)
        self._sep = ", "

    def close(self, notes: Mapping[str, Any] | None = None) -> None:
        """The end of the document: its time unit and, if any, `notes` as `otherData`."""
        self._f.write('], "displayTimeUnit": "ns"')
        if notes:
            self._f.write(', "otherData": ' + json.dumps(dict(notes)))
        self._f.write("}")
