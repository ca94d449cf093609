"""What the callgrind benches share: the counts of a callgrind output file (its `events:` names and its
`summary:` or `totals:` line)."""

from __future__ import annotations

import re
from pathlib import Path


def totals(prof: Path) -> dict[str, int]:
    """The `events:` names and `summary:` (or `totals:`, the last one read) counts of a callgrind output file;
    SystemExit naming the file when it has neither."""
    names: list[str] = []
    counts: list[int] = []
    for line in prof.read_text().splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif re.match(r"(summary|totals):", line):
            counts = [int(x) for x in line.split()[1:]]
    if not names or not counts:
        raise SystemExit(f"{prof}: no events / summary line")
    return dict(zip(names, counts, strict=False))


def instructions(prof: Path) -> int:
    """The instructions (the first event, Ir) of a callgrind output file or dump part."""
    return next(iter(totals(prof).values()))
