"""Stepped partition workers on a flow DAG beside the fluid NVLink side (issue 38): one keyed engine vs partition=N.

Prints figures only. The traffic is a flow DAG on a rail fabric under nvlink=fluid, wire=roce4k and the keyed
scheduler: by default (`--dag a2a`) two MoE all-to-alls over every GPU, `--pair-bytes` to each other GPU, the second
after the first (`bench_decompose.a2a_dag`: cross-rail traffic, which decomposition into pieces refuses), or with
`--graph DIR` a recorded execution graph planned into its flow DAG. The fabric is `--rail HOSTS GPUS SPINES`
(`rail_optimized`) or `--topology NAME|FILE`.

One keyed engine runs it, then stepped `partition=N` workers for each N of `--workers`, and a table puts them side by
side: the driver's CPU, per worker its run CPU, of it ns-3 (its windows' runs) and the rest (barrier exchanges,
delivering and taking cut-cable messages, bounds, the rounds' flows and replies), rounds, windows (and those ended by
the lookahead), message bytes, whether every completion equals one engine's (sha256 key of the sorted (id, start,
end)), and the critical path on free cores: the driver's CPU + per round its busiest worker's CPU (summed), against
one engine's CPU; with the fluid side run ahead during rounds (`meanwhile`), per round the more of the busiest
worker's CPU and the driver's meanwhile, and the driver's CPU less its meanwhile. CPU seconds: the machine is shared.

    .venv/bin/python bench/bench_partition_dag.py --rail 4 8 4 --pair-bytes 1MiB --workers 2
    .venv/bin/python bench/bench_partition_dag.py --graph G --topology T --workers 2
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_decompose's DAGs

from bench_decompose import a2a_dag, graph_dag

from bridge.cut_pool import run_partitioned_batches
from bridge.cut_stepped_start import spawn_stepped
from phantora.netsim.base import Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.topology.generators import rail_optimized
from phantora.topology.loader import load_topology
from phantora.topology.model import Topology
from phantora.units import parse_size_bytes

SETS = ["nvlink=fluid", "wire=roce4k", f"scheduler={KEYED_SCHEDULER}"]


def dag_flows(args: argparse.Namespace) -> tuple[Topology, list[Flow], str]:
    """The topology, the flow DAG and a line saying what it is."""
    topo = load_topology(args.topology) if args.topology else rail_optimized(*args.rail)
    if args.graph:
        flows = graph_dag(args.graph, topo)
        return topo, flows, f"{args.graph}: {len(flows):,} flows on {topo.name}"
    flows = a2a_dag(topo, parse_size_bytes(args.pair_bytes) * topo.num_ranks)
    return topo, flows, f"two all-to-alls of {args.pair_bytes} a GPU pair on {topo.name}: {len(flows):,} flows"


def run_dag(topo: Topology, flows: list[Flow], sets: list[str], cc: str) -> dict[str, Any]:
    """The DAG to its end on one keyed engine (no partition in `sets`) or on stepped partition workers."""
    spec = EngineSpec("ns3", apply_overrides(PacketConfig(cc=cc), sets))
    w0, c0 = time.perf_counter(), time.process_time()
    sim = make_engine(spec, topo, partitioner=run_partitioned_batches, stepper=spawn_stepped)
    try:
        c1 = time.process_time()
        sim.submit(flows, 0)
        done = sim.drain()
        cpu = time.process_time() - c1
        stats: dict[str, Any] = sim.stats()
    finally:
        sim.close()
    key = hashlib.sha256(repr(sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)).encode()).hexdigest()[:12]
    return {"wall": time.perf_counter() - w0, "setup_cpu": c1 - c0, "cpu": cpu, "part": stats.get("partition") or {},
            "key": key, "events": int(stats.get("events", 0) or 0), "end": max(c.end_ns for c in done)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graph", help="a recorded execution graph's flow DAG (phantora run --record DIR)")
    ap.add_argument("--rail", type=int, nargs=3, default=[4, 8, 4], metavar=("HOSTS", "GPUS", "SPINES"),
                    help="a rail-optimised fabric of these (default 4 hosts x 8 GPUs, 4 spines)")  # fmt: skip
    ap.add_argument("--topology", help="a named topology (or TOML file) instead of --rail")
    ap.add_argument("--pair-bytes", default="1MiB", help="the all-to-all's bytes from each GPU to each other GPU")
    ap.add_argument("--cc", default="dcqcn")
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    args = ap.parse_args()
    topo, flows, what = dag_flows(args)
    print(f"# {what}, cc {args.cc}, --set {','.join(SETS)}")
    one = run_dag(topo, flows, SETS, args.cc)
    print(f"# one keyed engine: {one['events']:,} events, end {one['end']:,} ns, "
          f"{one['events'] / max(one['cpu'], 1e-9) / 1e6:.2f} M events / CPU s")  # fmt: skip
    print("| variant | wall s | driver CPU s | run CPU s per worker | of it ns-3 | the rest | rounds | windows "
          "| ended by the lookahead | message MB | critical path CPU s | x one engine | equal |")  # fmt: skip
    print("|---|" + "---:|" * 11 + "---|")
    print(f"| one keyed engine | {one['wall']:.1f} | {one['cpu']:.2f} | - | - | - | - | - | - | - | {one['cpu']:.2f} "
          f"| 1.00 | {one['key']} |")  # fmt: skip
    for n in args.workers:
        r = run_dag(topo, flows, [*SETS, f"partition={n}"], args.cc)
        p = r["part"]
        # per round the busiest worker's CPU or the fluid side's run ahead meanwhile, whichever is more (the
        # driver's own CPU less what it ran meanwhile, plus that)
        overlap = float(p.get("overlap_cpu_s", p["critical_cpu_s"]))
        crit = r["cpu"] - float(p.get("meanwhile_cpu_s", 0.0)) + overlap
        run = " / ".join(f"{x:.2f}" for x in p["run_cpu_s"])
        ns3 = " / ".join(f"{x:.2f}" for x in p["ns3_cpu_s"])
        rest = " / ".join(f"{a - b:.2f}" for a, b in zip(p["run_cpu_s"], p["ns3_cpu_s"], strict=True))
        ended = p["windows_ended_by"]
        equal = "yes" if r["key"] == one["key"] else f"NO {r['key']}"
        print(f"| partition={n} | {r['wall']:.1f} | {r['cpu']:.2f} | {run} | {ns3} | {rest} | {p['rounds']:,} "
              f"| {p['windows']:,} | {ended.get('lookahead', 0):,} | {p['message_bytes'] / 1e6:.1f} | {crit:.2f} "
              f"| {one['cpu'] / crit:.2f} | {equal} |")  # fmt: skip
        print(f"#   partition={n}: windows ended by {ended}, widths {p['window_widths_ns']}, "
              f"events {r['events']:,}, end {r['end']:,} ns; the fluid side during rounds "
              f"{float(p.get('meanwhile_cpu_s', 0.0)):.2f} CPU s, {p.get('ahead_steps', 0):,} event times")  # fmt: skip


if __name__ == "__main__":
    main()
