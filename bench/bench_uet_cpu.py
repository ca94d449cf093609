"""CPU per ns-3 event, `--set transport=uet` against RoCE on the same live job's traffic (issue 37's benchmark: UET
at most 15% more). Prints figures, asserts nothing.

The live jobs of bench_uet_live.py (FSDP and an MoE layer, 8 ranks on its 2:1 fat tree of 100G NICs and 50G
uplinks) are run once, healthy, under RoCE + DCQCN (kept with --skip-done), and their network flows (flows.csv:
endpoints, sizes, start times) are replayed in this process under each preset: the flows of one start time are
submitted when the engine reaches it, then the engine drains. Only the replay's event loop is timed, by this
process's own CPU clock (`time.process_time`: no live ranks, coordinator or messaging beside it), and the presets
alternate within each repeat (the order swapping each repeat), so a slow spell on a shared machine hits a pair of
runs alike. Per job it prints each preset's events and CPU per event (min and median over the repeats) and the
ratio UET / RoCE of each repeat's pair: its min and median, the figures to hold against the 15% goal.

    .venv/bin/python bench/bench_uet_cpu.py --repeat 5                    # both jobs, UET vs RoCE + DCQCN
    .venv/bin/python bench/bench_uet_cpu.py --jobs fsdp --cc hpcc --repeat 7
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import bench_uet_live as live

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.launcher import resolve_topology
from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator, load_ns3
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.topology.model import Topology


def read_flows(path: Path) -> dict[int, list[Flow]]:
    """start ns -> the network flows (size > 0) of a run's flows.csv that start then."""
    by_start: dict[int, list[Flow]] = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            size = int(row["size_bytes"])
            if size > 0 and row["start_ns"]:
                flow = Flow(int(row["flow_id"]), int(row["src_id"]), int(row["dst_id"]), size, tag=row["tag"])
                by_start[int(row["start_ns"])].append(flow)
    if not by_start:
        raise SystemExit(f"{path}: no network flows with a start time")
    return dict(sorted(by_start.items()))


def replay(topo: Topology, by_start: dict[int, list[Flow]], cfg: PacketConfig) -> tuple[int, float]:
    """The ns-3 events and the CPU seconds of the event loop for the flows replayed from their start times."""
    with Ns3Simulator(topo, cfg) as sim:
        c0 = time.process_time()
        for start, flows in by_start.items():
            sim.advance(start)
            sim.submit(flows, at=start)
        sim.drain()
        cpu = time.process_time() - c0
        events = int(sim.stats()["events"])  # type: ignore[call-overload]
    return events, cpu


def measure(topo: Topology, by_start: dict[int, list[Flow]], configs: dict[str, PacketConfig], repeat: int
            ) -> dict[str, list[tuple[int, float]]]:  # fmt: skip
    """Per preset, (events, CPU s) of each repeat; the presets alternate, their order swapping each repeat."""
    got: dict[str, list[tuple[int, float]]] = {name: [] for name in configs}
    names = list(configs)
    for i in range(repeat):
        for name in names if i % 2 == 0 else names[::-1]:
            got[name].append(replay(topo, by_start, configs[name]))
    return got


def report(job: str, got: dict[str, list[tuple[int, float]]]) -> None:
    """One job's table rows: events, CPU per event min / median, and the per-repeat ratio's min / median."""
    per = {name: [cpu / ev * 1e9 for ev, cpu in runs] for name, runs in got.items()}
    ratios = [u / r for u, r in zip(per["uet"], per["roce"], strict=True)]
    for name, runs in got.items():
        events = {ev for ev, _ in runs}
        ev = f"{runs[0][0]:,}" if len(events) == 1 else f"{min(events):,}-{max(events):,}"
        ratio = f"{min(ratios):.3f}x / {statistics.median(ratios):.3f}x" if name == "uet" else "1"
        print(f"| {job} | {name} | {ev} | {min(per[name]):.1f} / {statistics.median(per[name]):.1f} ns | {ratio} |",
              flush=True)  # fmt: skip
    print(f"<!-- {job}: UET / RoCE per repeat: {' '.join(f'{r:.3f}' for r in ratios)} -->", flush=True)


def prepare(out: Path, cc: str) -> tuple[Path, dict[str, PacketConfig]]:
    """The live jobs' fabric file under `out` (created), ns-3 loaded, and the two presets (RoCE with `cc`, UET)."""
    out.mkdir(parents=True, exist_ok=True)
    fabric = out / "fabric.toml"
    fabric.write_text(live.FABRIC)
    load_ns3()
    configs = {
        "roce": apply_overrides(PacketConfig(cc=cc), ["transport=roce"]),
        "uet": apply_overrides(PacketConfig(), ["transport=uet"]),
    }
    return fabric, configs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", nargs="+", default=list(live.JOBS), choices=list(live.JOBS))
    ap.add_argument("--cc", default="dcqcn", help="RoCE's congestion control (default dcqcn)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per preset (default 5)")
    ap.add_argument("--out", type=Path, default=Path("runs/uet-cpu"), help="the live runs whose flows are replayed")
    ap.add_argument("--skip-done", action="store_true", help="reuse live runs that have results.json")
    args = ap.parse_args()
    args.out = args.out.resolve()
    fabric, configs = prepare(args.out, args.cc)
    print(f"replayed live-job flows (recorded under roce+dcqcn), roce with cc {args.cc}, {args.repeat} repeats")
    print("| job | preset | events | CPU per event min / median | UET / RoCE per repeat: min / median |")
    print("|---|---|---:|---:|---:|")
    for job in args.jobs:
        src = args.out / f"{job}-roce+dcqcn-healthy"
        live.run(job, "roce+dcqcn", None, fabric, src, args.skip_done)
        topo = resolve_topology(fabric)
        report(job, measure(topo, read_flows(src / "flows.csv"), configs, args.repeat))


if __name__ == "__main__":
    main()
