"""What indexing a cuda tensor costs in CPU time with simcuda's `SimCudaTensor.__getitem__` (list indices,
list_index.py) against torch's own `Tensor.__getitem__`, side by side in one rank, interleaved.

    .venv/bin/phantora run --topology testbed16 --nproc 1 bench/bench_simcuda_getitem.py [--ops 20000] [--reps 5]

Prints, per index form (`x[3]`, `x[:, 1]`), the least of `--reps` CPU times (`time.thread_time`: the rank's clock
functions are the simulation's) per op of each, and their ratio.
"""

from __future__ import annotations

import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--ops", type=int, default=20000)
parser.add_argument("--reps", type=int, default=5)
args = parser.parse_args()
x = torch.randn(64, 64, device="cuda")
ours, torchs = type(x).__getitem__, torch.Tensor.__getitem__
for label, index in (("x[3]", 3), ("x[:, 1]", (slice(None), 1))):
    best = {"simcuda": float("inf"), "torch": float("inf")}
    for _ in range(args.reps):
        for name, f in (("simcuda", ours), ("torch", torchs)):
            t0 = time.thread_time()
            for _ in range(args.ops):
                f(x, index)
            best[name] = min(best[name], time.thread_time() - t0)
    us = {k: v / args.ops * 1e6 for k, v in best.items()}
    print(
        f"{label}: simcuda {us['simcuda']:.2f} us, torch {us['torch']:.2f} us, ratio {us['simcuda'] / us['torch']:.3f}"
    )
