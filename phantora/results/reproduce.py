"""Did a rerun reproduce a run? Its simulated figures compared with the original's, exactly.

Compared: the summary document (results.json, or summary.json of `phantora netsim`) with its wall-clock
figures left out (any key naming `wall`), a run's CPU seconds (`run.cpu_s`), and the engine's `events` counter
(ns-3 counts its own stop events in it, one or two per progress update, so it follows the progress display, not the
simulation), and every per-flow, per-link and trace file the original wrote, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from phantora.results import schema as S

SUMMARIES = (S.RESULTS_JSON, S.SUMMARY_JSON)
TABLES = (
    S.FLOWS_CSV,
    S.LINKS_CSV,
    S.PFC_CSV,
    S.QUEUES_CSV,
    S.DROPS_CSV,
    S.CNPS_CSV,
    S.ECN_CSV,
    S.FCT_TXT,
    S.PFC_TXT,
    S.NS3_CALLS_TXT,
)
NOT_SIMULATED = ("events", "cpu_s")  # counters that are not figures of the simulation (see the module docstring)


def simulated(value: Any) -> Any:
    """`value` without its wall-clock figures and NOT_SIMULATED counters, at any depth."""
    if isinstance(value, dict):
        return {k: simulated(v) for k, v in value.items() if "wall" not in k and k not in NOT_SIMULATED}
    if isinstance(value, list):
        return [simulated(v) for v in value]
    return value


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two JSON values first differ, e.g. `makespan_ns: 120 vs 125`."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(a.keys() | b.keys()):
            if k not in a or k not in b:
                return f"{path}{k}: only in the {'original' if k in a else 'rerun'}"
            d = first_difference(a[k], b[k], f"{path}{k}.")
            if d is not None:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = first_difference(x, y, f"{path[:-1]}[{i}].")
            if d is not None:
                return d
        return None
    return None if a == b else f"{path[:-1] or '(document)'}: {a!r} vs {b!r}"


def compare(original: Path, rerun: Path) -> tuple[list[str], list[str]]:
    """(the files that match, one line per difference) between two run directories."""
    same: list[str] = []
    diffs: list[str] = []
    for name in SUMMARIES:
        if not (original / name).is_file():
            continue
        if not (rerun / name).is_file():
            diffs.append(f"{name}: not written by the rerun")
            continue
        a, b = (simulated(json.loads((d / name).read_text())) for d in (original, rerun))
        d = first_difference(a, b)
        if d is None:
            same.append(f"{name} figures")
        else:
            diffs.append(f"{name}: {d}")
    for name in TABLES:
        if not (original / name).is_file():
            continue
        if not (rerun / name).is_file():
            diffs.append(f"{name}: not written by the rerun")
        elif (original / name).read_bytes() == (rerun / name).read_bytes():
            same.append(name)
        else:
            diffs.append(f"{name}: differs")
    return same, diffs
