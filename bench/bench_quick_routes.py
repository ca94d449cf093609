"""CPU µs per op of the compiled entry's quick routes (simcuda/routes.py) in one rank, side by side, before and after.

    .venv/bin/python bench/bench_quick_routes.py [--baseline REV] [--launches 3]

One rank of testbed16 (`phantora run --nproc 1`) times, by its own process CPU clock: 5,000 in-place scales of a
DTensor on a one-rank CPU mesh (the op reaches the mode with DTensor's type first: FSDP2's optimizer ops), then,
after a cuda tensor exists, 20,000 `torch.add` of two 4-element CPU tensors (a CUDA program's host ops). With
`--baseline REV`, the tree at REV (exported and its compiled path built, ab_trees.py) and this one run alternately.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ab_trees import export_revision

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = """import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

dist.init_process_group()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
d = distribute_tensor(torch.ones(64, 4), mesh, [Shard(0)])
for _ in range(200):
    d.mul_(0.999)
t0 = time.process_time()
for _ in range(5000):
    d.mul_(0.999)
t1 = time.process_time()
x = torch.ones(4, device="cuda")
a, b = torch.randn(4), torch.randn(4)
for _ in range(200):
    torch.add(a, b)
t2 = time.process_time()
for _ in range(20000):
    torch.add(a, b)
t3 = time.process_time()
print(f"ROUTES dtensor {(t1 - t0) / 5000 * 1e6:.3f} host {(t3 - t2) / 20000 * 1e6:.3f}", flush=True)
"""
LINE = re.compile(r"ROUTES dtensor ([\d.]+) host ([\d.]+)")


def run_once(tree: Path, tries: int = 3) -> tuple[float, float]:
    """One launch from `tree`: (µs per DTensor op, µs per host op); again if its rendezvous port was taken."""
    with tempfile.TemporaryDirectory(prefix="phantora-routes-") as tmp:
        script = Path(tmp, "routes.py")
        script.write_text(PROGRAM)
        out = Path(tmp) / "run"
        code = "import sys; from phantora.cli import main; sys.argv[0] = 'phantora'; sys.exit(main())"
        cmd = [sys.executable, "-c", code, "run", "--topology", "testbed16", "--nproc", "1", "--out", str(out)]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run(cmd + [str(script)], cwd=tree, env=env, capture_output=True, text=True, timeout=600)
        logs = done.stdout + done.stderr
        rank_log = out / "logs" / "rank0.log"
        if rank_log.exists():
            logs += rank_log.read_text()
        m = LINE.search(logs)
        if (done.returncode != 0 or m is None) and "EADDRINUSE" in logs and tries > 1:
            return run_once(tree, tries - 1)  # another run on this machine took the port first
        if done.returncode != 0 or m is None:
            raise SystemExit(f"the probe failed in {tree}:\n{logs[-2000:]}")
        return float(m.group(1)), float(m.group(2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", help="a git revision to run beside this tree")
    p.add_argument("--launches", type=int, default=3)
    a = p.parse_args()
    rows: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="phantora-routes-base-") as base:
        trees = {"this tree": ROOT}
        if a.baseline:  # before, then after, alternately: both see the same load
            trees = {f"before ({a.baseline})": export_revision(a.baseline, Path(base) / "tree"), "after": ROOT}
        for _ in range(a.launches):
            for label, tree in trees.items():
                rows.setdefault(label, []).append(run_once(tree))
    print(f"{'tree':<22} {'DTensor op µs median (min)':>28} {'host op µs median (min)':>26}")
    for label, samples in rows.items():
        d, h = [s[0] for s in samples], [s[1] for s in samples]
        print(f"{label:<22} {statistics.median(d):>20.2f} ({min(d):.2f}) {statistics.median(h):>18.2f} ({min(h):.2f})")


if __name__ == "__main__":
    main()
