"""The plain decomposition driver's critical path by instructions, its workers traced too (issue 38, item 2).

`run` is `bench/driver_marks.py`'s run with two marks more: each round (`DecomposedSimulator._rounded`) and the
completions built while the workers run (`_while_round`). Traced with the workers (``--trace-children=yes``, and
`bench/worker_marks` on the PYTHONPATH: its sitecustomize makes each round a worker serves one dump part, from its post
reaching the engine to its completions put in columns), `crit` lines each round of the driver up with its workers'
and gives the critical path on free cores as the bench counts CPU (`DecomposedSimulator.overlap_cpu_s`): the driver's
work alone, plus per round the larger of its busiest worker's round and the driver's work beside it (the fluid side's
run ahead, `meanwhile`, with what runs inside it; the completions built meanwhile; in the placing round, the books of
a large first batch, `_placing`). Workers under valgrind start slowly: give them time::

    cd CLONE && PHANTORA_STARTUP_TIMEOUT_S=7200 PYTHONPATH=CLONE:CLONE/bench/worker_marks valgrind --tool=callgrind \\
        --trace-children=yes --dump-before=getsid --callgrind-out-file=D/cg.%p \\
        .venv/bin/python bench/driver_critical.py run replay:64MiB plain D/events.json
    .venv/bin/python bench/driver_critical.py crit D D/events.json
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import driver_marks  # (this directory's, after the path above)
from callgrind_out import instructions

ROUND_MARKS = [
    ("phantora.netsim.decompose", "DecomposedSimulator", "_rounded", "round"),
    ("phantora.netsim.decompose", "DecomposedSimulator", "_while_round", "built meanwhile"),
]
BESIDE = ("meanwhile", "built meanwhile", "books")  # a round's driver work beside its workers (books: placing)


def run(case: str, driver: str, log: Path) -> None:
    """`driver_marks.run` with the rounds marked too."""
    driver_marks.MARKED.extend(ROUND_MARKS)
    driver_marks.run(case, driver, log)


def parts_by_process(d: Path) -> dict[int, list[int]]:
    """Per process (pid) in `d`, the instructions of each of its dump parts in order (the last: after its last mark)."""
    got: dict[int, dict[int, int]] = {}
    for f in d.glob("cg.*"):
        m = re.fullmatch(r"cg\.(\d+)(?:\.(\d+))?", f.name)
        if m is None:
            continue
        total = instructions(f)
        got.setdefault(int(m.group(1)), {})[int(m.group(2) or 0)] = total
    return {pid: [p[i] for i in range(1, len(p))] + [p.get(0, 0)] for pid, p in got.items()}


def critical(d: Path, log: Path) -> tuple[int, int, list[int], list[int]]:
    """(the driver's replay, its work alone, per round its work beside the workers, per round the busiest worker's)."""
    events = json.loads(log.read_text())
    procs = parts_by_process(d)
    mine = [pid for pid, seq in procs.items() if len(seq) == len(events) + 1]
    if len(mine) != 1:
        got = {p: len(s) for p, s in procs.items()}
        raise SystemExit(f"{d}: no one process with {len(events) + 1} dump parts, one a mark (parts by pid: {got})")
    seq = procs.pop(mine[0])
    stack: list[str] = []
    replay = 0
    beside: list[int] = []
    for i, x in enumerate(seq):
        if "replay" in stack:
            replay += x
            if "round" in stack and any(b in stack for b in BESIDE):
                beside[-1] += x
        if i < len(events):
            label, entered = events[i]
            if entered:
                stack.append(label)
                beside += [0] if label == "round" else []
            else:
                stack.pop()
    # a worker's parts: its start, then per round it serves the round (post to columns) and what follows it
    workers = {pid: s[1:-1:2] for pid, s in procs.items() if len(s) >= 3 and len(s) % 2}
    if not workers or any(len(r) != len(beside) for r in workers.values()):
        got = {pid: len(r) for pid, r in workers.items()}
        raise SystemExit(f"{d}: the driver ran {len(beside)} rounds, its traced workers served {got} (all, in each)")
    busiest = [max(r[k] for r in workers.values()) for k in range(len(beside))]
    return replay, replay - sum(beside), beside, busiest


def show(d: Path, log: Path) -> None:
    replay, alone, beside, busiest = critical(d, log)
    rounds = sum(map(max, busiest, beside))
    print(
        f"driver's replay {replay / 1e9:.3f} G: alone {alone / 1e9:.3f}, beside its workers {sum(beside) / 1e9:.3f} "
        f"({len(beside)} rounds); the busiest workers {sum(busiest) / 1e9:.3f} G; critical path {alone / 1e9:.3f} + "
        f"{rounds / 1e9:.3f} = {(alone + rounds) / 1e9:.3f} G"
    )
    top = collections.Counter({k: b for k, b in enumerate(busiest)}).most_common(3)
    print("largest rounds (index: busiest worker G): " + ", ".join(f"{k}: {b / 1e9:.3f}" for k, b in top))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("case")
    r.add_argument("driver")
    r.add_argument("log", type=Path)
    c = sub.add_parser("crit")
    c.add_argument("dir", type=Path)
    c.add_argument("log", type=Path)
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.case, a.driver, a.log)
    else:
        show(a.dir, a.log)


if __name__ == "__main__":
    main()
