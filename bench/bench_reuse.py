"""Reuse of repeated completion profiles (`--set reuse=on`, issue 13): the same replay with reuse off and on,
side by side, and the errors reuse makes. Prints figures only.

Replays a recorded execution graph (``phantora run --record DIR``) on the packet engine twice in this
process, with the given ``--set`` fields and without / with ``reuse=on``, and prints: CPU and wall seconds,
ns-3 events run, the steady step time (the last step), FCT p50 / p99 of the fabric flows (through a NIC) and
of the NVLink flows, PFC pauses, CE marks, the peak switch queue, and the episodes reuse served, recorded
and materialised. Errors are reuse-on against reuse-off.

    .venv/bin/phantora run --topology testbed16 --phantom --out /tmp/r16 --record /tmp/g16 \\
        examples/llama_train.py --model llama3-8b --layers 2 --seq 2048 --batch 1 --steps 2
    .venv/bin/python bench/bench_reuse.py /tmp/g16 --topology testbed16 --set nvlink=fluid --set wire=roce4k
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.egraph.format import load
from phantora.egraph.replay import replay_graph
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.topology.loader import load_topology


def run(graph_dir: str, topo_name: str, cc: str, sets: list[str]) -> dict:
    """One replay: timing, FCTs by side, fabric counters and reuse counters."""
    graph = load(graph_dir)
    topo = load_topology(topo_name)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sim = make_engine(EngineSpec("ns3", apply_overrides(PacketConfig(cc=cc), sets)), topo)
    try:
        res = replay_graph(graph, topo, sim)
        fabric = sim.fabric()
        max_queue = max((u.max_queue_bytes for u in fabric.channel_usage()), default=0) if fabric else 0
        stats = sim.stats()
    finally:
        sim.close()
    fct: dict[str, list[int]] = {"fabric": [], "nvlink": []}
    for c in res.completions:
        if c.size and c.src != c.dst:
            side = "nvlink" if topo.shared_nvswitch(c.src, c.dst) is not None else "fabric"
            fct[side].append(c.end_ns - c.start_ns)
    avoided = int(stats.get("reuse_events_avoided", 0) or 0)  # type: ignore[call-overload]
    row = {
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - wall0,
        "events_run": int(stats.get("events", 0) or 0) - avoided,  # type: ignore[call-overload]
        "step_ms": res.step_times_ns[-1] / 1e6,
        "pfc_pauses": stats.get("pfc_pause", 0),
        "ecn_marks": stats.get("ecn_marks", 0),
        "max_queue_kb": max_queue / 1e3,
        "served": stats.get("reuse_served", "-"),
        "recorded": stats.get("reuse_recorded", "-"),
        "materialised": stats.get("reuse_materialised", "-"),
        "episodes": stats.get("reuse_episodes", "-"),
        "mismatches": stats.get("reuse_mismatches", "-"),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    for side, values in fct.items():
        arr = np.array(values or [0])
        row[f"{side}_flows"] = len(values)
        row[f"{side}_p50_us"] = float(np.percentile(arr, 50)) / 1e3
        row[f"{side}_p99_us"] = float(np.percentile(arr, 99)) / 1e3
    return row


def delta(a: object, b: object) -> str:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not a:
        return ""
    return f"{100 * (b - a) / a:+.2f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graph", help="execution-graph directory (phantora run --record DIR)")
    ap.add_argument("--topology", default="testbed16")
    ap.add_argument("--cc", default="dcqcn")
    ap.add_argument("--set", action="append", default=[], help="PacketConfig field=value for both runs (repeatable)")
    args = ap.parse_args()
    off = run(args.graph, args.topology, args.cc, list(args.set))
    on = run(args.graph, args.topology, args.cc, [*args.set, "reuse=on"])
    print(f"graph {args.graph} on {args.topology}, cc {args.cc}, --set {' '.join(args.set) or '(none)'}")
    print(f"{'':<16}{'reuse off':>14}{'reuse on':>14}{'change':>12}")
    for key in off:
        a, b = off[key], on[key]
        fa = f"{a:.4g}" if isinstance(a, float) else str(a)
        fb = f"{b:.4g}" if isinstance(b, float) else str(b)
        print(f"{key:<16}{fa:>14}{fb:>14}{delta(a, b):>12}")
    print(f"CPU ratio off/on: {off['cpu_s'] / max(on['cpu_s'], 1e-9):.2f}x")


if __name__ == "__main__":
    main()
