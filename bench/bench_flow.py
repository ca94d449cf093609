"""Benchmark of the flow-level engine on ring all-reduce over a 2-tier leaf-spine.

Collectives are decomposed under the ideal model (`AlgoOptions(model="ideal")`: line rate, no NCCL protocol or
latency), so the engine figures stay comparable across versions; bench_nccl_tests.py measures the NCCL model.

Prints, for each case: flows, simulated time against the ring closed form
2(n-1)/n * S / B (+ the step-latency chain for chunked rings), wall time split into routing and
simulation, CPU time of this process (steadier than wall on a shared machine), and engine
counters. Cases: a coarse ring (one flow per ring edge) on many GPUs, a chunked ring (NCCL-like
chunk flows with step dependencies), and wall time against GPU count.

    .venv/bin/python bench/bench_flow.py                    # all three, default sizes
    .venv/bin/python bench/bench_flow.py --only scaling --scaling 16,64,256
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.collectives.spec import AlgoOptions, Collective
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology
from phantora.units import parse_rate_bps, parse_size_bytes, parse_time_ns


def make_topology(gpus: int, per_leaf: int, nic: int, latency: int, oversub: float) -> Topology:
    """A leaf-spine with `per_leaf` GPUs per leaf and as many spines as needed for the oversubscription."""
    per_leaf = min(per_leaf, gpus)
    leaves = gpus // per_leaf
    spines = 0 if leaves == 1 else per_leaf
    return leaf_spine(
        leaves, per_leaf, spines, nic_rate=nic, latency=latency, oversubscription=oversub if spines else None
    )


def own_ring(topo: Topology, nbytes: int, chunked: bool, chunk: int, channels: int) -> list[Flow]:
    """Ring all-reduce flows built here (used when phantora.collectives.decompose is not available).

    Coarse: one flow per ring edge of 2(n-1)/n * S. Chunked: per channel, the rank's slice S/(c n)
    is cut into chunks; step s of a chunk leaves rank r once step s-1 of it has arrived from r-1.
    One ECMP key per (channel, edge), like one NCCL connection.
    """
    eps = topo.endpoints
    n = len(eps)
    if not chunked:
        size = 2 * (n - 1) * nbytes // n
        return [Flow(r, eps[r], eps[(r + 1) % n], size, key=r) for r in range(n)]
    flows: list[Flow] = []
    per_slice = nbytes // (channels * n)
    pieces = [min(chunk, per_slice - o) for o in range(0, per_slice, chunk)]
    steps = 2 * (n - 1)
    for ch in range(channels):
        for j, size in enumerate(pieces):
            prev: list[int] = []
            for s in range(steps):
                base = len(flows)
                for r in range(n):
                    deps = (prev[(r - 1) % n],) if prev else ()
                    key = (ch << 32) | r
                    flows.append(Flow(base + r, eps[r], eps[(r + 1) % n], size, deps, tag=f"c{ch}/k{j}/s{s}", key=key))
                prev = list(range(base, base + n))
    return flows


def ring_flows(topo: Topology, nbytes: int, chunked: bool, chunk: int, channels: int) -> tuple[list[Flow], str]:
    """Flows of one ring all-reduce: from phantora.collectives if present, else built here."""
    try:
        from phantora.collectives import decompose  # type: ignore[attr-defined]
    except ImportError:
        return own_ring(topo, nbytes, chunked, chunk, channels), "bench ring"
    coll = Collective("all_reduce", tuple(range(topo.num_ranks)), nbytes)
    opts = AlgoOptions("ring", "chunked" if chunked else "coarse", channels, chunk, model="ideal")
    return decompose(coll, topo, opts).flows, "phantora.collectives.decompose"


def ring_latency_chain_ns(topo: Topology) -> int:
    """Longest propagation latency along 2(n-1) consecutive ring edges (the step chain of a chunk)."""
    eps = topo.endpoints
    n = len(eps)
    lat = [topo.path_latency_ns(topo.route(eps[r], eps[(r + 1) % n], 0)) for r in range(n)]
    steps = 2 * (n - 1)
    return max(sum(lat[(r + k) % n] for k in range(steps)) for r in range(n))


def run_case(label: str, topo: Topology, flows: list[Flow], ideal_ns: float, source: str, lb: str = "ecmp") -> float:
    """Simulate one DAG and print a line of figures (incl. wall us per flow); return the wall time."""
    sim = FlowSimulator(topo, lb=lb)
    c0 = time.process_time()
    t0 = time.perf_counter()
    for f in flows:  # warm the route cache, so routing and simulation are timed apart
        if f.src != f.dst:
            sim.route(f)
    t1 = time.perf_counter()
    sim.submit(flows, at=0)
    done = sim.drain()
    t2 = time.perf_counter()
    cpu = time.process_time() - c0
    end = max(c.end_ns for c in done)
    st = sim.stats()
    print(
        f"{label:<34} flows={len(flows):>7}  sim={end / 1e6:9.3f} ms  ideal={ideal_ns / 1e6:9.3f} ms  "
        f"ratio={end / ideal_ns:6.4f}  wall: route={t1 - t0:6.3f}s sim={t2 - t1:6.3f}s total={t2 - t0:6.3f}s "
        f"cpu={cpu:6.3f}s "
        f"({(t2 - t0) / len(flows) * 1e6:.1f} us/flow)  "
        f"events={st['events']} resolves={st['resolves']} max_comp={st['max_component']}  [{source}]"
    )
    return t2 - t0


def ideal_ring_ns(n: int, nbytes: int, nic_bps: int) -> float:
    return 2 * (n - 1) / n * nbytes * 8e9 / nic_bps


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("coarse", "chunked", "scaling"), action="append", help="run only these cases")
    p.add_argument("--size", default="1GiB", help="all-reduce size (default 1GiB)")
    p.add_argument("--nic", default="100Gbps", help="NIC and fabric link rate (default 100Gbps)")
    p.add_argument("--latency", default="1us", help="per-link latency (default 1us)")
    p.add_argument("--per-leaf", type=int, default=32, help="GPUs per leaf (default 32)")
    p.add_argument("--oversub", type=float, default=1.0, help="leaf oversubscription (default 1, non-blocking)")
    p.add_argument("--coarse-gpus", type=int, default=1024)
    p.add_argument("--chunked-gpus", type=int, default=128)
    p.add_argument("--chunk", default="2MiB", help="chunk size of the chunked ring (default 2MiB)")
    p.add_argument("--lb", default="ecmp", help="load balancing: ecmp (default), spray, adaptive (docs/flow-engine.md)")
    p.add_argument("--channels", type=int, default=2, help="rings (NCCL channels) of the chunked ring (default 2)")
    p.add_argument("--scaling", default="16,64,256,1024", help="GPU counts of the scaling sweep")
    p.add_argument("--scaling-mode", choices=("coarse", "chunked"), default="coarse", help="ring of the sweep")
    args = p.parse_args(argv)
    nbytes, nic = parse_size_bytes(args.size), parse_rate_bps(args.nic)
    lat, chunk = parse_time_ns(args.latency), parse_size_bytes(args.chunk)
    only = set(args.only or ("coarse", "chunked", "scaling"))

    def case(n: int, chunked: bool, label: str) -> float:
        topo = make_topology(n, args.per_leaf, nic, lat, args.oversub)
        flows, source = ring_flows(topo, nbytes, chunked, chunk, args.channels)
        ideal = ideal_ring_ns(n, nbytes, nic)
        if chunked:
            chain = ring_latency_chain_ns(topo)
            print(f"  chunked closed form: bandwidth {ideal / 1e6:.3f} ms + latency chain {chain / 1e6:.3f} ms")
            ideal += chain
        return run_case(label, topo, flows, ideal, source, args.lb)

    runs: list[tuple[str, Callable[[], object]]] = []
    if "coarse" in only:
        runs.append(("coarse", lambda: case(args.coarse_gpus, False, f"coarse ring, {args.coarse_gpus} GPUs")))
    if "chunked" in only:
        runs.append(("chunked", lambda: case(args.chunked_gpus, True, f"chunked ring, {args.chunked_gpus} GPUs")))
    for _, fn in runs:
        fn()
    if "scaling" in only:
        print(f"scaling ({args.scaling_mode} ring):")
        for n in (int(x) for x in args.scaling.split(",")):
            case(n, args.scaling_mode == "chunked", f"  {n} GPUs")


if __name__ == "__main__":
    main()
