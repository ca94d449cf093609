"""The plain decomposition driver's instructions by method, under callgrind (issue 38, item 2).

`run` is one `bench_whole_dag_driver.py --one CASE DRIVER` run in this process with a mark, ``os.getsid(0)``, at the
entry and exit of the replay and of the driver's methods below, and the marks' order written to LOG (JSON). Under
``valgrind --tool=callgrind --dump-before=getsid`` each mark ends one dump part, so `sum` can give each part to the
innermost method then running (exclusive counts) and the driver between rounds: the replay less the fluid side's run
ahead (`meanwhile`, while the workers run) and what runs inside it. Nothing else in the driver calls getsid; the
workers are not traced (their silence limit is raised here: the driver runs about 50 times slower)::

    cd CLONE && PYTHONPATH=CLONE valgrind --tool=callgrind --dump-before=getsid --callgrind-out-file=D/cg.%p \\
        .venv/bin/python bench/driver_marks.py run replay:64MiB plain D/events.json
    .venv/bin/python bench/driver_marks.py sum D D/events.json

`cpu CASE DRIVER` is the same run untraced, each part's CPU seconds (`time.process_time` at each mark) given to the
innermost method the same way and printed (indications: the load moves them)::

    cd CLONE && PYTHONPATH=CLONE .venv/bin/python bench/driver_marks.py cpu moe:16MiB plain
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install
sys.path.insert(0, str(Path(__file__).resolve().parent))

from callgrind_out import instructions  # (this directory's, after the path above)

MARKED = [  # (module, class or None, method, label)
    ("phantora.replay", None, "replay_inprocess", "replay"),
    ("phantora.replay", None, "plan_workload", "planning"),
    ("phantora.replay", None, "plan_split_by", "planning: the groups sent to the workers and their replies taken"),
    ("phantora.netsim.hybrid", "FluidNvlinkSimulator", "run_ahead", "meanwhile"),
    ("phantora.netsim.hybrid", "FluidNvlinkSimulator", "submit", "first submit (hybrid)"),
    ("phantora.netsim.decompose", "DecomposedSimulator", "_book", "books"),
    ("phantora.netsim.decompose", "DecomposedSimulator", "_hand_over", "hand over"),
    ("phantora.netsim.decompose", "DecomposedSimulator", "_horizon", "horizon"),
    ("phantora.netsim.decompose", "DecomposedSimulator", "_gathered", "replies: completions"),
    ("phantora.netsim.decompose", "DecomposedSimulator", "_bounds", "replies: bounds"),
    ("phantora.netsim.decompose", "DecomposedSimulator", "open_outer", "open_outer"),
]


def run(case: str, driver: str, log: Path | None) -> None:
    """The bench's run, marked; the marks' (label, entered) in order into `log`; without `log`, each part's CPU
    seconds given to the innermost method running then, printed."""
    import importlib

    import bench_whole_dag_driver as bench

    import bridge.workers

    bridge.workers.WORKER_PEER_TIMEOUT_S = 3600.0  # (a driver under valgrind is slow to send its rounds)
    events: list[tuple[str, int]] = []
    cpu: list[float] = []
    for module, cls, name, label in MARKED:
        owner: Any = importlib.import_module(module)
        if cls is not None:
            owner = getattr(owner, cls)
        setattr(owner, name, _marked(getattr(owner, name), label, events, None if log else cpu))
    bench.one(case, driver)
    if log is not None:
        log.write_text(json.dumps(events))
        return
    acc: dict[str, float] = collections.defaultdict(float)
    stack = ["(outside)"]
    for (label, entered), t0, t1 in zip(events, cpu, cpu[1:] + [cpu[-1]], strict=True):
        if entered:
            stack.append(label)
        else:
            stack.pop()
        acc[stack[-1]] += t1 - t0
    parts = sorted(acc.items(), key=lambda kv: -kv[1])
    print("CPU s by method (exclusive): " + ", ".join(f"{k} {v:.3f}" for k, v in parts))


def _marked(f: Any, label: str, events: list[tuple[str, int]], cpu: list[float] | None) -> Any:
    mark = os.getsid if cpu is None else lambda _: cpu.append(time.process_time())

    @functools.wraps(f)
    def w(*a: Any, **k: Any) -> Any:
        events.append((label, 1))
        mark(0)
        try:
            return f(*a, **k)
        finally:
            events.append((label, 0))
            mark(0)

    return w


def parts(d: Path) -> list[int]:
    """The instructions of each dump part of the one process in `d`, in order (the last: after the last mark)."""
    got: dict[int, int] = {}
    last = 0
    for f in d.glob("cg.*"):
        m = re.fullmatch(r"cg\.(\d+)(?:\.(\d+))?", f.name)
        if m is None:
            continue
        total = instructions(f)
        if m.group(2) is None:
            last = total
        else:
            got[int(m.group(2))] = total
    return [got[i] for i in range(1, len(got) + 1)] + [last]


def summary(d: Path, log: Path) -> None:
    """Each part given to the innermost marked method running then; the driver between rounds."""
    events = json.loads(log.read_text())
    seq = parts(d)
    if len(seq) != len(events) + 1:
        raise SystemExit(f"{d}: {len(seq)} dump parts for {len(events)} marks (one process's files only)")
    acc: collections.Counter[str] = collections.Counter()
    stack = ["(before the replay)"]
    inside = 0
    for i, x in enumerate(seq):
        acc[stack[-1]] += x
        inside += x if "meanwhile" in stack else 0
        if i < len(events):
            label, entered = events[i]
            if entered:
                stack.append(label)
            else:
                stack.pop()
            if label == "replay" and not entered:
                stack = ["(after the replay)"]
    replay = sum(v for k, v in acc.items() if not k.startswith("("))
    print(f"replay {replay / 1e9:.3f} G: " + ", ".join(f"{k} {v / 1e9:.3f}" for k, v in acc.most_common()))
    print(f"between rounds {(replay - inside) / 1e9:.3f} G; meanwhile with what runs inside it {inside / 1e9:.3f} G")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("case")
    r.add_argument("driver")
    r.add_argument("log", type=Path)
    c = sub.add_parser("cpu")
    c.add_argument("case")
    c.add_argument("driver")
    s = sub.add_parser("sum")
    s.add_argument("dir", type=Path)
    s.add_argument("log", type=Path)
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.case, a.driver, a.log)
    elif a.cmd == "cpu":
        run(a.case, a.driver, None)
    else:
        summary(a.dir, a.log)


if __name__ == "__main__":
    main()
