"""CPU of planning a recording (`plan_graph`) or a workload (`plan_workload`), and a sha-256 of the plan, so two
trees can be run side by side and their plans compared byte for byte:

    PHANTORA_TREE=CLONE .venv/bin/python bench/bench_plan.py G --topology leafspine1024
    PHANTORA_TREE=CLONE .venv/bin/python bench/bench_plan.py workloads/ddp_buckets.toml --workload --topology T

The hash covers every flow's repr, then for a graph the step and end markers and every collective instance (key,
kind, group, bytes, start, flows, `rank_last`, NCCL's choice), for a workload each op's flows, start marker,
`rank_last` and NCCL's choice. `--profile N`: the N costliest functions under cProfile (own time).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("PHANTORA_TREE") or str(Path(__file__).resolve().parents[1]))

from phantora.egraph.format import load
from phantora.egraph.replay import algo_from_meta, plan_graph
from phantora.replay import plan_workload
from phantora.topology.loader import load_topology
from phantora.workload import load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="a recording (phantora run --record G), or a workload file with --workload")
    ap.add_argument("--topology", required=True)
    ap.add_argument("--workload", action="store_true", help="SOURCE is a workload (phantora replay W)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions")
    args = ap.parse_args()
    topo = load_topology(args.topology)
    prof = cProfile.Profile() if args.profile else None
    h = hashlib.sha256()
    if args.workload:
        wl = load_workload(args.source, world=topo.num_ranks)
        t0 = time.process_time()
        if prof:
            prof.enable()
        wplan = plan_workload(wl, topo)
        spent = time.process_time() - t0
        flows, what = wplan.flows, "plan_workload"
        rest = [repr((wplan.op_flows, wplan.op_start_marker, wplan.op_rank_last, wplan.op_choice))]
    else:
        graph = load(args.source)
        opts = algo_from_meta(graph)
        t0 = time.process_time()
        if prof:
            prof.enable()
        plan = plan_graph(graph, topo, opts)
        spent = time.process_time() - t0
        flows, what = plan.flows, "plan_graph"
        rest = [repr(plan.step_markers), repr(plan.end_markers)]
        rest += [
            repr((i.key, i.kind, i.group, i.nbytes, i.start, i.flows, sorted(i.rank_last.items()), i.choice))
            for i in plan.instances
        ]
    if prof:
        prof.disable()
    for f in flows:
        h.update(repr(f).encode())
    for text in rest:
        h.update(text.encode())
    print(f"{what} {spent:.2f} CPU s, {len(flows):,} flows, sha-256 {h.hexdigest()[:16]}")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
