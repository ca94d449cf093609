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
from phantora.replay import replay_inprocess  # noqa: E402
from phantora.topology.generators import leaf_spine  # noqa: E402
from phantora.workload import Workload, load_workload  # noqa: E402

REPLAY = [sys.executable, "-m", "bridge.replay_rank"]

# One ns-3 workload: DDP-like, 6 chained 2 MiB all-reduce buckets on 8 ranks, 5 us of compute between.
NS3_WORKLOAD = {
    "name": "ddp-small",
    "op": [{"name": "b", "kind": "all_reduce", "bytes": "2MiB", "ranks": "all", "repeat": 6, "gap": "5us"}],
}
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
                network="flow",
                window_ns=1_000,
                transport=transport,
                rank_cmd=[sys.executable, __file__, "--barrier-rank", str(k)],
                timeout_s=600,
            ).run()
            per = max(out["per_barrier_us"] for out in res.ranks.values())
            rows.append({"ranks": n, "transport": transport, "barrier_us": per, "rounds": res.rounds})
            print(f"barrier  ranks={n:3d} {transport}: {per:8.1f} us per window barrier ({res.rounds} rounds)")
    return rows


def _error_ns(res, ref) -> tuple[int, float]:
    """Max |end error| over ops (ns) and the makespan error (relative)."""
    got = {r["name"]: r["end_ns"] for r in res.collectives}
    err = max(abs(got[op.name] - op.end_ns) for op in ref.ops)
    span_ref = max(op.end_ns for op in ref.ops)
    span = max(got.values())
    return err, abs(span - span_ref) / span_ref


def _ns3_setup(tmp: Path) -> tuple[Any, Path, Workload, Any]:
    from phantora.netsim.packet_config import PacketConfig

    topo = leaf_spine(2, 4, 2, nic_rate="100Gbps", latency="1us")
    path = tmp / "ns3_workload.json"
    path.write_text(json.dumps(NS3_WORKLOAD))
    return topo, path, load_workload(path, world=topo.num_ranks), PacketConfig(cc="dcqcn")


def _ns3_inprocess(topo: Any, wl: Workload, config: Any) -> tuple[Any, float]:
    from phantora.netsim.packet import Ns3Simulator

    t0 = time.perf_counter()
    sim = Ns3Simulator(topo, config)
    built = time.perf_counter() - t0
    ref = replay_inprocess(wl, topo, sim)
    sim.close()
    return ref, built


def bench_overhead(tmp: Path) -> list[dict[str, Any]]:
    from phantora.netsim.flow import FlowSimulator

    rows = []
    topo = leaf_spine(2, 4, 2, nic_rate="100Gbps", latency="1us")
    for name in ("ddp_buckets", "fsdp_layers", "moe_alltoall"):
        path = ROOT / "workloads" / f"{name}.toml"
        wl = load_workload(path, world=topo.num_ranks)
        ref = replay_inprocess(wl, topo, FlowSimulator(topo))
        for in_coord in (True, False):
            res = CosimRun(topo, network="flow", window_ns=0, engine_in_coordinator=in_coord,
                           rank_cmd=[*REPLAY, str(path)]).run()  # fmt: skip
            where = "coordinator" if in_coord else "server"
            ratio = res.sim_wall_s / ref.wall_s
            rows.append({"engine": "flow", "workload": name, "W": 0, "engine_in": where, "inprocess_s": ref.wall_s,
                         "bridge_s": res.sim_wall_s, "ratio": ratio, "startup_s": res.startup_s})  # fmt: skip
            print(f"overhead flow {name:13s} exact, engine in {where:11s}: in-process {ref.wall_s:.3f} s, "
                  f"bridge {res.sim_wall_s:.3f} s (x{ratio:.2f}), start-up {res.startup_s:.1f} s")  # fmt: skip
    topo, path, wl, config = _ns3_setup(tmp)
    ref, built = _ns3_inprocess(topo, wl, config)
    events = ref.engine_stats.get("events")
    print(f"ns-3 in-process: import+build {built:.1f} s, replay {ref.wall_s:.2f} s, {events} events")
    for w in (10_000, 0):
        res = CosimRun(topo, network="ns3", packet_config=config, window_ns=w, rank_cmd=[*REPLAY, str(path)]).run()
        ratio = res.sim_wall_s / ref.wall_s
        err, rel = _error_ns(res, ref)
        row = {"engine": "ns3", "workload": wl.name, "W": w, "engine_in": "server", "inprocess_s": ref.wall_s}
        row.update(bridge_s=res.sim_wall_s, ratio=ratio, startup_s=res.startup_s, err_ns=err)
        rows.append(row)
        print(f"overhead ns3 {wl.name} W={w}: in-process {ref.wall_s:.2f} s, bridge {res.sim_wall_s:.2f} s "
              f"(x{ratio:.2f}), start-up {res.startup_s:.1f} s, max end error {err} ns")  # fmt: skip
    return rows


def bench_windows(tmp: Path) -> list[dict[str, Any]]:
    topo, path, wl, config = _ns3_setup(tmp)
    ref, _ = _ns3_inprocess(topo, wl, config)
    rows = []
    print(f"windows: ns-3 (dcqcn) {wl.name} on {topo.name}; exact makespan {max(op.end_ns for op in ref.ops)} ns, "
          f"in-process {ref.wall_s:.2f} s")  # fmt: skip
    print(f"{'W':>8s} {'bridge s':>9s} {'rounds':>7s} {'late':>5s} {'max err ns':>11s} {'makespan err':>13s}")
    for w in WINDOWS:
        res = CosimRun(topo, network="ns3", packet_config=config, window_ns=w, rank_cmd=[*REPLAY, str(path)]).run()
        err, rel = _error_ns(res, ref)
        rows.append({"W": w, "bridge_s": res.sim_wall_s, "rounds": res.rounds, "late": res.late_collectives,
                     "max_err_ns": err, "makespan_rel_err": rel})  # fmt: skip
        label = "exact" if w == 0 else f"{w // 1000}us"
        print(f"{label:>8s} {res.sim_wall_s:9.2f} {res.rounds:7d} {res.late_collectives:5d} {err:11d} {rel:13.2e}")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", default="all", choices=("barrier", "overhead", "windows", "all"))
    p.add_argument("--barrier-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args()
    if args.barrier_rank is not None:
        return barrier_rank(args.barrier_rank)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.what in ("barrier", "all"):
            out["barrier"] = bench_barrier()
        if args.what in ("overhead", "all"):
            out["overhead"] = bench_overhead(Path(tmp))
        if args.what in ("windows", "all"):
            out["windows"] = bench_windows(Path(tmp))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
