"""Sweep throughput: runs per minute for the incast CC sweep on local cores.

    python bench/bench_sweep.py [--jobs 2] [--repeat 1] [--modes ns3,flow] [--via replay|netsim] [--keep DIR]

ns3: the 4-algorithm CC sweep (none, dcqcn, hpcc, dctcp) on a 7-to-1 incast with a 1 MB switch buffer,
through `phantora replay workloads/incast_heavy.toml --network ns3 --set ...` (3 x 1 MiB from each sender,
back to back), or with `--via netsim` through `phantora netsim` on an HPCC flow file (1 MB from each sender
at 0 and again at 500 us: the table of docs/compare-and-sweep.md). flow: the replay workload on the
flow-level engine (4 topologies' worth of runs), which shows the per-process start-up floor.
Each run is a separate process, so ns-3's start-up (importing the bindings, loading the fabric) counts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from phantora.sweep import SweepSpec, format_rows, run_sweep  # noqa: E402

CCS = ["none", "dcqcn", "hpcc", "dctcp"]


def ns3_spec(tmp: Path, repeat: int, via: str = "replay") -> SweepSpec:
    fixed: dict = {"topology": "star8", "set.buffer_bytes": 1_000_000}
    grid: dict = {"cc": CCS}
    if repeat > 1:
        grid["set.seed"] = list(range(1, repeat + 1))
    if via == "replay":
        fixed.update(workload=str(ROOT / "workloads" / "incast_heavy.toml"), network="ns3")
        return SweepSpec(name="ns3-cc-incast-replay", fixed=fixed, grid=grid)
    flows = tmp / "incast.txt"
    lines = [f"{s} 0 3 100 1000000 {burst * 0.0005:.9f}" for burst in range(2) for s in range(1, 8)]
    flows.write_text(f"{len(lines)}\n" + "\n".join(lines) + "\n")
    fixed.update(flows=str(flows), network="ns3")
    command = ("netsim", "--topology", "{topology}", "--flows", "{flows}", "--out", "{out}")
    return SweepSpec(name="ns3-cc-incast-netsim", command=command, fixed=fixed, grid=grid)


def flow_spec(repeat: int) -> SweepSpec:
    grid: dict = {"topology": ["star8", "twoleaf8", "fattree_k4", "hpcc/star8"]}
    if repeat > 1:
        grid["channels"] = list(range(1, repeat + 1))
    return SweepSpec(
        name="flow-incast",
        fixed={"workload": str(ROOT / "workloads" / "incast_heavy.toml"), "network": "flow"},
        grid=grid,
    )


def bench(spec: SweepSpec, out: Path, jobs: int) -> None:
    n = len(spec.points())
    t0 = time.perf_counter()
    res = run_sweep(spec, out, jobs=jobs, progress=False, plots=False)
    wall = time.perf_counter() - t0
    ok = [r for r in res.rows if r["status"] == "ok"]
    per_run = [r["wall_s"] for r in res.rows]
    print(f"\n== {spec.name}: {n} runs, {jobs} jobs, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(format_rows(spec, res.rows))
    print(f"wall {wall:.1f} s; per run: mean {statistics.mean(per_run):.1f} s, max {max(per_run):.1f} s")
    print(f"THROUGHPUT {spec.name}: {len(ok) / wall * 60:.2f} runs/min ({len(ok)}/{n} ok)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="grid copies (seeds for ns3, channels for flow)")
    ap.add_argument("--modes", default="ns3,flow")
    ap.add_argument("--keep", type=Path, default=None, help="keep the sweep directories here")
    ap.add_argument("--via", choices=("replay", "netsim"), default="replay", help="the ns3 sweep's command")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = args.keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        for mode in args.modes.split(","):
            spec = ns3_spec(tmp, args.repeat, args.via) if mode == "ns3" else flow_spec(args.repeat)
            bench(spec, tmp / spec.name, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
