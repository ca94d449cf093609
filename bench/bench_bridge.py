"""Benchmarks of the co-simulation bridge (prints figures; not a test).

    python bench/bench_bridge.py barrier            # window-barrier round trip, 8 and 64 ranks, ipc and tcp
    python bench/bench_bridge.py overhead           # bridge / in-process wall time, flow and ns-3 engines
    python bench/bench_bridge.py windows            # wall time and error vs W for one ns-3 workload
    python bench/bench_bridge.py all

Wall times of the bridge are the co-simulation proper (`CosimResult.sim_wall_s`: from the last
rank's hello to the outcome); process start-up, including the ns-3 import of the network server,
is printed separately. In-process times are `replay_inprocess` wall times (engine built and
imported beforehand). Run it on an otherwise idle machine, with `nice` if it is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge.run import CosimRun  # noqa: E402
from phantora.netsim.engine_spec import EngineSpec  # noqa: E402
from phantora.replay import replay_inprocess  # noqa: E402
from phantora.topology.generators import leaf_spine  # noqa: E402
from phantora.workload import Workload, load_workload  # noqa: E402

REPLAY = [sys.executable, "-m", "phantora.egraph.replay_rank"]

# ns-3 workloads on 8 ranks: DDP-like, 6 chained 2 MiB all-reduce buckets with 5 us of compute between;
# MoE-like, 2 layers of dispatch and combine all-to-alls (512 KiB per rank) with 10 us of expert compute.
NS3_WORKLOADS: list[dict[str, Any]] = [
    {
        "name": "ddp-small",
        "op": [{"name": "b", "kind": "all_reduce", "bytes": "2MiB", "ranks": "all", "repeat": 6, "gap": "5us"}],
    },
    {
        "name": "moe-small",
        "op": [
            {"name": "d0", "kind": "all_to_all", "bytes": "512KiB", "ranks": "all"},
            {"name": "c0", "kind": "all_to_all", "bytes": "512KiB", "ranks": "all", "after": ["d0"], "gap": "10us"},
            {"name": "d1", "kind": "all_to_all", "bytes": "512KiB", "ranks": "all", "after": ["c0"], "gap": "5us"},
            {"name": "c1", "kind": "all_to_all", "bytes": "512KiB", "ranks": "all", "after": ["d1"], "gap": "10us"},
        ],
    },
]
WINDOWS = (0, 1_000, 10_000, 100_000, 1_000_000)


def barrier_rank(k: int) -> int:
    """Rank body: one barrier to line up, then k timed window barriers via advance_clock."""
    from bridge.client import RankClient

    c = RankClient.from_env()
    w = c.window_ns
    c.advance_clock(w)
    t0 = time.perf_counter()
    for i in range(2, k + 2):
        c.advance_clock(i * w)
    dt = time.perf_counter() - t0
    c.finish(c.clock, {"per_barrier_us": dt / k * 1e6})
    c.close()
    return 0


def bench_barrier(k: int = 300) -> list[dict[str, Any]]:
    rows = []
    for n in (8, 64):
        topo = leaf_spine(max(1, n // 8), min(n, 8), 0 if n <= 8 else 4, nic_rate="100Gbps")
        for transport in ("ipc", "tcp"):
            res = CosimRun(
                topo,
                EngineSpec(window_ns=1_000),
                transport=transport,
                rank_cmd=[sys.executable, __file__, "--barrier-rank", str(k)],
                timeout_s=600,
            ).run()
            per = max(out["per_barrier_us"] for out in res.ranks.values())
            cpu = res.cpu_s["coordinator"] / (k + 1) * 1e6
            rows.append(
                {"ranks": n, "transport": transport, "barrier_us": per, "coord_cpu_us": cpu, "rounds": res.rounds}
            )
            print(f"barrier  ranks={n:3d} {transport}: {per:8.1f} us per window barrier, coordinator CPU {cpu:7.1f} us "
                  f"({res.rounds} rounds, load average {os.getloadavg()[0]:.1f})")  # fmt: skip
    return rows


def _error_ns(res: Any, ref: Any) -> tuple[int, float]:
    """Max |end error| over ops (ns) and the makespan error (relative)."""
    got = {r["name"]: r["end_ns"] for r in res.collectives}
    err = max(abs(got[op.name] - op.end_ns) for op in ref.ops)
    span_ref = max(op.end_ns for op in ref.ops)
    span = max(got.values())
    return err, abs(span - span_ref) / span_ref


def _timed_replay(wl: Workload, topo: Any, sim: Any) -> tuple[Any, float, float]:
    """In-process replay: result, wall s, CPU s."""
    c0, t0 = time.process_time(), time.perf_counter()
    ref = replay_inprocess(wl, topo, sim)
    return ref, time.perf_counter() - t0, time.process_time() - c0


def _figures(runs: list[Any], wall: float, cpu: float) -> dict[str, float]:
    """Bridge over in-process, best of the repeated runs: wall, network-side CPU (coordinator + server), ranks."""
    b_wall = min(r.sim_wall_s for r in runs)
    net = min(r.cpu_s["coordinator"] + r.cpu_s["server"] for r in runs)
    ranks = min(r.cpu_s["ranks"] for r in runs)
    return {
        "inprocess_wall_s": wall,
        "inprocess_cpu_s": cpu,
        "bridge_wall_s": b_wall,
        "bridge_net_cpu_s": net,
        "bridge_rank_cpu_s": ranks,
        "wall_ratio": b_wall / wall,
        "net_cpu_ratio": net / cpu,
        "all_cpu_ratio": (net + ranks) / cpu,
        "startup_s": min(r.startup_s for r in runs),
        "rounds": runs[0].rounds,
        "late": runs[0].late_collectives,
    }


def _print(label: str, f: dict[str, float]) -> None:
    print(
        f"{label}: in-process {f['inprocess_wall_s']:.3f} s wall / {f['inprocess_cpu_s']:.3f} s CPU; "
        f"bridge {f['bridge_wall_s']:.3f} s wall (x{f['wall_ratio']:.2f}), network-side CPU "
        f"{f['bridge_net_cpu_s']:.3f} s (x{f['net_cpu_ratio']:.2f}), with ranks x{f['all_cpu_ratio']:.2f}; "
        f"{f['rounds']} rounds, start-up {f['startup_s']:.1f} s, load average {os.getloadavg()[0]:.1f}"
    )


def _ns3_setup(tmp: Path, spec: dict[str, Any]) -> tuple[Any, Path, Workload, Any]:
    from phantora.netsim.packet_config import PacketConfig

    topo = leaf_spine(2, 4, 2, nic_rate="100Gbps", latency="1us")
    path = tmp / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    return topo, path, load_workload(path, world=topo.num_ranks), PacketConfig(cc="dcqcn")


def _ns3_inprocess(topo: Any, wl: Workload, config: Any, repeat: int = 1) -> tuple[Any, float, float, float]:
    """ns-3 replay in this process: result, first build s (with the import), best wall s, best CPU s."""
    from phantora.netsim.packet import Ns3Simulator

    built, walls, cpus = 0.0, [], []
    for i in range(repeat):
        t0 = time.perf_counter()
        sim = Ns3Simulator(topo, config)
        if i == 0:
            built = time.perf_counter() - t0
        ref, wall, cpu = _timed_replay(wl, topo, sim)
        sim.close()
        walls.append(wall)
        cpus.append(cpu)
    return ref, built, min(walls), min(cpus)


def bench_overhead(tmp: Path, repeat: int) -> list[dict[str, Any]]:
    from phantora.netsim.flow import FlowSimulator

    rows = []
    topo = leaf_spine(2, 4, 2, nic_rate="100Gbps", latency="1us")
    for name in ("ddp_buckets", "fsdp_layers", "moe_alltoall"):
        path = ROOT / "workloads" / f"{name}.toml"
        wl = load_workload(path, world=topo.num_ranks)
        refs = [_timed_replay(wl, topo, FlowSimulator(topo)) for _ in range(repeat)]
        wall, cpu = min(r[1] for r in refs), min(r[2] for r in refs)
        for in_coord in (True, False):
            engine = EngineSpec("flow", window_ns=0)
            runs = [
                CosimRun(topo, engine, rank_cmd=[*REPLAY, str(path)], engine_in_coordinator=in_coord).run()
                for _ in range(repeat)
            ]
            f = _figures(runs, wall, cpu)
            where = "coordinator" if in_coord else "server"
            rows.append({"engine": "flow", "workload": name, "W": 0, "engine_in": where, **f})
            _print(f"overhead flow {name} exact, engine in {where}", f)
    for spec in NS3_WORKLOADS:
        topo, path, wl, config = _ns3_setup(tmp, spec)
        ref, built, wall, cpu = _ns3_inprocess(topo, wl, config, repeat)
        print(f"ns-3 {wl.name} in-process: build {built:.1f} s, {ref.engine_stats.get('events')} events")
        for w in (10_000, 0):
            engine = EngineSpec("ns3", config, window_ns=w)
            runs = [CosimRun(topo, engine, rank_cmd=[*REPLAY, str(path)]).run() for _ in range(repeat)]
            f = _figures(runs, wall, cpu)
            f["max_err_ns"] = _error_ns(runs[0], ref)[0]
            rows.append({"engine": "ns3", "workload": wl.name, "W": w, "engine_in": "server", **f})
            _print(f"overhead ns3 {wl.name} W={w}", f)
    return rows


def bench_windows(tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for spec in NS3_WORKLOADS:
        topo, path, wl, config = _ns3_setup(tmp, spec)
        ref, _, wall, cpu = _ns3_inprocess(topo, wl, config)
        span = max(op.end_ns for op in ref.ops)
        print(f"windows: ns-3 (dcqcn) {wl.name} on {topo.name}; exact makespan {span} ns; "
              f"in-process {wall:.2f} s wall, {cpu:.2f} s CPU")  # fmt: skip
        heads = ("W", "wall s", "net CPU s", "rounds", "late", "max err ns", "span err")
        print(" ".join(f"{h:>{n}s}" for h, n in zip(heads, (8, 7, 9, 7, 5, 11, 9), strict=True)))
        for w in WINDOWS:
            res = CosimRun(topo, EngineSpec("ns3", config, window_ns=w), rank_cmd=[*REPLAY, str(path)]).run()
            err, rel = _error_ns(res, ref)
            f = _figures([res], wall, cpu)
            rows.append({"workload": wl.name, "W": w, "max_err_ns": err, "makespan_rel_err": rel, **f})
            label = "exact" if w == 0 else f"{w // 1000}us"
            print(f"{label:>8s} {res.sim_wall_s:7.2f} {f['bridge_net_cpu_s']:9.2f} {res.rounds:7d} "
                  f"{res.late_collectives:5d} {err:11d} {rel:9.2%}")  # fmt: skip
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", default="all", choices=("barrier", "overhead", "windows", "all"))
    p.add_argument("--barrier-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--repeat", type=int, default=3, help="overhead: best of this many runs of each (default 3)")
    args = p.parse_args()
    if args.barrier_rank is not None:
        return barrier_rank(args.barrier_rank)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.what in ("barrier", "all"):
            out["barrier"] = bench_barrier()
        if args.what in ("overhead", "all"):
            out["overhead"] = bench_overhead(Path(tmp), args.repeat)
        if args.what in ("windows", "all"):
            out["windows"] = bench_windows(Path(tmp))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
