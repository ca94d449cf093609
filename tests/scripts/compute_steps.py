"""Compute-bound steps: a few large matmuls and a small all-reduce each step (scenario tests: slow GPUs)."""

import argparse
import os

import torch
import torch.distributed as dist

import phantora.runtime

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--grad", type=int, default=1024, help="elements of the all-reduce each step")
args = parser.parse_args()
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
w = torch.randn(4096, 4096, device="cuda")
x = torch.randn(4096, 4096, device="cuda")
for _ in range(args.steps):
    for _ in range(4):
        x = x @ w
    grad = torch.empty(args.grad, device="cuda")
    dist.all_reduce(grad)
    phantora.runtime.step()
dist.destroy_process_group()
