"""The NCCL model against published nccl-tests tables (tests/data/nccl_tests/, sources in its SOURCES.md).

    .venv/bin/python bench/bench_nccl_tests.py                 # every table, flow engine, a row per size
    .venv/bin/python bench/bench_nccl_tests.py --summary       # one line per table: median and worst error
    .venv/bin/python bench/bench_nccl_tests.py --network ns3   # the same through the packet engine (slower)
    .venv/bin/python bench/bench_nccl_tests.py --curves        # the model's curves: 4 collectives x 5 machines

Each size runs as nccl-tests runs it (`phantora nccl-tests`' own loop: warm-ups, then timed iterations) on the
machine of the table (one DGX/HGX host, or rail-optimised hosts with a 400G NIC per GPU), with NCCL_ALGO set as the
table says. Errors are (simulated - published) / published bus bandwidth.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.published import Table, machine, tables
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.factory import make_engine
from phantora.report.nccl_tests import HOST_LAUNCH_US, launch_bound
from phantora.topology.model import Topology


def _engine(network: str, topo: Topology) -> Any:
    """The engine named `network` on `topo` (through an `EngineSpec` where the factory takes one)."""
    try:
        from phantora.netsim.engine_spec import EngineSpec
    except ImportError:
        return make_engine(network, topo)  # type: ignore[arg-type]
    return make_engine(EngineSpec(network=network), topo)


def bus_bandwidth(coll: Collective, topo: Topology, opts: AlgoOptions, network: str) -> tuple[float, dict[str, Any]]:
    """Bus bandwidth (GB/s) of one collective alone on an idle network, and NCCL's choice."""
    dag = decompose(coll, topo, opts)
    engine = _engine(network, topo)
    try:
        engine.submit(dag.flows, at=0)
        t = max(c.end_ns for c in engine.drain())
    finally:
        engine.close()
    return coll.nbytes / t * coll.busbw_factor(), dag.choice or {}


def simulate(table: Table, size: int, network: str = "flow") -> tuple[float, dict[str, Any]]:
    """Bus bandwidth (GB/s) of one size of `table` on its machine, as nccl-tests' timed loop of 20 calls sees it
    (one host thread launching its -g GPUs' calls), and NCCL's choice."""
    coll = Collective(table.kind, tuple(range(table.gpus)), size, "fp32")
    bus, choice = bus_bandwidth(coll, machine(table), AlgoOptions(nccl_env=nccl_env(table.env)), network)
    gpu_ns = round(coll.nbytes / bus * coll.busbw_factor())
    loop = launch_bound([gpu_ns] * 20, round(HOST_LAUNCH_US * 1000 * table.gpus_per_thread))
    return coll.nbytes / statistics.mean(loop) * coll.busbw_factor(), choice


CURVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def curves(network: str) -> None:
    """Bus bandwidth (GB/s) of each collective from 1 MiB to 8 GiB on one host of A100/H100/H200/B200 and on two
    H100 hosts (8 x 400G rails), with NCCL's choice at each size."""
    from phantora.topology import dgx_host, rail_optimized

    machines = {f"1x8 {g}": dgx_host(gpu=g) for g in ("a100", "h100", "h200", "b200")}
    machines["2x8 h100 400G"] = rail_optimized(2, 8, spines=8, nic_rate="400Gbps", gpu="h100")
    sizes = [1 << k for k in range(20, 34, 2)]
    for kind in CURVE_KINDS:
        print(f"\n{kind}: busbw GB/s (algorithm/protocol)")
        print(f"{'machine':<16}" + "".join(f"{s >> 20:>16}M" for s in sizes))
        for name, topo in machines.items():
            cells = []
            for size in sizes:
                coll = Collective(kind, tuple(range(topo.num_ranks)), size, "fp32")
                bus, choice = bus_bandwidth(coll, topo, AlgoOptions(nccl_env=()), network)
                what = f"{choice.get('algorithm', '')[:4]}/{choice.get('protocol', '')[:3]}"
                cells.append(f"{bus:7.1f} {what}")
            print(f"{name:<16}" + "".join(f"{c:>17}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--network", default="flow", choices=("flow", "ns3"))
    ap.add_argument("--summary", action="store_true", help="one line per table")
    ap.add_argument("--markdown", action="store_true", help="rows as a markdown table (docs/validation.md)")
    ap.add_argument("--min-size", type=int, default=1 << 20, help="smallest size compared (default 1 MiB)")
    ap.add_argument("--curves", action="store_true", help="print the model's curves instead of comparing")
    args = ap.parse_args()
    if args.curves:
        curves(args.network)
        return
    every: list[float] = []
    big: list[float] = []
    by_test: dict[str, list[tuple[int, float]]] = {}
    for table in tables():
        errs: list[float] = []
        big_errs: list[float] = []
        if args.markdown:
            what = f"{table.gpu}, {table.gpus} GPUs, {table.nodes} node(s), NCCL_ALGO={table.nccl_algo or 'default'}"
            print(f"\n**{table.name}** ({what})\n")
            print("| size | published busbw | simulated | error | NCCL's choice |\n|---:|---:|---:|---:|---|")
        elif not args.summary:
            what = f"{table.gpu}, {table.gpus} GPUs, {table.nodes} node(s), NCCL_ALGO={table.nccl_algo}"
            print(f"\n{table.name} ({what})")
            print(f"{'size':>12} {'published':>10} {'simulated':>10} {'error':>7}  choice")
        for size, published in table.rows:
            if size < args.min_size or published <= 0:
                continue
            sim, choice = simulate(table, size, args.network)
            err = (sim - published) / published
            errs.append(err)
            by_test.setdefault(table.test, []).append((size, abs(err)))
            (big if size >= 64 << 20 else every).append(abs(err))
            if size >= 64 << 20:
                big_errs.append(err)
            what = f"{choice.get('algorithm')}/{choice.get('protocol')}/{choice.get('channels')}"
            if args.markdown:
                print(f"| {size:,} | {published:.2f} | {sim:.2f} | {err:+.1%} | {what} |")
            elif not args.summary:
                print(f"{size:>12} {published:>10.2f} {sim:>10.2f} {err:>+7.1%}  {what}")
        if errs:
            worst = max(errs, key=abs)
            goals = (
                f"{sum(abs(e) <= 0.15 for e in errs)}/{len(errs)} sizes within 15%, "
                f"{sum(abs(e) <= 0.10 for e in big_errs)}/{len(big_errs)} from 64 MiB within 10%"
            )
            med = f"median |error| {statistics.median(map(abs, errs)):.1%}, worst {worst:+.1%}; {goals}"
            print(f"\n{med}" if args.markdown else f"{table.name}: {len(errs)} sizes, {med}")
    if every or big:
        small = f"median |error| {statistics.median(every or [0]):.1%} max {max(every or [0]):.1%}"
        large = f"median {statistics.median(big or [0]):.1%} max {max(big or [0]):.1%}"
        print(f"\nall tables: below 64 MiB {small}; 64 MiB and up {large}")
        for test, pairs in sorted(by_test.items()):
            lo = [e for s, e in pairs if s < 64 << 20] or [0.0]
            hi = [e for s, e in pairs if s >= 64 << 20] or [0.0]
            print(
                f"  {test}: below 64 MiB median {statistics.median(lo):.1%} ({sum(e <= 0.15 for e in lo)}/{len(lo)}"
                f" within 15%); from 64 MiB median {statistics.median(hi):.1%} ({sum(e <= 0.10 for e in hi)}/{len(hi)}"
                " within 10%)"
            )


if __name__ == "__main__":
    main()
