"""Packet mode on an LLM step (issue 13): how far each lever gets in a wall-time budget. Prints figures only.

Plans a recorded execution graph (``phantora run --record DIR``) into its flow DAG once, then runs it on
the packet engine under each variant (a list of ``--set`` fields, ``exact`` for none) until it ends or the
budget runs out, and prints side by side: simulated time reached, flows and bytes done, ns-3 events, events
per CPU second, peak RSS, and, when the budget ended the run, the projected CPU time of the whole graph:
set-up + run CPU x packet-side bytes / payload bytes ns-3 has carried so far (packet events grow with the
bytes ns-3 carries; CPU seconds, not wall, because this machine is shared). The budget counts from the
end of set-up (planning and submitting the DAG).

    # record one Llama-3-8B FSDP2 step on rail128 (flow mode, about a minute), then compare levers:
    .venv/bin/phantora run --topology rail128 --phantom --out /tmp/r8b --record /tmp/g8b \\
        examples/llama_train.py --model llama3-8b --seq 8192 --batch 2 --ac op --steps 1
    .venv/bin/python bench/bench_llm_packet.py /tmp/g8b --topology rail128 --budget-s 300 \\
        --variant exact --variant nvlink=fluid --variant nvlink=fluid,wire=roce4k \\
        --variant nvlink=fluid,wire=roce4k,reuse=on

With reuse=on the bytes carried include those of served episodes (ns-3 did not run them), so the projection
credits reuse as far as the budget got; "events" are the ns-3 events actually run.

A variant with ``workers=N`` (decomposition into parallel ns-3 workers; it needs ``nic_latency``, e.g.
``--variant nvlink=fluid,wire=roce4k,nic_latency=1us,workers=2``) is measured by its critical path: run CPU =
this process's CPU + per round the CPU of its busiest worker (what the run takes on N free cores; the workers'
total CPU is printed too), and it steps in quanta of at least 10 ms (each quantum ends a round). Its set-up leaves
out the workers' start-up (each imports ns-3, about 7-9 CPU s, in parallel), which one engine's set-up includes:
compare them by "run x faster" (the projected run CPU, set-up left out).

A variant with ``partition=N`` (stepped partition workers beside the fluid NVLink side; it needs the keyed
scheduler, e.g. ``--variant nvlink=fluid,wire=roce4k,scheduler=ns3::PhantoraKeyedScheduler,reuse=on,partition=2``)
is measured the same way: this process's CPU + per round the busiest worker's CPU (`partition.critical_cpu_s`),
the workers' run CPU printed beside it, in the same quanta as one engine (a quantum ends a round, and the workers'
cut-cable windows are far more: 10 ms of the 1024-GPU step's first all-gather is minutes of CPU a worker).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from bridge.cut_pool import run_partitioned_batches  # partition=N
from bridge.cut_stepped_start import spawn_stepped  # partition=N beside nvlink=fluid
from bridge.workers import spawn_workers  # workers=N decomposes
from phantora.egraph.format import load
from phantora.egraph.replay import algo_from_meta, plan_graph
from phantora.netsim.base import Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.topology.loader import load_topology


def packet_side(flows: list[Flow], topo_name: str, fluid: bool) -> set[int]:
    """Ids of the flows ns-3 carries packet by packet under this variant."""
    topo = load_topology(topo_name)
    out = set()
    for f in flows:
        if f.size == 0 or f.src == f.dst:
            continue
        if fluid and topo.shared_nvswitch(f.src, f.dst) is not None:
            continue
        out.add(f.id)
    return out


def run_variant(graph_dir: str, topo_name: str, cc: str, sets: list[str], budget_s: float, quantum_ns: int) -> dict:
    graph = load(graph_dir)
    topo = load_topology(topo_name)
    flows = plan_graph(graph, topo, algo_from_meta(graph)).flows
    size = {f.id: f.size for f in flows}
    fluid = "nvlink=fluid" in sets
    on_packets = packet_side(flows, topo_name, fluid)
    total_pkt_bytes = sum(size[i] for i in on_packets)
    if any(s.startswith("workers=") for s in sets):
        quantum_ns = max(quantum_ns, 10_000_000)
    cpu0 = time.process_time()
    spec = EngineSpec("ns3", apply_overrides(PacketConfig(cc=cc), sets))
    sim = make_engine(spec, topo, spawner=spawn_workers, partitioner=run_partitioned_batches, stepper=spawn_stepped)
    sim.submit(flows, 0)
    setup_cpu = time.process_time() - cpu0
    cpu1 = time.process_time()
    t1 = time.perf_counter()
    done = 0
    done_bytes = 0
    finished = False
    while True:
        nxt = sim.next_event_time()
        if nxt is None:
            finished = sim.in_flight() == 0
            break
        for c in sim.advance(max(nxt, sim.now() + quantum_ns)):
            done += 1
            done_bytes += c.size
        if time.perf_counter() - t1 > budget_s:
            break
    run_cpu = time.process_time() - cpu1
    stats: dict[str, Any] = sim.stats()
    dec: dict[str, Any] = stats.get("decompose") or {}
    part: dict[str, Any] = stats.get("partition") or {}
    if part.get("stepped"):  # the workers' run CPU; per round the busiest's, summed
        dec = {"round_cpu_s": part["run_cpu_s"], "critical_cpu_s": part["critical_cpu_s"], "rounds": part["rounds"]}
    workers_cpu = sum(dec.get("round_cpu_s", ()))
    critical_cpu = float(dec.get("critical_cpu_s", 0.0))
    events_cpu = run_cpu + workers_cpu
    run_cpu += critical_cpu
    now = sim.now()
    sim.close()
    avoided = int(stats.get("reuse_events_avoided", 0) or 0)  # reuse=on: served episodes' events, not run
    events = int(stats.get("events", 0) or 0) - avoided
    carried = int(stats.get("payload_bytes_delivered", 0) or 0)  # ns-3's payload bytes so far, open flows too
    run_total = run_cpu if finished else run_cpu * total_pkt_bytes / max(1, carried)
    return {
        "variant": ",".join(sets) or "exact",
        "finished": finished,
        "sim_ms": now / 1e6,
        "flows": f"{done}/{len(flows)}",
        "bytes_done_pct": 100 * done_bytes / max(1, sum(size.values())),
        "packet_bytes_carried_pct": 100 * carried / max(1, total_pkt_bytes),
        "events": events,
        "reuse_served": f"{stats.get('reuse_served', '-')}/{stats.get('reuse_episodes', '-')}",
        "events_avoided": avoided,
        "events_per_cpu_s": events / events_cpu if events_cpu else 0.0,
        "workers_cpu_s": workers_cpu,
        "rounds": dec.get("rounds", "-"),
        "setup_cpu_s": setup_cpu,
        "run_cpu_s": run_cpu,
        "run_wall_s": time.perf_counter() - t1,
        "projected_cpu_s": setup_cpu + run_total,
        "projected_run_cpu_s": run_total,
        "packet_side_gb": total_pkt_bytes / 1e9,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graph", help="execution-graph directory (phantora run --record DIR)")
    ap.add_argument("--topology", default="rail128")
    ap.add_argument("--cc", default="dcqcn")
    ap.add_argument("--variant", action="append", help="comma-separated --set fields, or 'exact' (repeatable)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="wall seconds per variant")
    ap.add_argument("--quantum-ns", type=int, default=20_000, help="simulated ns between budget checks")
    args = ap.parse_args()
    rows = []
    for v in args.variant or ["exact", "nvlink=fluid"]:
        sets = [] if v == "exact" else [s for s in v.split(",") if s]
        row = run_variant(args.graph, args.topology, args.cc, sets, args.budget_s, args.quantum_ns)
        rows.append(row)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    base = rows[0]["projected_cpu_s"]
    run0 = rows[0]["projected_run_cpu_s"]
    head = (
        f"{'variant':<30}   projected CPU     x faster   run CPU   run x faster   events/CPU s   packet-side GB"
        "   served/episodes"
    )
    print("\n" + head)
    for r in rows:
        print(
            f"{r['variant']:<30} {r['projected_cpu_s']:>12.0f} s {base / r['projected_cpu_s']:>10.1f}"
            f" {r['projected_run_cpu_s']:>7.1f} s {run0 / r['projected_run_cpu_s']:>14.1f}"
            f" {r['events_per_cpu_s']:>14.3g} {r['packet_side_gb']:>14.1f} {r['reuse_served']:>17}"
        )


if __name__ == "__main__":
    main()
