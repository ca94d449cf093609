"""`phantora replay WORKLOAD --topology T`: time a list of collectives on a simulated cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

from phantora.collectives.spec import ALGORITHMS, AlgoOptions
from phantora.netsim.factory import NETWORKS, make_engine
from phantora.units import parse_size_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a workload of collectives on a topology", description=__doc__)
    p.add_argument("workload", help="workload file (.toml or .json, see docs/workload.md)")
    p.add_argument("--topology", "-t", required=True, help="topology file or shipped name (e.g. testbed16)")
    p.add_argument("--network", choices=NETWORKS, default="flow", help="network engine (default: flow)")
    p.add_argument("--cc", default=None, help="ns3 only: congestion control (none, dcqcn, hpcc, timely, dctcp)")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="auto", help="default collective algorithm")
    p.add_argument("--granularity", choices=("coarse", "chunked"), default="coarse")
    p.add_argument("--channels", type=int, default=0, help="rings per collective (0 = NCCL-like default)")
    p.add_argument("--chunk", default="2MiB", help="chunk size of the chunked granularity")
    p.add_argument("--out", "-o", type=Path, default=None, help="write results.json, flows.csv, links.csv here")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from phantora.replay import replay_inprocess
    from phantora.report.replay_report import format_table, write_replay_outputs
    from phantora.topology import load_topology
    from phantora.workload import load_workload

    topo = load_topology(args.topology)
    wl = load_workload(args.workload, world=topo.num_ranks)
    bad = wl.max_rank
    if bad >= topo.num_ranks:
        topo.node_of_rank(bad)  # raises the clear "rank outside the topology" error
    base = AlgoOptions(args.algorithm, args.granularity, args.channels, parse_size_bytes(args.chunk))
    options = {"cc": args.cc} if args.network == "ns3" and args.cc else {}
    sim = make_engine(args.network, topo, **options)
    try:
        progress = args.progress if args.progress is not None else len(wl.ops) > 20
        res = replay_inprocess(wl, topo, sim, base, progress=progress)
    finally:
        sim.close()
    print(f"workload {wl.name} on {topo.name} ({topo.num_ranks} ranks), network {args.network}")
    print(format_table(res))
    if args.out:
        paths = write_replay_outputs(args.out, res, workload=wl.name, topology=topo, network=args.network)
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
