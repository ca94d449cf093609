"""Draws from every process-global generator a program may use, unseeded unless `--seed N` (then torch.manual_seed,
random.seed and np.random.seed N, as a seeded program does): one JSON line per rank. trunc_normal_ on the simulated
GPU, from a CUDA generator seeded with the CPU draw, redraws its out-of-range values, so the kernels run and the
simulated end depend on the draws (as torchtitan's weight initialisation does)."""

import argparse
import json
import random

import numpy as np
import torch
import torch.distributed as dist

import phantora.runtime

ap = argparse.ArgumentParser()
ap.add_argument("--seed", type=int, default=None)
args = ap.parse_args()
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
cuda_seed = torch.cuda.initial_seed()  # before any seeding of the program's: PyTorch's default
if args.seed is not None:
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
draws = {
    "rank": rank,
    "torch": torch.randint(0, 2**62, (3,)).tolist(),
    "random": [random.random() for _ in range(3)],
    "numpy": np.random.randint(0, 2**31, 3).tolist(),
    "hash": hash("phantora"),
    "cuda_initial_seed": cuda_seed,
}
torch.cuda.manual_seed(draws["torch"][0])
for _ in range(2):  # two steps (steps.jsonl)
    w = torch.empty(1 << 16, device="cuda")
    torch.nn.init.trunc_normal_(w, std=1.0, a=-0.3, b=0.3)  # ~76% of a draw is out of range: several redraws
    dist.all_reduce(w)
    phantora.runtime.step()
print(json.dumps(draws), flush=True)
dist.destroy_process_group()
