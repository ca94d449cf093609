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

`split CASE [--reps N] [--workers 1 2 8]` plans a workload case (``replay:SIZE``, ``moe:SIZE``) both ways in this
process, side by side (docs/packet-model.md "What moves where" (a)): in one process, then by its independent groups
of ops (`phantora.plan_split`): each group's job through msgpack and `bridge.plan_groups.group_reply` as a worker
would run it (its CPU: the job decoded, planned, its reply packed), then the driver's part (the replies decoded,
moved to the plan's ids, the markers: `replay.plan_split_by`); all three with the cyclic GC paused, as the replay
plans (`gc_paused`). It prints each part's best CPU, both keys (equal, or it fails), and on paper for W workers (the
groups dealt round-robin): the busiest worker's CPU plus the driver's, against one process's. Under callgrind (as
`run`, with ``--reps 1``), dump part 2 is the one-process plan, parts 5, 7, ... the groups and parts 4, 6, ... up to
the one after the last group the driver's part.
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
    SPLIT_INPUTS[case] = (wl, topo, opts)
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


def split(case: str, reps: int, workers: list[int]) -> None:
    """Plan CASE in one process and split by independent op groups, side by side (`reps` rounds, best CPU of each
    part), and print the parts, the keys and the on-paper planning path for each W of `workers`."""
    import msgpack

    from bridge.plan_groups import group_reply
    from phantora.netsim.gc_pause import gc_paused
    from phantora.replay import plan_split_by

    plan, rest = planner(case)
    wl, topo, opts = SPLIT_INPUTS[case]
    best_one, best_driver = float("inf"), float("inf")
    best_groups: list[float] = []
    one_key = split_key = ""
    for _ in range(max(reps, 1)):
        c0 = time.process_time()
        os.getsid(0)
        with gc_paused():  # (as `replay.plan_for` plans in one process)
            one = plan()
        os.getsid(0)
        best_one = min(best_one, time.process_time() - c0)
        one_key = key(one, rest)
        packed: list[bytes] = []
        cpus: list[float] = []

        def run(jobs: list[dict[str, object]], packed: list[bytes] = packed, cpus: list[float] = cpus) -> Any:
            for job in jobs:
                raw = msgpack.packb(job)  # (the driver's send: counted in its part)
                c1 = time.process_time()
                os.getsid(0)
                with gc_paused():  # (as the worker's server plans: `bridge.netserver`)
                    packed.append(msgpack.packb(group_reply(topo, msgpack.unpackb(raw)), use_bin_type=True))
                os.getsid(0)
                cpus.append(time.process_time() - c1)
            return [msgpack.unpackb(b, strict_map_key=False) for b in packed]

        c0 = time.process_time()
        os.getsid(0)
        got = plan_split_by(wl, topo, opts, run)
        os.getsid(0)
        total = time.process_time() - c0
        if got is None:
            print(f"{case}: {len(wl.ops)} ops in one group of shared ranks (or not sent): not split")
            return
        split_key = key(got, rest)
        best_driver = min(best_driver, total - sum(cpus))
        best_groups = cpus if not best_groups else [min(a, b) for a, b in zip(best_groups, cpus, strict=True)]
    print(f"{case}: {len(one.flows):,} flows; one process {best_one:.3f} s CPU, key {one_key}")
    print(
        f"  split: {len(best_groups)} groups, each {min(best_groups):.3f}-{max(best_groups):.3f} s (sum "
        f"{sum(best_groups):.3f}), the driver's part {best_driver:.3f} s, key {split_key}"
    )
    if split_key != one_key:
        raise SystemExit("the split plan's key differs from one process's")
    for w in workers:
        busiest = max(sum(best_groups[i::w]) for i in range(w))
        path = busiest + best_driver
        print(
            f"  workers={w}: busiest {busiest:.3f} + driver {best_driver:.3f} = {path:.3f} s: "
            f"{best_one / path:.2f}x one process"
        )


SPLIT_INPUTS: dict[str, tuple[Any, Any, Any]] = {}  # case -> (workload, topology, options), kept by `planner`


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
    sp = sub.add_parser("split")
    sp.add_argument("case")
    sp.add_argument("--reps", type=int, default=3)
    sp.add_argument("--workers", type=int, nargs="+", default=[1, 2, 8])
    s = sub.add_parser("sum")
    s.add_argument("dir", type=Path)
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.case, a.reps)
    elif a.cmd == "split":
        split(a.case, a.reps, a.workers)
    else:
        parts(a.dir)


if __name__ == "__main__":
    main()
