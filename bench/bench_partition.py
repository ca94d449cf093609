"""Parallel packet simulation across cut cables (issue 38): one keyed engine vs partition workers. Prints figures.

The traffic is an MoE all-to-all: every endpoint of a leaf-spine sends `--bytes` to every other at once (no
dependencies: the partition workers take batches of flows without them so far). Each variant runs it to the end
in the keyed mode: one engine in this process, then `partition=N` worker processes for each N of `--workers`
(N=1: one worker process, no cable cut). Printed side by side from one run: wall, the CPU of the run (ns-3 and
the windows' messaging, per worker), start-up CPU (ns-3 import and the fabric), windows and barrier exchanges,
message bytes, peak memory, and whether every completion, FCT record and PFC frame equals the one engine's.

Then "on paper" for 8, 16 and 64 cores, one worker a core: T(N) = C / N x imbalance + X x overhead(N), with C the
one engine's CPU, the imbalance the largest run's busiest worker over its mean, X the barrier exchanges (set by
the traffic and the lookahead, not by N: every worker takes part in every barrier) and overhead(N) the measured
per-exchange CPU of a worker (its run CPU less its ns-3 CPU, over its exchanges) at the largest N measured,
scaled by (N - 1) / (N_measured - 1) for the messages to each other worker. A projection, not a measurement.

    .venv/bin/python bench/bench_partition.py --workers 1 2
    .venv/bin/python bench/bench_partition.py --leaves 8 --per-leaf 8 --spines 4 --bytes 64KiB --workers 1 2 4
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from bridge.cut_pool import run_partitioned
from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology
from phantora.units import parse_size_bytes

UNTIL_NS = 10_000_000_000  # 10 s: far past the end of any traffic here


def all_to_all(topo: Topology, size: int) -> list[Flow]:
    """Every endpoint to every other, `size` bytes each, all at once."""
    eps = topo.endpoints
    return [Flow(i * len(eps) + j, s, d, size) for i, s in enumerate(eps) for j, d in enumerate(eps) if s != d]


def one_engine(topo: Topology, cfg: PacketConfig, flows: list[Flow]) -> tuple[dict[str, Any], dict[str, float]]:
    w0, c0 = time.perf_counter(), time.process_time()
    with Ns3Simulator(topo, cfg) as sim:
        setup = time.process_time() - c0
        sim.submit(flows, 0)
        r0, rc0 = time.perf_counter(), time.process_time()
        done = sim.advance(UNTIL_NS)
        run_cpu, run_wall = time.process_time() - rc0, time.perf_counter() - r0
        events = float(str(sim.stats().get("events", 0)))
        rec = {
            "completions": sorted((c.flow_id, c.start_ns, c.end_ns) for c in done),
            "fct": sorted(sim.fct_records(), key=dataclasses.astuple),
            "pfc": sorted(sim.pfc_events(), key=dataclasses.astuple),
        }
    fig = {"wall": time.perf_counter() - w0, "run_wall": run_wall, "run_cpu": run_cpu, "setup_cpu": setup}
    fig["events"] = events
    return rec, fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--leaves", type=int, default=4)
    ap.add_argument("--per-leaf", type=int, default=8)
    ap.add_argument("--spines", type=int, default=4)
    ap.add_argument("--bytes", default="64KiB", help="bytes each endpoint sends each other endpoint")
    ap.add_argument("--cc", default="dcqcn")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    topo = leaf_spine(args.leaves, args.per_leaf, args.spines, nvswitch=False)
    flows = all_to_all(topo, parse_size_bytes(args.bytes))
    cfg = apply_overrides(PacketConfig(cc=args.cc), [f"scheduler={KEYED_SCHEDULER}"])
    print(f"# all-to-all on leaf_spine({args.leaves}, {args.per_leaf}, {args.spines}): {len(flows)} flows of "
          f"{args.bytes}, cc {args.cc}, keyed mode")  # fmt: skip
    want, one = one_engine(topo, cfg, flows)
    print(f"# one engine: {one['events']:,.0f} events, {one['events'] / one['run_cpu'] / 1e6:.2f} M events / CPU s")
    head = "| variant | wall s | run wall s | run CPU s (per worker) | ns-3 CPU s | start-up CPU s | windows | "
    print(head + "exchanges | message MB | peak RSS MB | equal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| one engine | {one['wall']:.2f} | {one['run_wall']:.2f} | {one['run_cpu']:.2f} | {one['run_cpu']:.2f} | "
          f"{one['setup_cpu']:.2f} | - | - | - | - | - |")  # fmt: skip
    last: list[dict[str, Any]] = []
    for n in args.workers:
        res = run_partitioned(topo, cfg.with_updates(partition=n), flows, until=UNTIL_NS)
        got = {
            "completions": sorted((c.flow_id, c.start_ns, c.end_ns) for c in res.completions),
            "fct": res.fct,
            "pfc": res.pfc,
        }
        equal = all(got[k] == want[k] for k in want)
        ws = res.workers
        per = " / ".join(f"{w['run_cpu_s']:.2f}" for w in ws)
        ns3 = " / ".join(f"{w['ns3_cpu_s']:.2f}" for w in ws)
        setup = " / ".join(f"{w['setup_cpu_s']:.2f}" for w in ws)
        run_wall = max(w["wall_s"] for w in ws)
        mb = sum(w["bytes_out"] for w in ws) / 1e6
        rss = max(w["maxrss_kb"] for w in ws) / 1024
        print(f"| partition={n} | {res.wall_s:.2f} | {run_wall:.2f} | {per} | {ns3} | {setup} | {ws[0]['windows']} | "
              f"{ws[0]['exchanges']} | {mb:.1f} | {rss:.0f} | {'yes' if equal else 'NO'} |")  # fmt: skip
        last = ws
    if len(last) >= 2:
        n = len(last)
        cpu = [w["run_cpu_s"] for w in last]
        imbalance = max(cpu) / (sum(cpu) / n)
        x = last[0]["exchanges"]
        per_ex = max((w["run_cpu_s"] - w["ns3_cpu_s"]) / max(w["exchanges"], 1) for w in last)
        print(f"\n# on paper (one worker a core): C = {one['run_cpu']:.2f} s (one engine), imbalance {imbalance:.2f} "
              f"(at {n}), X = {x} exchanges, {per_ex * 1e6:.0f} us CPU an exchange at {n} workers")  # fmt: skip
        print("| cores | ns-3 share s | exchanges s | projected s | speed-up |")
        print("|---|---|---|---|---|")
        for p in (8, 16, 64):
            share = one["run_cpu"] / p * imbalance
            ex = x * per_ex * (p - 1) / (n - 1)
            print(f"| {p} | {share:.2f} | {ex:.2f} | {share + ex:.2f} | {one['run_cpu'] / (share + ex):.1f}x |")


if __name__ == "__main__":
    main()
