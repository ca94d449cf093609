"""Coordinator overhead of several jobs on one fabric (prints figures; not a test).

    python bench/bench_jobs.py                 # 2, 4 and 8 jobs of 8 ranks vs one job of 16, 32 and 64 ranks
    python bench/bench_jobs.py --jobs 2 4 --repeat 3

Every rank is a `phantora.egraph.replay_rank` process (no torch) replaying the same DDP-like workload: 24 chained
all-reduce buckets of 2 MiB over its job's ranks, 20 us of compute between. K jobs of 8 ranks are placed
side by side on a flow-mode leaf-spine of 8 leaves x 8 GPUs (100G, 2 spines); the single job of 8K ranks
runs the same workload over all its ranks, on the same GPUs. Both runs have the same rank processes,
messages per rank and about as many flows (a ring of n ranks has n edges per channel), so the
difference is what several jobs cost the coordinator: per-job rank translation, per-job ECMP keys and link
accounting, and the jobs' separate rendezvous.

Figures per run (best of --repeat): coordinator CPU (s, after every rank joined), rounds (engine
advances), messages, flows, and the co-simulation's wall time (from the last rank's hello to the outcome).
The ratio columns divide K jobs by one job. Run it on an otherwise idle machine; on a shared one the wall
times are indicative only, the CPU times less so, rounds and messages are exact.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge.jobs import JobProcs  # noqa: E402
from bridge.run import CosimRun  # noqa: E402
from phantora.topology.generators import leaf_spine  # noqa: E402

WORKLOAD = """
name = "ddp-buckets-small"
[[op]]
name = "b"
kind = "all_reduce"
bytes = "2MiB"
ranks = "all"
repeat = 24
gap = "20us"
"""
RANKS_PER_JOB = 8


def one_run(k: int, split: bool, wl: Path) -> dict[str, Any]:
    """K jobs of 8 ranks (split) or one job of 8K ranks, on the first 8K GPUs."""
    topo = leaf_spine(8, 8, 2, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="ls64")
    cmd = [sys.executable, "-m", "phantora.egraph.replay_rank", str(wl)]
    world = k * RANKS_PER_JOB
    common: dict[str, Any] = {"keep_flows": False, "rank_preload": ("phantora.egraph.replay_rank",)}
    if split:
        jobs = [JobProcs(f"j{i}", RANKS_PER_JOB, cmd) for i in range(k)]
        res = CosimRun(topo, jobs=jobs, all_or_nothing=False, **common).run()
        assert all(j["status"] == "complete" for j in res.jobs), res.jobs
    else:
        res = CosimRun(topo, rank_cmd=cmd, world_size=world, **common).run()
    return {
        "coord_cpu_s": res.cpu_s["coordinator"],
        "rounds": res.rounds,
        "messages": res.messages,
        "flows": sum(r["flows"] for r in res.collectives),
        "wall_s": res.sim_wall_s,
        "makespan_ns": res.makespan_ns,
    }


def best(k: int, split: bool, wl: Path, repeat: int) -> dict[str, Any]:
    runs = [one_run(k, split, wl) for _ in range(repeat)]
    out = dict(runs[0])
    out["coord_cpu_s"] = min(r["coord_cpu_s"] for r in runs)
    out["wall_s"] = min(r["wall_s"] for r in runs)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, nargs="+", default=[2, 4, 8], help="job counts (8 ranks each)")
    p.add_argument("--repeat", type=int, default=1, help="runs per setting; the best CPU and wall are kept")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        wl = Path(d) / "wl.toml"
        wl.write_text(WORKLOAD)
        print(
            f"{'setting':<22} {'ranks':>5} {'coord CPU s':>11} {'us/msg':>7} {'rounds':>7} {'messages':>8} "
            f"{'flows':>6} {'wall s':>7} | {'CPU ratio':>9} {'rounds ratio':>12} {'wall ratio':>10}"
        )
        for k in args.jobs:
            one = best(k, False, wl, args.repeat)
            many = best(k, True, wl, args.repeat)
            for label, r in ((f"1 job x {k * RANKS_PER_JOB} ranks", one), (f"{k} jobs x {RANKS_PER_JOB} ranks", many)):
                per_msg = r["coord_cpu_s"] / max(1, r["messages"]) * 1e6
                line = (
                    f"{label:<22} {k * RANKS_PER_JOB:>5} {r['coord_cpu_s']:>11.3f} {per_msg:>7.1f} {r['rounds']:>7} "
                    f"{r['messages']:>8} {r['flows']:>6} {r['wall_s']:>7.2f} |"
                )
                if r is many:
                    line += (
                        f" {many['coord_cpu_s'] / max(1e-9, one['coord_cpu_s']):>9.2f}"
                        f" {many['rounds'] / max(1, one['rounds']):>12.2f}"
                        f" {many['wall_s'] / max(1e-9, one['wall_s']):>10.2f}"
                    )
                print(line, flush=True)


if __name__ == "__main__":
    main()
