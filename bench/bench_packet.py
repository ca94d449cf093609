"""Packet-level (ns-3) engine benchmark: prints figures, asserts nothing.

Collectives are decomposed under the ideal model (`AlgoOptions(model="ideal")`: line rate, no NCCL protocol or
latency), so the engine figures stay comparable across versions; bench_nccl_tests.py measures the NCCL model.

1. Events per wall second and wall seconds per simulated ms for ring all-reduces on non-blocking
   400G leaf-spine fabrics (default: 16 GPUs x 256 MiB and 128 GPUs x 32 MiB; --gpus/--bytes to change).
2. Packet vs flow engine wall time on the same flow DAG.
3. Standalone runner (C++ only) vs the Python-driven engine on the same dependency-free input
   (HPCC files), to measure the cost of driving ns-3 from Python.
4. With several GPU counts, packet mode against GPU count: one table of simulated ms, events, wall, CPU, events
   per CPU second and peak RSS (equal bytes in all: 16 x 256 MiB = 128 x 32 MiB = 1024 x 4 MiB of all-reduce).

    .venv/bin/python bench/bench_packet.py                      # defaults
    .venv/bin/python bench/bench_packet.py --gpus 16 --bytes 64MiB --cc dcqcn
    .venv/bin/python bench/bench_packet.py --gpus 16 --bytes 32MiB --no-flow --no-runner \\
        --queue-sample-ns 0,0,1000,10000,0,1000,10000   # the cost of queue sampling
    .venv/bin/python bench/bench_packet.py --gpus 16,128,1024 --bytes 256MiB,32MiB,4MiB --cc dcqcn \\
        --no-flow --no-runner   # against GPU count (issue 38)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.collectives.decompose import decompose
from phantora.collectives.spec import GRANULARITIES, AlgoOptions, Collective
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.packet import Ns3Simulator, load_ns3, runner_path
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology
from phantora.units import parse_rate_bps, parse_size_bytes


def fabric(gpus: int, rate: str) -> Topology:
    """Non-blocking leaf-spine: 8 GPUs per leaf up to 64 GPUs, 16 beyond; as many spines as leaves (>= 2)."""
    per_leaf = 8 if gpus <= 64 else 16
    leaves = max(1, gpus // per_leaf)
    return leaf_spine(leaves, per_leaf, max(2, leaves) if leaves > 1 else 0, nic_rate=rate, latency="1us")


def allreduce_flows(topo: Topology, nbytes: int, granularity: str, channels: int) -> list[Flow]:
    coll = Collective("all_reduce", tuple(range(topo.num_ranks)), nbytes)
    return decompose(coll, topo, AlgoOptions("ring", granularity, channels, model="ideal")).flows


def run_packet(topo: Topology, flows: list[Flow], cfg: PacketConfig) -> dict[str, float]:
    t0 = time.perf_counter()
    with Ns3Simulator(topo, cfg) as sim:
        t1 = time.perf_counter()
        sim.submit(flows, at=0)
        t2, c2 = time.perf_counter(), time.process_time()
        done = sim.drain()
        t3, c3 = time.perf_counter(), time.process_time()
        st = cast("dict[str, int]", sim.stats())  # the counters read here are ints
        samples = len(sim.queue_samples())
        drain_s = time.perf_counter() - t3
    sim_ns = max(c.end_ns for c in done)
    run, cpu = t3 - t2, c3 - c2
    return {
        "build_s": t1 - t0,
        "submit_s": t2 - t1,
        "run_s": run,
        "cpu_s": cpu,
        "sim_ms": sim_ns / 1e6,
        "events": st["events"],
        "events_per_s": st["events"] / run,
        "events_per_cpu_s": st["events"] / cpu,
        "wall_s_per_sim_ms": run / (sim_ns / 1e6),
        "cpu_s_per_sim_ms": cpu / (sim_ns / 1e6),
        "data_packets": st["data_packets"],
        "pfc_frames": st["pfc_pause"] + st["pfc_resume"],
        "queue_samples": samples,
        "queue_drain_s": drain_s,
    }


def run_flow(topo: Topology, flows: list[Flow], cfg: PacketConfig) -> dict[str, float]:
    eff = cfg.payload_bytes / (cfg.payload_bytes + cfg.header_bytes + cfg.header_bytes / cfg.ack_interval)
    sim = FlowSimulator(topo, payload_efficiency=eff)
    t0 = time.perf_counter()
    sim.submit(flows, at=0)
    done = sim.drain()
    return {"run_s": time.perf_counter() - t0, "sim_ms": max(c.end_ns for c in done) / 1e6}


def runner_vs_python(topo: Topology, flows: list[Flow], cfg: PacketConfig, repeat: int = 3) -> dict[str, float]:
    """The same dependency-free flows: the C++ runner replaying the call script (its own timer) vs the Python-driven
    engine that made it."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        hpcc_flows = [Flow(i, f.src, f.dst, f.size, key=i) for i, f in enumerate(flows)]
        with Ns3Simulator(topo, cfg, calls=d / "calls.txt") as sim:  # untimed: records the script
            sim.submit(hpcc_flows, at=0)
        runner, process, python, python_cpu = [], [], [], []
        for _ in range(repeat):  # alternate, and keep the best of each: the machine is shared
            t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run(
                [str(runner_path()), str(d / "calls.txt"), str(d / "o")],
                capture_output=True,
                text=True,
                check=True,
            )
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            process.append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)  # CPU s, whole process
            summary = json.loads(proc.stdout.strip().splitlines()[-1])
            runner.append(summary["wall_s"])
            t0, c0p = time.perf_counter(), time.process_time()
            with Ns3Simulator(topo, cfg) as sim:
                sim.submit(hpcc_flows, at=0)
                sim.drain()
                sim.finish()
                events = sim.stats()["events"]
            python.append(time.perf_counter() - t0)
            python_cpu.append(time.process_time() - c0p)
    return {
        "runner_wall_s": min(runner),
        "runner_process_cpu_s": min(process),
        "python_wall_s": min(python),
        "python_cpu_s": min(python_cpu),
        "overhead": min(python) / min(runner) - 1,
        "cpu_overhead": min(python_cpu) / min(process) - 1,
        "events_runner": summary["events"],
        "events_python": events,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="16,128", help="comma-separated GPU counts")
    ap.add_argument("--bytes", default="256MiB,32MiB", help="all-reduce sizes, one per GPU count (or one for all)")
    ap.add_argument("--rate", default="400Gbps")
    ap.add_argument("--cc", default="none")
    ap.add_argument("--payload", type=int, default=1000)
    ap.add_argument("--granularity", default="coarse", choices=GRANULARITIES)
    ap.add_argument("--channels", type=int, default=2)
    ap.add_argument("--no-flow", action="store_true", help="skip the flow-engine comparison")
    ap.add_argument("--no-runner", action="store_true", help="skip the runner comparison")
    ap.add_argument("--runner-bytes", default="16MiB", help="all-reduce size of the runner comparison")
    ap.add_argument(
        "--queue-sample-ns",
        default="0",
        help="comma-separated queue sampling intervals: the packet run is repeated for each (cost of sampling)",
    )
    args = ap.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    sizes = [parse_size_bytes(s) for s in args.bytes.split(",")]
    sizes = sizes * len(gpus) if len(sizes) == 1 else sizes
    cfg = PacketConfig(cc=args.cc, payload_bytes=args.payload)
    t0 = time.perf_counter()
    load_ns3()
    print(f"ns-3 import + library load: {time.perf_counter() - t0:.1f} s")
    print(f"rate {parse_rate_bps(args.rate) / 1e9:g} Gb/s, payload {args.payload} B, cc {args.cc}, {args.granularity}")
    scale: list[tuple[int, int, dict[str, float], float]] = []  # (GPUs, flows, the packet run, peak RSS GB)
    for n, nbytes in zip(gpus, sizes, strict=True):
        topo = fabric(n, args.rate)
        flows = allreduce_flows(topo, nbytes, args.granularity, args.channels)
        intervals = [int(x) for x in args.queue_sample_ns.split(",")]
        runs = [run_packet(topo, flows, cfg.with_updates(queue_sample_ns=q)) for q in intervals]
        pk = runs[0]
        scale.append((n, len(flows), pk, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20))
        print(
            f"\n{n} GPUs, all-reduce {nbytes / 2**20:g} MiB, {len(flows)} flows, {len(topo.nodes)} nodes:\n"
            f"  packet: {pk['sim_ms']:.3f} sim ms, {pk['events']:.4g} events, {pk['data_packets']:.4g} data packets, "
            f"{pk['pfc_frames']} PFC frames; {pk['run_s']:.2f} s wall ({pk['cpu_s']:.2f} s CPU), "
            f"{pk['events_per_s'] / 1e6:.2f} M events/wall s ({pk['events_per_cpu_s'] / 1e6:.2f} per CPU s), "
            f"{pk['wall_s_per_sim_ms']:.2f} wall s ({pk['cpu_s_per_sim_ms']:.2f} CPU s) per sim ms "
            f"(build {pk['build_s']:.2f} s, submit {pk['submit_s']:.3f} s)"
        )
        if len(runs) > 1:  # list 0 first twice: the first run also pays cppyy's first-call costs
            for q, qs in zip(intervals, runs, strict=True):
                print(
                    f"  queue_sample_ns {q}: {qs['run_s']:.2f} s wall, {qs['cpu_s']:.2f} s CPU, "
                    f"{qs['events']:,} events, {qs['queue_samples']} sample rows drained in "
                    f"{qs['queue_drain_s']:.3f} s"
                )
        if not args.no_flow:
            fl = run_flow(topo, flows, cfg)
            print(
                f"  flow:   {fl['sim_ms']:.3f} sim ms, sim time ratio {pk['sim_ms'] / fl['sim_ms']:.4f}; "
                f"{fl['run_s']:.3f} s wall, packet/flow wall ratio {pk['run_s'] / fl['run_s']:.0f}x"
            )
    if len(scale) > 1:  # packet mode against GPU count (issue 38): simulated columns first, then the machine's
        print("\nagainst GPU count: GPUs, flows, sim ms, M events | wall s, CPU s, M events per CPU s, peak RSS GB")
        for n, nflows, pk, rss in scale:  # (peak RSS: this process's so far, so the largest run's at most)
            print(
                f"  {n:>5} {nflows:>7} {pk['sim_ms']:>9.3f} {pk['events'] / 1e6:>9.2f} | {pk['run_s']:>8.1f} "
                f"{pk['cpu_s']:>8.1f} {pk['events_per_cpu_s'] / 1e6:>6.2f} {rss:>6.2f}"
            )
    if not args.no_runner:
        topo = fabric(gpus[0], args.rate)
        flows = allreduce_flows(topo, parse_size_bytes(args.runner_bytes), "coarse", args.channels)
        rv = runner_vs_python(topo, flows, cfg)
        print(
            f"\nrunner vs Python ({gpus[0]} GPUs, {len(flows)} dependency-free flows of a {args.runner_bytes} ring):\n"
            f"  runner {rv['runner_wall_s']:.3f} s wall, whole process {rv['runner_process_cpu_s']:.3f} CPU s; "
            f"Python-driven {rv['python_wall_s']:.3f} s wall, {rv['python_cpu_s']:.3f} CPU s (best of 3 each)\n"
            f"  Python overhead: {100 * rv['overhead']:+.1f}% wall, {100 * rv['cpu_overhead']:+.1f}% CPU "
            f"(events {rv['events_runner']} vs {rv['events_python']})"
        )


if __name__ == "__main__":
    main()
