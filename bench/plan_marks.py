"""Planning alone (collective -> flow DAG), by instructions, CPU and a key of the planned flows (issue 38, item 2).

`run CASE [--reps N]` plans CASE N times in this process (``replay:SIZE`` and ``moe:SIZE``: `plan_workload` of
`bench_whole_dag_driver.py`'s workloads, chunked, rail128; a directory: `plan_graph` of a recorded execution graph on
rail128), with a mark, ``os.getsid(0)``, before and after each plan, and prints the best CPU and a key of the plan:
sha256 of every flow's fields in order with the ops' flow ranges, start markers, last flows and NCCL choices (a
workload) or the step and end markers and the instances' choices (a graph), 16 hex digits, which must not change.
Under ``valgrind --tool=callgrind --dump-before=getsid`` each plan is one dump part; `sum DIR` prints the parts (the
plans are parts 2, 4, ...)::

    cd CLONE && PYTHONPATH=CLONE valgrind --tool=callgrind --dump-before=getsid --callgrind-out-file=D/cg.%p \\
        .venv/bin/python bench/plan_marks.py run replay:64MiB --reps 2
    .venv/bin/python bench/plan_marks.py sum D
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install
sys.path.insert(0, str(Path(__file__).resolve().parent))

from callgrind_out import instructions  # (this directory's, after the path above)

ROOT = Path(__file__).resolve().parents[1]

WORKLOADS = {"replay": ("rail_allreduce.toml", 'bytes = "8MiB"'), "moe": ("moe_rail_alltoall.toml", 'bytes = "16MiB"')}


def planner(case: str) -> tuple[Callable[[], Any], Callable[[Any], tuple[Any, ...]]]:
    """A call that plans CASE, and what of its plan besides the flows goes into the key."""
    from phantora.topology.loader import load_topology

    topo = load_topology("rail128")
    if Path(case).is_dir():
        from phantora.egraph.format import load
        from phantora.egraph.replay import algo_from_meta, plan_graph

        graph = load(case)
        algo = algo_from_meta(graph)
        return lambda: plan_graph(graph, topo, algo), lambda p: (
            p.step_markers, p.end_markers, p.markers, [(i.kind, i.choice) for i in p.instances])  # fmt: skip
    from phantora.collectives.spec import AlgoOptions
    from phantora.replay import plan_workload
    from phantora.workload import load_workload

    kind, _, size = case.partition(":")
    if kind not in WORKLOADS or not size:
        raise SystemExit(f"case {case!r}: replay:SIZE, moe:SIZE or a recorded graph's directory")
    name, line = WORKLOADS[kind]
    src = (ROOT / "workloads" / name).read_text()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(src.replace(line, f'bytes = "{size}"'))
        wl = load_workload(path, world=topo.num_ranks)
    opts = AlgoOptions(granularity="chunked")
    return lambda: plan_workload(wl, topo, opts), lambda p: (p.op_flows, p.op_start_marker, p.op_rank_last, p.op_choice)


def key(plan: Any, rest: Callable[[Any], tuple[Any, ...]]) -> str:
    """sha256 of every flow's fields, in order, and `rest(plan)`; 16 hex digits."""
    h = hashlib.sha256()
    for f in plan.flows:
        h.update(repr((type(f).__name__, *(getattr(f, x.name) for x in dataclasses.fields(f)))).encode())
    h.update(repr(rest(plan)).encode())
    return h.hexdigest()[:16]


def run(case: str, reps: int) -> None:
    """Plan CASE `reps` times between getsid marks (one callgrind dump part each) and print the best CPU seconds
    and the plan's key."""
    plan, rest = planner(case)
    if reps < 1:
        raise SystemExit(f"--reps {reps}: at least 1")
    best, got = float("inf"), None
    for _ in range(reps):
        c0 = time.process_time()
        os.getsid(0)
        got = plan()
        os.getsid(0)
        best = min(best, time.process_time() - c0)
    assert got is not None  # reps >= 1
    print(f"{case}: {len(got.flows):,} flows, planning CPU best of {reps} {best:.3f} s, key {key(got, rest)}")


def parts(d: Path) -> None:
    """The instructions of each dump part of the callgrind files in `d`, in order."""
    for f in sorted(d.glob("cg.*"), key=lambda p: [int(x) for x in re.findall(r"\d+", p.name)]):
        total = instructions(f)
        print(f"{f.name} {total / 1e9:.3f} G")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("case")
    r.add_argument("--reps", type=int, default=3)
    s = sub.add_parser("sum")
    s.add_argument("dir", type=Path)
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.case, a.reps)
    else:
        parts(a.dir)


if __name__ == "__main__":
    main()
