"""Bus bandwidth of each collective algorithm on a shipped topology, timed by the flow-level engine.

Collectives are decomposed under the ideal model (`AlgoOptions(model="ideal")`: line rate, no NCCL protocol or
latency), so the engine figures stay comparable across versions; bench_nccl_tests.py measures the NCCL model.

For each (kind, algorithm, granularity, size) it prints the flow count, the simulated time, busbw
(nccl-tests definition, GB/s), and the wall time to decompose and to simulate. On a DGX-like
cluster a good ring reaches busbw close to (NICs per host x NIC rate) for large messages.

    .venv/bin/python bench/bench_collectives.py                          # testbed16, 64 MiB .. 1 GiB
    .venv/bin/python bench/bench_collectives.py --topology rail128 --sizes 256MiB
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.collectives import AlgoOptions, Collective, collective_metrics, decompose, default_options
from phantora.netsim.flow import FlowSimulator
from phantora.topology.loader import load_topology
from phantora.units import parse_size_bytes

CASES = [
    ("all_reduce", "ring", "coarse"),
    ("all_reduce", "ring", "chunked"),
    ("all_reduce", "tree", "coarse"),
    ("all_reduce", "tree", "chunked"),
    ("all_reduce", "hierarchical", "coarse"),
    ("all_reduce", "hierarchical", "chunked"),
    ("all_gather", "ring", "coarse"),
    ("reduce_scatter", "ring", "chunked"),
    ("broadcast", "chain", "coarse"),
    ("broadcast", "chain", "chunked"),
    ("all_to_all", "pairwise", "coarse"),
    ("all_to_all", "direct", "coarse"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="testbed16", help="shipped name or file")
    ap.add_argument("--sizes", default="64MiB,1GiB", help="comma-separated sizes")
    ap.add_argument("--ranks", type=int, default=0, help="group = the first N ranks (0 = all)")
    ap.add_argument("--max-flows", type=int, default=400_000, help="skip cases with more flows than this")
    args = ap.parse_args()
    topo = load_topology(args.topology)
    ranks = tuple(range(args.ranks or topo.num_ranks))
    sizes = [parse_size_bytes(s) for s in args.sizes.split(",")]
    print(f"topology {topo.name}: {len(ranks)} ranks")
    print(
        f"{'kind':15s} {'algo':13s} {'gran':8s} {'size':>10s} {'ch':>3s} {'flows':>8s} {'time_us':>10s} "
        f"{'busbw_GB/s':>10s} {'decomp_s':>8s} {'sim_s':>7s}"
    )
    for size in sizes:
        for kind, algo, gran in CASES:
            coll = Collective(kind, ranks, size)
            opts = default_options(coll, topo, AlgoOptions(algorithm=algo, granularity=gran, model="ideal"))
            t0 = time.perf_counter()
            dag = decompose(coll, topo, opts)
            t1 = time.perf_counter()
            if len(dag.flows) > args.max_flows:
                print(
                    f"{kind:15s} {opts.algorithm:13s} {gran:8s} {size:>10d} {opts.channels:>3d} {len(dag.flows):>8d}"
                    "  skipped (--max-flows)"
                )
                continue
            sim = FlowSimulator(topo)
            sim.submit(dag.flows, at=0)
            end = max(c.end_ns for c in sim.drain())
            t2 = time.perf_counter()
            m = collective_metrics(coll, end)
            print(
                f"{kind:15s} {opts.algorithm:13s} {gran:8s} {size:>10d} {opts.channels:>3d} {len(dag.flows):>8d} "
                f"{end / 1e3:>10.1f} {m['busbw_gbps']:>10.1f} {t1 - t0:>8.3f} {t2 - t1:>7.2f}"
            )


if __name__ == "__main__":
    main()
