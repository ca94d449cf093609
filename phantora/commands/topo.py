"""`phantora topo FILE`: summarise a topology (TOML, HPCC, SimAI or a shipped name), draw or convert it;
`phantora topo --list`: the shipped topologies."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phantora.topology.model import Topology


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topo", help="summarise, draw or convert a topology", description=__doc__)
    p.add_argument("file", nargs="?", help="topology file or shipped name (e.g. testbed16, hpcc/star8)")
    p.add_argument("--list", action="store_true", help="list the shipped topologies and where they are")
    p.add_argument("--format", choices=("toml", "hpcc", "simai"), default=None, help="file format (default: sniff)")
    p.add_argument("--draw", type=Path, metavar="OUT.png", help="draw the topology to this image file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON, with every node's id and name")
    p.add_argument("--route", nargs=2, type=int, metavar=("SRC", "DST"), help="also show the route between two ranks")
    p.add_argument("--key", type=int, default=0, help="flow key (ECMP hash input) for --route (default 0)")
    p.add_argument("--no-bisection", action="store_true", help="skip the max-flow bisection computation")
    p.add_argument(
        "--partition", type=int, metavar="N", help="show the N switch groups parallel packet simulation would use"
    )
    p.add_argument(
        "--traffic", metavar="GRAPH", help="with --partition: weigh links by a recorded graph's traffic (--record DIR)"
    )
    p.add_argument("--write-hpcc", type=Path, metavar="OUT", help="write the topology in the HPCC format")
    p.add_argument("--write-simai", type=Path, metavar="OUT", help="write the topology in the SimAI format")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from phantora.errors import InputError
    from phantora.topology import load_topology, shipped_dir, shipped_names, write_hpcc, write_simai
    from phantora.topology.describe import describe, format_description, node_table, route_info

    if args.list:
        print(f"shipped topologies in {shipped_dir()}:")
        for name in shipped_names():
            print(f"  {name}")
        return 0
    if args.file is None:
        raise InputError("give a topology file or shipped name, or --list for the shipped ones")
    topo = load_topology(args.file, args.format)
    info = describe(topo, bisection=not args.no_bisection)
    info["decomposition_pieces"] = _pieces(topo)
    if args.route:
        for rank in args.route:
            topo.node_of_rank(rank)  # a clear error for a rank outside the topology
        info["route"] = route_info(topo, args.route[0], args.route[1], args.key)
        info.setdefault("example_routes", []).append(info["route"])
    if args.traffic and not args.partition:
        raise InputError("--traffic weighs a partition: give --partition N too", field="traffic")
    if args.partition:
        info["partition"] = _partition(topo, args.partition, args.traffic)
    written = []
    if args.write_hpcc:
        write_hpcc(topo, args.write_hpcc)
        written.append(str(args.write_hpcc))
    if args.write_simai:
        write_simai(topo, args.write_simai)
        written.append(str(args.write_simai))
    if args.draw:
        from phantora.topology.draw import draw_topology

        written.append(str(draw_topology(topo, args.draw)))
    if args.json:
        info.pop("route", None)
        info["node_table"] = node_table(topo)  # the id <-> name map of the run directories' files
        json.dump(info, sys.stdout, indent=2)
        print()
    else:
        print(format_description(info))
        n = info["decomposition_pieces"]
        print(f"  pieces       {n} link-disjoint (nvlink=fluid): --set workers={n} if no flow crosses them")
        if "partition" in info:
            print(format_partition(info["partition"]))
        if written:
            print("wrote " + ", ".join(written))
    return 0


def _pieces(topo: Topology) -> int:
    """How many link-disjoint pieces with GPUs the fabric has (`--set workers=N` runs them in parallel)."""
    from phantora.netsim.pieces import NO_PIECE, fabric_pieces

    pieces = fabric_pieces(topo)
    return len({pieces[e] for e in topo.endpoints} - {NO_PIECE})


def _partition(topo: Topology, n: int, traffic: str | None) -> dict[str, object]:
    """The partition into n switch groups as a JSON-able summary (phantora.netsim.partition)."""
    from phantora.netsim.partition import INF_NS, partition_fabric
    from phantora.topology.describe import TIER_NAMES

    flows = None
    if traffic:
        from phantora.egraph.format import load
        from phantora.egraph.replay import algo_from_meta, plan_graph

        graph = load(traffic)
        flows = plan_graph(graph, topo, algo_from_meta(graph)).flows
    p = partition_fabric(topo, n, flows)
    total = sum(p.loads) or 1.0
    groups = []
    for g in range(p.n):
        members = p.members(g)
        switches = [topo.nodes[v] for v in members if topo.nodes[v].kind == "switch"]
        tiers: dict[str, int] = {}
        for node in sorted(switches, key=lambda x: x.tier):
            name = TIER_NAMES.get(node.tier, f"tier{node.tier}")
            tiers[name] = tiers.get(name, 0) + 1
        groups.append(
            {
                "group": g,
                "switches": [node.name for node in switches],
                "switches_by_tier": tiers,
                "endpoints": sum(1 for v in members if v in topo.endpoint_set),
                "load_share": p.loads[g] / total,
            }
        )
    cut = [topo.links[i] for i in p.cut_links]
    return {
        "n": p.n,
        "weighted_by": f"traffic of {traffic}" if traffic else "link capacity",
        "groups": groups,
        "cut_links": len(cut),
        "cut_link_names": [f"{topo.nodes[lk.a].name}-{topo.nodes[lk.b].name}" for lk in cut],
        "lookahead_ns": None if p.lookahead_ns == INF_NS else p.lookahead_ns,
        "cut_weight": p.cut_weight,
    }


def format_partition(part: dict) -> str:
    """The partition summary as text: one line per group, then the cut and its least latency (the lookahead)."""
    lines = [f"  partition    {part['n']} switch groups, weighed by {part['weighted_by']}"]
    for g in part["groups"]:
        sw = g["switches"]
        tiers = ", ".join(f"{c} {t}" for t, c in g["switches_by_tier"].items())
        shown = ", ".join(sw[:4]) + (", ..." if len(sw) > 4 else "")
        lines.append(
            f"    group {g['group']:<3} {g['load_share']:6.1%} of the work, {g['endpoints']} NICs, {tiers}: {shown}"
        )
    la = part["lookahead_ns"]
    lines.append(
        f"    cut links  {part['cut_links']}; min cut-link latency (lookahead) "
        + ("none (nothing cut)" if la is None else f"{la} ns")
    )
    return "\n".join(lines)
