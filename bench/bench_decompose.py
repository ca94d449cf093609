"""Decomposition into parallel ns-3 workers (issue 13, lever 3): one engine vs workers=1, 2, 8. Prints figures only.

Collectives are decomposed under the ideal model (`AlgoOptions(model="ideal")`: line rate, no NCCL protocol or
latency), so the engine figures stay comparable across versions; bench_nccl_tests.py measures the NCCL model.

The traffic is a recorded execution graph (``phantora run --record DIR``), planned into its flow DAG, or
by default an FSDP-like all-gather then reduce-scatter over every GPU of the topology (NCCL rings keep
inter-host traffic on one rail). Each variant runs the same DAG with nvlink=fluid, wire=roce4k,
nic_latency=1us (and --cc) to the end and prints: wall, CPU of this process, CPU of each worker (CPU
seconds: this machine is shared), rounds and their wall time, ns-3 events, events per CPU second, and
whether every completion equals the one-engine run's, with its key (sha256 of the sorted (id, start, end),
12 hex digits); then where each decomposed run's wall went (rounds: the slowest worker and the rest; between
rounds: the driver alone). Then "on paper" for more workers, each on a
core of its own: the largest worker count's critical CPU (per round its busiest worker, summed; valid even
when its workers share fewer cores), plus the driver's time between rounds, plus each round's fixed cost as
measured with free cores.

    .venv/bin/python bench/bench_decompose.py --topology rail128 --bytes 4MiB
    .venv/bin/python bench/bench_decompose.py --pattern rails --bytes 256MiB --workers 1 2 8   # ns-3-bound
    .venv/bin/phantora run --topology rail128 --phantom --out /tmp/r128 --record /tmp/g128 \\
        examples/llama_train.py --model llama3-8b --layers 1 --seq 8192 --batch 2 --ac op --steps 1
    .venv/bin/python bench/bench_decompose.py --graph /tmp/g128 --topology rail128 --workers 1 2 8
    .venv/bin/python bench/bench_decompose.py --topology rail128 --bytes 4MiB --workers --ray 2 --ray-curve 2

``--phases`` prints only how long the DAG's NVLink flows and fabric flows are in flight at the same simulated time
(flow engine, a few CPU seconds): an exact schedule can overlap the fluid NVLink side's work with the workers'
only there.

``--ray-curve N`` runs ray=local with PHANTORA_BRIDGE_CURVE=1: the workers' sockets are CurveZMQ, as they are
on other machines, so the rows "ray N" and "ray N curve" give the cost of the encryption (round ms).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from bridge.transport import CURVE_ALWAYS
from bridge.workers import spawn_workers
from phantora.collectives.decompose import decompose
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.gc_pause import use_run_policy
from phantora.netsim.hybrid import FLUID, flow_side
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.netsim.pieces import fabric_pieces
from phantora.topology.loader import load_topology
from phantora.topology.model import Topology
from phantora.units import parse_size_bytes


def fsdp_dag(topo: Topology, nbytes: int) -> list[Flow]:
    """Two all-reduces of `nbytes` over every GPU, the second after the first (hierarchical: rings inside each
    host on NVLink, and across hosts one ring per rail: link-disjoint pieces)."""
    ranks = tuple(range(topo.num_ranks))
    algo = AlgoOptions("hierarchical", "chunked", model="ideal")
    ag = decompose(Collective("all_reduce", ranks, nbytes), topo, algo).flows
    base = max(f.id for f in ag) + 1
    needed = {d for g in ag for d in g.deps}
    last = [f.id for f in ag if f.id not in needed]
    rs = decompose(Collective("all_reduce", ranks, nbytes), topo, algo).flows
    out = list(ag)
    for f in rs:
        deps = tuple(d + base for d in f.deps) or tuple(last)
        out.append(replace(f, id=f.id + base, deps=deps))
    return out


def rails_dag(topo: Topology, nbytes: int, kind: str = "all_reduce") -> list[Flow]:
    """Per piece (a rail of a rail-optimised fabric): two ring all-reduces of `nbytes` over its GPUs, the second
    after the first, one flow per ring edge and step: few, large flows, where ns-3's work dominates. `kind`
    "all_to_all": two direct all-to-alls of `nbytes` per GPU instead (MoE with expert parallelism over one GPU
    per host, strided as `--ep-layout strided`: every flow stays on its rail)."""
    pieces = fabric_pieces(topo)
    groups: dict[int, list[int]] = {}
    for r in range(topo.num_ranks):
        groups.setdefault(pieces[topo.node_of_rank(r)], []).append(r)
    algo = AlgoOptions("ring" if kind == "all_reduce" else "direct", "coarse", model="ideal")
    out: list[Flow] = []
    for ranks in groups.values():
        prev: list[int] = []
        for _ in range(2):
            base = max((f.id for f in out), default=-1) + 1
            ar = decompose(Collective(kind, tuple(ranks), nbytes), topo, algo).flows
            for f in ar:
                deps = tuple(d + base for d in f.deps) or tuple(prev)
                out.append(replace(f, id=f.id + base, deps=deps))
            needed = {d for f in ar for d in f.deps}
            prev = [f.id + base for f in ar if f.id not in needed]
    return out


def a2a_dag(topo: Topology, nbytes: int) -> list[Flow]:
    """Two MoE-style all-to-alls of `nbytes` per GPU over every GPU (dispatch, then combine after it): most
    flows cross rails, so decomposition into pieces refuses them (issue 38: what general partitions are for)."""
    ranks = tuple(range(topo.num_ranks))
    algo = AlgoOptions("direct", "coarse", model="ideal")
    first = decompose(Collective("all_to_all", ranks, nbytes), topo, algo).flows
    base = max(f.id for f in first) + 1
    needed = {d for g in first for d in g.deps}
    last = [f.id for f in first if f.id not in needed]
    second = decompose(Collective("all_to_all", ranks, nbytes), topo, algo).flows
    return [*first, *(replace(f, id=f.id + base, deps=tuple(d + base for d in f.deps) or tuple(last)) for f in second)]


def graph_dag(path: str, topo: Topology) -> list[Flow]:
    from phantora.egraph.format import load
    from phantora.egraph.replay import algo_from_meta, plan_graph

    graph = load(path)
    return plan_graph(graph, topo, algo_from_meta(graph)).flows


def busy(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of [start, end) intervals, sorted and merged."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def phases(topo: Topology, flows: list[Flow]) -> str:
    """How long NVLink flows and fabric flows are in flight at the same simulated time, in the flow engine (max-min,
    fast): an exact scheme can overlap the fluid NVLink side's work with the packet workers' only there."""
    sim = FlowSimulator(topo)
    sim.submit(flows, 0)
    every = sim.drain()
    side = {f.id: flow_side(f, topo.shared_nvswitch) == FLUID for f in flows}
    to_fluid, to_fabric = handoffs(flows, {c.flow_id: c.end_ns for c in every}, side)
    done = [c for c in every if c.size and c.src != c.dst]
    inside = [side[c.flow_id] for c in done]
    nv = busy([(c.start_ns, c.end_ns) for c, i in zip(done, inside, strict=True) if i])
    fab = busy([(c.start_ns, c.end_ns) for c, i in zip(done, inside, strict=True) if not i])
    both = sum(max(0, min(a1, b1) - max(a0, b0)) for a0, a1 in nv for b0, b1 in fab if a0 < b1 and b0 < a1)
    span = max(c.end_ns for c in done)
    return (
        f"phases (flow engine): span {span} ns, NVLink busy {sum(e - s for s, e in nv)} ns, fabric busy "
        f"{sum(e - s for s, e in fab)} ns, both at once {both} ns\n"
        f"hand-offs (flow engine): fabric -> NVLink at {to_fluid} distinct ns (no lookahead), NVLink -> fabric at "
        f"{to_fabric}; NVLink busy in {len(nv)} stretches, fabric in {len(fab)}"
    )


def handoffs(flows: list[Flow], ends: dict[int, int], inside: dict[int, bool]) -> tuple[int, int]:
    """How many distinct ns a finished fabric flow releases an NVLink flow (or marker) at, and the reverse.

    A flow is released when its last deps end (`ends`: flow id -> end ns; `inside`: flow id -> NVLink side); a
    hand-off if one of the deps ending then is on the other side. Fabric -> NVLink has no lookahead (a fluid flow
    starts the ns its dep ends), so with the fluid side split over workers each such ns is a hand-off between
    workers; NVLink -> fabric has the NIC latency."""
    to_fluid: set[int] = set()
    to_fabric: set[int] = set()
    for f in flows:
        if not f.deps:
            continue
        last = max(ends[d] for d in f.deps)
        if any(ends[d] == last and inside[d] != inside[f.id] for d in f.deps):
            (to_fluid if inside[f.id] else to_fabric).add(last)
    return len(to_fluid), len(to_fabric)


def run(
    topo: Topology,
    flows: list[Flow],
    sets: list[str],
    cc: str,
    floor: bool = False,
    sync: bool = False,
    hybrid: bool = False,
) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    config = apply_overrides(PacketConfig(cc=cc), sets)
    if hybrid:  # issue 38, route (a): each worker runs the fluid NVLink hybrid of its hosts and pieces
        sim: Any = HybridDecomposedSimulator(topo, config, spawn_workers)
    else:
        sim = make_engine(EngineSpec("ns3", config), topo, spawner=spawn_workers)
    if sync:  # synchronous rounds, as before issue 38's: the fluid NVLink side waits while the workers run
        sim.packet.meanwhile = None  # type: ignore[attr-defined]
    if floor:  # issue 38, opt-in: the workers run past fluid NVLink events that release nothing on their side
        sim.packet.floor = sim.submit_floor  # type: ignore[attr-defined]
    try:
        t1, c1 = time.perf_counter(), time.process_time()
        sim.submit(flows, 0)
        # the first submit's serial CPU: less the books it kept while the workers placed their flows (`_placing`)
        submit_cpu = time.process_time() - c1 - getattr(getattr(sim, "packet", sim), "meanwhile_cpu_s", 0.0)
        # how long the first round waited for the workers' start (their hellos): the first submit ran meanwhile
        waited = getattr(getattr(getattr(sim, "packet", sim), "_pool", None), "waited_s", 0.0)
        done = sim.drain()
        wall, cpu = time.perf_counter() - t1, time.process_time() - c1
        stats = sim.stats()
    finally:
        sim.close()
    key = hashlib.sha256(repr(sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)).encode()).hexdigest()[:12]
    side = {f.id: flow_side(f, topo.shared_nvswitch) == FLUID for f in flows}
    dec: dict[str, Any] = stats.get("decompose") or {}  # type: ignore[assignment]
    workers: list[dict[str, Any]] = stats.get("workers") or []  # type: ignore[assignment]
    return {
        "setup_s": t1 - t0,
        "setup_cpu": c1 - c0,
        "wall": wall,
        "cpu": cpu,
        "submit_cpu": submit_cpu,  # the first submit of the whole DAG, serial: what no worker's round overlaps
        "waited": waited,  # > 0: the first submit ended before the workers had started (it ran beside their start)
        "worker_cpu": [float(w.get("server_cpu_s", 0.0)) for w in workers],
        "worker_pieces": [w.get("pieces") for w in workers],
        "rounds": int(dec.get("rounds", 0)),
        "round_wall": float(dec.get("round_wall_s", 0.0)),
        "critical_cpu": float(dec.get("critical_cpu_s", 0.0)),  # per round its busiest worker's CPU, summed
        # the driver's CPU while its workers ran: the caller's own work and a drain's completions built
        "meanwhile": float(dec.get("meanwhile_cpu_s", 0.0)) + float(dec.get("built_cpu_s", 0.0)),
        "overlap": float(dec.get("overlap_cpu_s", 0.0)),  # per round max(busiest worker, the driver meanwhile)
        "critical_wall": float(dec.get("critical_wall_s", 0.0)),  # per round its slowest worker's wall, summed
        "between": float(dec.get("between_wall_s", 0.0)),  # the driver alone, between rounds
        "events": int(stats.get("events", 0) or 0),  # type: ignore[call-overload]
        "end": max(c.end_ns for c in done),
        "key": key,
        "handoffs": handoffs(flows, {c.flow_id: c.end_ns for c in done}, side),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", default="rail128")
    ap.add_argument("--graph", help="execution-graph directory (phantora run --record DIR); default: FSDP-like DAG")
    ap.add_argument("--bytes", default="4MiB", help="collective size of the default DAG")
    ap.add_argument(
        "--pattern", choices=["hier", "rails", "a2a", "a2a-rail"], default="hier",
        help="hier: hierarchical all-reduces over all GPUs (NVLink + rail rings, many chunked flows); "
        "rails: a ring all-reduce per rail, one flow per ring edge and step; "
        "a2a: two MoE-style all-to-alls over all GPUs (cross-rail: refused by pieces); "
        "a2a-rail: two MoE all-to-alls per rail (expert parallelism over one GPU per host, strided)",
    )  # fmt: skip
    ap.add_argument("--cc", default="dcqcn")
    ap.add_argument("--set", default="nvlink=fluid,wire=roce4k,nic_latency=1us", help="comma-separated --set fields")
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2, 8])
    ap.add_argument("--ray", type=int, nargs="*", default=[], help="worker counts to run also with ray=local")
    ap.add_argument("--ray-curve", type=int, nargs="*", default=[], help="... and with ray=local over CurveZMQ")
    ap.add_argument("--paper", type=int, nargs="+", default=[8, 64], help="worker counts to project")
    ap.add_argument(
        "--floor", type=int, nargs="*", default=[],
        help="worker counts to run also with the fluid side's submit floor (opt-in, issue 38: the workers then "
        "run past fluid NVLink events that release nothing on their side)",
    )  # fmt: skip
    ap.add_argument(
        "--hybrid", type=int, nargs="*", default=[],
        help="worker counts to run also with the fluid NVLink hybrid in each worker (issue 38, route (a): "
        "HybridDecomposedSimulator; the driver routes only the hand-offs between workers)",
    )  # fmt: skip
    ap.add_argument(
        "--sync", type=int, nargs="*", default=[],
        help="worker counts to run also with synchronous rounds (the driver waits while its workers run)",
    )  # fmt: skip
    ap.add_argument(
        "--phases", action="store_true",
        help="print only how long NVLink and fabric flows are in flight together (flow engine, seconds) and exit",
    )  # fmt: skip
    args = ap.parse_args()
    use_run_policy()  # (the cyclic collector as a `phantora` command runs it, and its workers)
    topo = load_topology(args.topology)
    make = {
        "rails": rails_dag,
        "a2a": a2a_dag,
        "a2a-rail": lambda t, n: rails_dag(t, n, "all_to_all"),
    }.get(args.pattern, fsdp_dag)
    flows = graph_dag(args.graph, topo) if args.graph else make(topo, parse_size_bytes(args.bytes))
    if args.phases:
        print(phases(topo, flows))
        return
    base = [s for s in args.set.split(",") if s]
    print(f"{len(flows)} flows on {topo.name}, --set {','.join(base)}, cc {args.cc}")
    rows = [("one engine", run(topo, flows, base, args.cc))]
    for n in args.workers:
        try:
            rows.append((f"workers={n}", run(topo, flows, [*base, f"workers={n}"], args.cc)))
        except InputError as e:  # traffic across pieces
            print(f"workers={n}: refused: {e}")
    for n in args.sync:
        rows.append((f"w={n} sync", run(topo, flows, [*base, f"workers={n}"], args.cc, sync=True)))
    for n in args.hybrid:
        rows.append((f"hybrid={n}", run(topo, flows, [*base, f"workers={n}"], args.cc, hybrid=True)))
    for n in args.floor:
        rows.append((f"w={n} floor", run(topo, flows, [*base, f"workers={n}"], args.cc, floor=True)))
    for n in args.ray:
        rows.append((f"ray {n}", run(topo, flows, [*base, f"workers={n}", "ray=local"], args.cc)))
    for n in args.ray_curve:
        os.environ[CURVE_ALWAYS] = "1"
        try:
            rows.append((f"ray {n} curve", run(topo, flows, [*base, f"workers={n}", "ray=local"], args.cc)))
        finally:
            del os.environ[CURVE_ALWAYS]
    want = rows[0][1]["key"]
    # crit CPU: the wall on free cores, one per process, bar messaging latency: the driver's CPU outside rounds (its
    # CPU less what it ran while its workers ran, `meanwhile`) + per round max(its busiest worker's CPU, the driver's
    # CPU meanwhile), summed (asynchronous rounds: the fluid NVLink side runs while the workers do); x: one engine's
    # CPU over it
    head = f"{'variant':<13} {'setup s':>8} {'wall s':>8} {'coord CPU':>9} {'worker CPU s':<28} {'crit CPU':>8} "
    print(head + f"{'x':>5} {'rounds':>7} {'round ms':>9} {'events':>11} {'ev/CPU s':>10} {'end ns':>12} equal key")
    for name, r in rows:
        total_cpu = r["cpu"] + sum(r["worker_cpu"])
        wcpu = " ".join(f"{c:.1f}" for c in r["worker_cpu"]) or "-"
        per_round = 1e3 * r["round_wall"] / r["rounds"] if r["rounds"] else 0.0
        crit = r["cpu"] - r["meanwhile"] + r["overlap"] if r["worker_cpu"] else r["cpu"]
        print(
            f"{name:<13} {r['setup_s']:>8.1f} {r['wall']:>8.1f} {r['cpu']:>9.2f} {wcpu:<28} {crit:>8.2f} "
            f"{rows[0][1]['cpu'] / max(crit, 1e-9):>5.2f} {r['rounds']:>7} "
            f"{per_round:>9.3f} {r['events']:>11} {r['events'] / max(total_cpu, 1e-9):>10.0f} {r['end']:>12} "
            f"{'yes' if r['key'] == want else 'NO'}   {r['key']}"
        )
    to_fluid, to_fabric = rows[0][1]["handoffs"]
    print(f"one engine's hand-offs: fabric -> NVLink at {to_fluid} distinct ns (no lookahead), ", end="")
    print(f"NVLink -> fabric at {to_fabric}")
    if not any(r["rounds"] for _, r in rows[1:]):
        return
    print("\nwhere the wall of each decomposed run goes (s): rounds = slowest worker's serving wall + the rest of the")
    print("round (messages, reading replies); between = the driver alone (fluid NVLink side, submits, the bound)")
    for name, r in rows[1:]:
        if r["rounds"]:
            print(
                f"  {name:<12} wall {r['wall']:.1f} = rounds {r['round_wall']:.1f} "
                f"(slowest worker {r['critical_wall']:.1f}, busiest worker's CPU {r['critical_cpu']:.1f}) "
                f"+ between {r['between']:.1f} + other "
                f"{r['wall'] - r['round_wall'] - r['between']:.1f}; driver CPU while its workers ran "
                f"{r['meanwhile']:.2f} s"
            )
    print("\ncritical path on free cores, CPU s = first submit + driver alone between rounds + per round max(busiest")
    print("worker, driver meanwhile); 'if overlapped': the same with the fluid side's work fully overlapping the")
    print("workers' (max of the two sums: the bound for a driver that keeps its own serial work, e.g. fluid per host)")
    print("'from the workers' start': the first submit left out when it ended before the workers had started (the")
    print("first round waited for them): it ran beside their start, the ns-3 build one engine's set-up does, uncounted")
    for name, r in rows[1:]:
        if r["rounds"]:
            alone = r["cpu"] - r["meanwhile"] - r["submit_cpu"]
            crit = r["submit_cpu"] + alone + r["overlap"]
            best = r["submit_cpu"] + alone + max(r["critical_cpu"], r["meanwhile"])
            print(
                f"  {name:<12} {r['submit_cpu']:.2f} + {alone:.2f} + {r['overlap']:.2f} = {crit:.2f} "
                f"({rows[0][1]['cpu'] / max(crit, 1e-9):.2f}x); if overlapped {best:.2f} "
                f"({rows[0][1]['cpu'] / max(best, 1e-9):.2f}x); busiest workers {r['critical_cpu']:.2f}, "
                f"driver meanwhile {r['meanwhile']:.2f}"
            )
            if r["waited"] > 0:
                ready = alone + r["overlap"]
                print(
                    f"  {'':<12} from the workers' start: {alone:.2f} + {r['overlap']:.2f} = {ready:.2f} "
                    f"({rows[0][1]['cpu'] / max(ready, 1e-9):.2f}x; the first round waited {r['waited']:.2f} s wall "
                    f"for them)"
                )
    # On paper with n workers, each on a core of its own: the busiest worker's CPU per round (measured with one
    # worker per group of pieces), the driver's serial time and each round's fixed cost (the free-core rounds).
    finest = max((r for n, r in rows[1:] if n.startswith("workers")), key=lambda r: len(r["worker_cpu"]), default=None)
    if finest is None or not finest["rounds"]:
        return
    free = [r for n, r in rows[1:] if r["rounds"] and len(r["worker_cpu"]) <= (os.cpu_count() or 1)]
    per_round = min((r["round_wall"] - r["critical_wall"]) / r["rounds"] for r in free) if free else 0.0
    serial = rows[0][1]["cpu"]  # (CPU, as the critical path: the wall moves with the load)
    print(
        f"\non paper (critical CPU of workers={len(finest['worker_cpu'])}, driver alone {finest['between']:.1f} s, "
        f"{1e3 * per_round:.2f} ms per round beyond its slowest worker x {finest['rounds']} rounds):"
    )
    measured, pieces = len(finest["worker_cpu"]), max(fabric_pieces(topo)) + 1
    for n in args.paper:
        if n < measured or (n > measured and measured < pieces):
            print(f"  {n:>3} workers: not projected (run --workers {n})")
            continue
        crit = finest["overlap"] + finest["between"] + per_round * finest["rounds"]
        note = "" if n == measured else f" (as workers={measured}: {pieces} pieces, the other workers idle)"
        print(f"  {n:>3} workers: {crit:.1f} s vs one engine {serial:.1f} CPU s: {serial / crit:.2f}x{note}")


if __name__ == "__main__":
    main()
