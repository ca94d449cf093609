"""Short live runs with a fork server of their own against fork servers forked from a zygote (bridge/zygote.py).

    .venv/bin/python bench/bench_zygote.py [--runs 4] [--nproc 2] [--steps 2] [--script examples/gpt_ddp.py]

Runs the script `--runs` times each way, alternating (own, zygote, own, zygote, ...) so that the machine's load
falls on both alike, and prints each run's wall, then per way the mean wall and the CPU of every process the runs
started (this process's children once reaped: the zygote is stopped and reaped before its CPU is read), and the
ratios. The first zygote run pays the zygote's imports; the others fork. Step times are checked equal.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's phantora, not the venv's install

from bridge.zygote import HOME_ENV, ZygoteHome  # noqa: E402
from phantora.launcher import RunConfig, launch  # noqa: E402


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def one(script: str, steps: int, nproc: int) -> tuple[float, list[int]]:
    cfg = RunConfig(script, ["--steps", str(steps)], "star8", nproc=nproc, trace="none")
    cfg.timeout_s = 600
    t0 = time.perf_counter()
    report = launch(cfg)
    return time.perf_counter() - t0, [s["time_ns"] for s in report.summary["steps"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--script", default=str(ROOT / "examples" / "gpt_ddp.py"))
    args = ap.parse_args()
    os.environ.pop(HOME_ENV, None)
    walls: dict[str, list[float]] = {"own": [], "zygote": []}
    cpu = {"own": 0.0, "zygote": 0.0}
    steps: set[tuple[int, ...]] = set()
    home = ZygoteHome()
    os.environ.pop(HOME_ENV)  # set only around the zygote runs
    try:
        for i in range(args.runs):
            for way in ("own", "zygote"):
                if way == "zygote":
                    os.environ[HOME_ENV] = str(home.path)
                before = children_cpu()
                wall, times = one(args.script, args.steps, args.nproc)
                os.environ.pop(HOME_ENV, None)
                cpu[way] += children_cpu() - before
                walls[way].append(wall)
                steps.add(tuple(times))
                print(f"run {i + 1} {way:6s} {wall:7.2f} s wall", flush=True)
    finally:
        before = children_cpu()
        home.close()  # reaps the zygote: its runs' CPU (their fork servers, ranks) now counts
        cpu["zygote"] += children_cpu() - before
    own, zyg = statistics.mean(walls["own"]), statistics.mean(walls["zygote"])
    print(f"own fork server: mean {own:.2f} s wall, {cpu['own']:.1f} CPU s in all")
    first = walls["zygote"][0]
    print(f"zygote:          mean {zyg:.2f} s wall, {cpu['zygote']:.1f} CPU s in all (the first run {first:.2f} s)")
    print(f"ratio own/zygote: wall {own / zyg:.2f}x, CPU {cpu['own'] / max(cpu['zygote'], 1e-9):.2f}x")
    print(f"step times equal in every run: {len(steps) == 1}")
    return 0 if len(steps) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
