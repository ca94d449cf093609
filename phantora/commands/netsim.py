"""`phantora netsim --topology T --flows F`: run an HPCC flow file on the packet (ns-3) or flow network.

Writes fct.csv, fct.txt (HPCC fields + flow id), pfc.csv, pfc.txt, queues.csv, links.csv and summary.json
to --out. `--network flow` runs the same input through the flow-level engine for comparison (its FCT
is the last byte's arrival; it has no ACKs, PFC or queues).
"""

from __future__ import annotations

import argparse
import json
import time
from itertools import groupby
from pathlib import Path
from typing import Any

from phantora.netsim.hpcc_io import FctLine, HpccFlow, read_hpcc_flows, write_fct_txt, write_pfc_txt
from phantora.netsim.packet_config import CC_NAMES, PacketConfig, apply_overrides, read_hpcc_config
from phantora.report.packet_traces import (
    LINK_EXTRA_COLUMNS,
    write_csv,
    write_drops_csv,
    write_pfc_csv,
    write_queues_csv,
)
from phantora.topology.model import Topology


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("netsim", help="run an HPCC flow file on the ns-3 or flow network", description=__doc__)
    p.add_argument("--topology", "-t", required=True, help="topology file (HPCC, SimAI, TOML) or shipped name")
    p.add_argument("--flows", "-f", required=True, help="HPCC flow file")
    p.add_argument("--network", choices=("ns3", "flow"), default="ns3", help="network engine (default: ns3)")
    p.add_argument("--cc", choices=CC_NAMES, default=None, help="congestion control (ns3; overrides the config)")
    p.add_argument("--config", "-c", default=None, help="HPCC config.txt (phantora PacketConfig fields also allowed)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a PacketConfig field")
    p.add_argument("--queue-sample-ns", type=int, default=None, help="sample switch queues every N ns (ns3)")
    p.add_argument("--out", "-o", type=Path, default=None, help="directory for the traces")
    p.set_defaults(func=run)


def standalone_fct_ns(topo: Topology, src: int, dst: int, key: int, size: int, payload: int, header: int) -> int:
    """HPCC's ideal FCT: 2 x propagation + a payload's serialisation per hop + all bytes with headers at the
    path's bottleneck rate (integer ns, rounded down like the C++ fabric)."""
    if src == dst or size == 0:
        return 0
    path = topo.route(src, dst, key)
    prop = sum(topo.channel_latency(c) for c in path)
    tx_ps = sum(payload * 8 * 10**12 // topo.channel_bandwidth(c) for c in path)
    rate = min(topo.channel_bandwidth(c) for c in path)
    pkts = -(-size // payload)
    return 2 * prop + tx_ps // 1000 + (size + pkts * header) * 8 * 10**9 // rate


def _config(args: argparse.Namespace) -> PacketConfig:
    config = read_hpcc_config(args.config) if args.config else PacketConfig()
    if args.cc:
        config = config.with_updates(cc=args.cc)
    if args.queue_sample_ns is not None:
        config = config.with_updates(queue_sample_ns=args.queue_sample_ns)
    if args.set:
        config = apply_overrides(config, args.set)
    return config


def _run_ns3(topo: Topology, flows: list[HpccFlow], config: PacketConfig) -> dict[str, Any]:
    from phantora.netsim.packet import Ns3Simulator

    with Ns3Simulator(topo, config) as sim:
        t0 = time.perf_counter()
        for start, group in groupby(flows, key=lambda f: f.start_ns):
            batch = list(group)
            sim.submit([f.to_flow() for f in batch], start, dports={f.index: f.dport for f in batch})
        done = {c.flow_id: c for c in sim.drain()}
        sim.finish()
        wall = time.perf_counter() - t0
        return {
            "done": done,
            "fct": sim.fct_records(),
            "pfc": sim.pfc_events(),
            "pfc_txt": sim.pfc_lines(),
            "queues": sim.queue_samples(),
            "drops": sim.drops(),
            "links": sim.channel_usage(max(1, sim.now() - (flows[0].start_ns if flows else 0))),
            "stats": sim.stats(),
            "wall_s": wall,
            "now": sim.now(),
        }


def _run_flow(topo: Topology, flows: list[HpccFlow], config: PacketConfig) -> dict[str, Any]:
    from phantora.netsim.flow import FlowSimulator

    efficiency = config.payload_bytes / (config.payload_bytes + config.header_bytes)
    sim = FlowSimulator(topo, payload_efficiency=efficiency)
    try:
        t0 = time.perf_counter()
        done: dict[int, Any] = {}
        for start, group in groupby(flows, key=lambda f: f.start_ns):
            done.update((c.flow_id, c) for c in sim.advance(start))
            sim.submit([f.to_flow() for f in group], start)
        done.update((c.flow_id, c) for c in sim.drain())
        wall = time.perf_counter() - t0
        fct = []
        for f in sorted(flows, key=lambda f: (done[f.index].end_ns, f.index)):
            c = done[f.index]
            ideal = standalone_fct_ns(topo, f.src, f.dst, f.index, f.size, config.payload_bytes, config.header_bytes)
            fct.append(FctLine(f.src, f.dst, 10000, f.dport, f.size, c.start_ns, c.end_ns - c.start_ns, ideal, f.index))
        return {
            "done": done,
            "fct": fct,
            "pfc": [],
            "pfc_txt": [],
            "queues": [],
            "drops": [],
            "links": sim.channel_usage(max(1, sim.now() - (flows[0].start_ns if flows else 0))),
            "stats": dict(sim.stats(), engine="flow", payload_efficiency=efficiency),
            "wall_s": wall,
            "now": sim.now(),
        }
    finally:
        sim.close()


def _write_outputs(out: Path, flows: list[HpccFlow], res: dict[str, Any]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    by_id = {f.index: f for f in flows}
    rows = []
    for r in res["fct"]:
        c = res["done"][r.flow_id]
        slowdown = r.fct_ns / r.standalone_ns if r.standalone_ns else 1.0
        rows.append(
            [r.flow_id, r.src, r.dst, r.size, by_id[r.flow_id].priority, r.start_ns, c.end_ns, r.fct_ns]
            + [r.standalone_ns, f"{slowdown:.4f}"]
        )
    header = ["flow_id", "src", "dst", "size", "priority", "start_ns", "end_ns", "fct_ns", "standalone_ns"]
    write_csv(out / "fct.csv", header + ["slowdown"], rows)
    write_fct_txt(res["fct"], out / "fct.txt")
    write_pfc_csv(out / "pfc.csv", res["pfc"])
    write_pfc_txt(res["pfc_txt"], out / "pfc.txt")
    write_queues_csv(out / "queues.csv", res["queues"])
    write_drops_csv(out / "drops.csv", res["drops"])
    link_rows = []
    for u in res["links"]:
        link_rows.append(
            [u.channel, u.src, u.dst, u.bandwidth_bps, u.bytes, f"{u.utilisation:.6f}"]
            + [getattr(u, k, "") for k in LINK_EXTRA_COLUMNS]
        )
    header = ["channel", "src", "dst", "bandwidth_bps", "bytes", "utilisation"]
    write_csv(out / "links.csv", header + LINK_EXTRA_COLUMNS, link_rows)
    summary = {k: v for k, v in res["stats"].items()}
    summary.update(wall_s=round(res["wall_s"], 6), sim_end_ns=res["now"], flows=len(flows))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    names = ["fct.csv", "fct.txt", "pfc.csv", "pfc.txt", "queues.csv", "drops.csv", "links.csv", "summary.json"]
    return [out / n for n in names]


def run(args: argparse.Namespace) -> int:
    from phantora.topology import load_topology

    topo = load_topology(args.topology)
    flows = read_hpcc_flows(args.flows, topo)
    config = _config(args)
    res = _run_ns3(topo, flows, config) if args.network == "ns3" else _run_flow(topo, flows, config)
    fcts = sorted(r.fct_ns for r in res["fct"])
    slow = sorted(r.fct_ns / r.standalone_ns for r in res["fct"] if r.standalone_ns)
    stats = res["stats"]
    cc = config.cc if args.network == "ns3" else "-"
    print(f"{len(flows)} flows on {topo.name} ({args.network}, cc {cc}) in {res['wall_s']:.3f} s wall")
    if fcts:
        p99 = fcts[min(len(fcts) - 1, int(0.99 * len(fcts)))]
        print(f"  fct ns: min {fcts[0]}  median {fcts[len(fcts) // 2]}  p99 {p99}  max {fcts[-1]}")
    if slow:
        print(f"  slowdown (fct / standalone): median {slow[len(slow) // 2]:.3f}  max {slow[-1]:.3f}")
    if args.network == "ns3":
        print(
            f"  pfc frames {len(res['pfc'])}  drops {stats.get('drops', 0)}  ecn marks {stats.get('ecn_marks', 0)}"
            f"  retransmitted packets {stats.get('retx_packets', 0)}  events {stats.get('events', 0)}"
        )
    if args.out:
        paths = _write_outputs(args.out, flows, res)
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0
