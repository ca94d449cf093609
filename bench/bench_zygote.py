"""Short live runs with a fork server of their own against fork servers forked from a zygote (bridge/zygote.py).

    .venv/bin/python bench/bench_zygote.py [--runs 4] [--nproc 2] [--steps 2] [--script examples/gpt_ddp.py]
                                           [--coordinator-starts 6]

Runs the script `--runs` times each way, alternating (own, zygote, own, zygote, ...) so that the machine's load
falls on both alike, and prints each run's wall, then per way the mean wall and the CPU of every process the runs
started (this process's children once reaped: the zygote is stopped and reaped before its CPU is read), and the
ratios. The first zygote run pays the zygote's imports; the others fork. Step times are checked equal.

Then it starts a run's coordinator alone `--coordinator-starts` times each way, alternating: `python -m
bridge.coordinator`, and forked from the zygote of its start-up (bridge/warm_start.py), and prints the wall until it
published its endpoint and its CPU until then (its /proc stat; the first forked start pays the zygote's imports and
is left out). `--runs 0`: only that.
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

from bridge import warm_start  # noqa: E402
from bridge.run import CosimRun  # noqa: E402
from bridge.transport import endpoint_file, make_run_dir, new_token, remove_run_dir  # noqa: E402
from bridge.zygote import HOME_ENV, ZygoteHome  # noqa: E402
from phantora.launcher import RunConfig, launch  # noqa: E402
from phantora.topology.generators import leaf_spine  # noqa: E402


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def one(script: str, steps: int, nproc: int) -> tuple[float, list[int]]:
    cfg = RunConfig(script, ["--steps", str(steps)], "star8", nproc=nproc, trace="none")
    cfg.timeout_s = 600
    t0 = time.perf_counter()
    report = launch(cfg)
    return time.perf_counter() - t0, [s["time_ns"] for s in report.summary["steps"]]


def own_cpu_s(pid: int) -> float:
    """User + system CPU of a live process (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def coordinator_start(home: Path | None) -> tuple[float, float]:
    """Start a run's coordinator (a 2-rank flow run's), forked under `home` or fresh: its wall until it published
    its endpoint, and its CPU until then; then stop it."""
    run_dir = make_run_dir()
    try:
        setup = run_dir / "setup.msgpack"
        CosimRun(leaf_spine(1, 2, 0), rank_cmd=["true"]).spec.write(setup)
        env = dict(os.environ, PHANTORA_TOKEN=new_token(), PYTHONUNBUFFERED="1")
        env.pop(HOME_ENV, None)
        if home is not None:
            env[HOME_ENV] = str(home)
        t0 = time.perf_counter()
        args = ["--setup", str(setup), "--transport", "ipc"]
        child, forker = warm_start.start(
            "coordinator", "bridge.coordinator", args, sys.executable, env, run_dir / "c.log", None, run_dir
        )
        deadline = t0 + 120
        while not endpoint_file(run_dir, "coord").exists() and time.perf_counter() < deadline:
            time.sleep(0.002)
        wall, cpu = time.perf_counter() - t0, own_cpu_s(child.pid)
        child.proc.kill()
        child.proc.wait()
        if forker is not None:
            forker.close()
        return wall, cpu
    finally:
        remove_run_dir(run_dir)


def coordinator_starts(n: int) -> None:
    """`n` coordinator starts each way, alternating; print the means."""
    got: dict[str, list[tuple[float, float]]] = {"python -m": [], "forked": []}
    with ZygoteHome() as home:
        coordinator_start(home.path)  # the zygote's own start-up: its imports, once
        for _ in range(n):
            got["python -m"].append(coordinator_start(None))
            got["forked"].append(coordinator_start(home.path))
    for way, rows in got.items():
        walls, cpus = [w for w, _ in rows], [c for _, c in rows]
        print(f"coordinator start, {way:9s}: {statistics.mean(walls):.3f} s wall, {statistics.mean(cpus):.2f} CPU s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--script", default=str(ROOT / "examples" / "gpt_ddp.py"))
    ap.add_argument("--coordinator-starts", type=int, default=6)
    args = ap.parse_args()
    os.environ.pop(HOME_ENV, None)
    if args.runs == 0:  # the coordinator's start only
        coordinator_starts(args.coordinator_starts)
        return 0
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
    coordinator_starts(args.coordinator_starts)
    return 0 if len(steps) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
