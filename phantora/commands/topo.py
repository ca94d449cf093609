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
        if written:
            print("wrote " + ", ".join(written))
    return 0


def _pieces(topo: Topology) -> int:
    """How many link-disjoint pieces with GPUs the fabric has (`--set workers=N` runs them in parallel)."""
    from phantora.netsim.pieces import NO_PIECE, fabric_pieces

    pieces = fabric_pieces(topo)
    return len({pieces[e] for e in topo.endpoints} - {NO_PIECE})
