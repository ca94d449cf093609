"""The compute ops' spans of a rank's trace chunk as JSON text, formatted straight from the recorded tuples.

`compute_spans_json(ops, pid, tid)` is `json.dumps([span, ...])` without its brackets, where each span is the dict
`runtime/trace._span` makes for a compute op: {"name", "cat": "compute", "ph": "X", "pid", "tid", "ts", "dur"}, its
times in µs (ns / 1000.0). A traced run records every op of its first steps, so the dicts and their encoding were
about 2 µs an op of a rank's CPU; formatted here, each op's text is one string built from its name's encoded prefix
(made once per name) and the two floats' repr, which is what `json.dumps` writes for a finite float.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

_FLOAT_REPR = float.__repr__  # json's own spelling of a finite float


def compute_spans_json(ops: Sequence[tuple[Any, Any, Any]], pid: int, tid: int) -> str:
    """`json.dumps` of the compute spans of `ops` ((name, start ns, end ns) each) without the list's brackets; ""
    for none. Times that are not ints take json's own path (the same text, slower)."""
    if not ops:
        return ""
    rest = f', "cat": "compute", "ph": "X", "pid": {json.dumps(pid)}, "tid": {json.dumps(tid)}, "ts": '
    prefixes: dict[str, str] = {}
    out: list[str] = []
    add = out.append
    for name, start, end in ops:
        if type(start) is int and type(end) is int and type(name) is str:
            prefix = prefixes.get(name)
            if prefix is None:
                prefix = prefixes[name] = '{"name": ' + json.dumps(name) + rest
            add(f'{prefix}{_FLOAT_REPR(start / 1000.0)}, "dur": {_FLOAT_REPR((end - start) / 1000.0)}}}')
        else:
            span = {"name": name, "cat": "compute", "ph": "X", "pid": pid, "tid": tid, "ts": start / 1000.0}
            span["dur"] = (end - start) / 1000.0
            add(json.dumps(span))
    return ", ".join(out)
